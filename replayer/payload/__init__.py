"""What each request is, built in the lead window: prompts from hash ids (exact token ids, or text),
payload bytes, images, expected prefix-cache hits. Never on the send path.

The names below are this stage's facade (imported on first use); the modules are its own.
"""

from replayer.core.facade import facade

TYPE_CHECKING = False  # (no typing import: see replayer.core.facade)

if TYPE_CHECKING:
    from replayer.payload.body import PayloadBuilder
    from replayer.payload.loopprompts import Prompts
    from replayer.payload.prefix_cache import PrefixCacheModel
    from replayer.payload.prepare import RequestFactory
    from replayer.payload.prompts import PromptBuilder

__all__ = ["RequestFactory", "PayloadBuilder", "Prompts", "PromptBuilder", "PrefixCacheModel"]
__getattr__ = facade(
    __name__,
    {
        "RequestFactory": ".prepare",
        "PayloadBuilder": ".body",
        "Prompts": ".loopprompts",
        "PromptBuilder": ".prompts",
        "PrefixCacheModel": ".prefix_cache",
    },
)
