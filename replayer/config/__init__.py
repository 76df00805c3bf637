"""The run's settings: ``RunConfig`` (typed, frozen, every check), loading it from flags and a config
file, and the errors that name each bad setting.

The names below are this stage's facade (imported on first use); the modules are its own.
"""

from replayer.core.facade import facade

TYPE_CHECKING = False  # (no typing import: see replayer.core.facade)

if TYPE_CHECKING:
    from replayer.config.load import ConfigError
    from replayer.config.model import RunConfig, load_config

__all__ = ["RunConfig", "load_config", "ConfigError"]
__getattr__ = facade(__name__, {"RunConfig": ".model", "load_config": ".model", "ConfigError": ".load"})
