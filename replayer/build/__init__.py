"""What each request is, built in the lead window: prompts from hash ids (exact token ids, or text),
payload bytes, images, expected prefix-cache hits. Never on the send path.

The names below are this stage's facade (imported on first use); the modules are its own.
"""

from replayer.core.facade import facade

TYPE_CHECKING = False  # (no typing import: see replayer.core.facade)

if TYPE_CHECKING:
    from replayer.build.loopprompts import Prompts
    from replayer.build.payload import PayloadBuilder
    from replayer.build.prefix_cache import PrefixCacheModel
    from replayer.build.prepare import RequestFactory
    from replayer.build.prompts import PromptBuilder

__all__ = ["RequestFactory", "PayloadBuilder", "Prompts", "PromptBuilder", "PrefixCacheModel"]
__getattr__ = facade(
    __name__,
    {
        "RequestFactory": ".prepare",
        "PayloadBuilder": ".payload",
        "Prompts": ".loopprompts",
        "PromptBuilder": ".prompts",
        "PrefixCacheModel": ".prefix_cache",
    },
)
