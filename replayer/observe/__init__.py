"""Watching the run live: every Prometheus metric of the replayer, the target's own ``/metrics``
scraped and kept, the admin server, the console, logs and the self-watch. Writes no results.

The names below are this stage's facade (imported on first use); the modules are its own.
"""

from replayer.core.facade import facade

TYPE_CHECKING = False  # (no typing import: see replayer.core.facade)

if TYPE_CHECKING:
    from replayer.observe.admin import AdminServer
    from replayer.observe.logs import setup_logging
    from replayer.observe.metrics import ReplayerMetrics
    from replayer.observe.target_metrics import TargetScraper
    from replayer.observe.target_samples import read_samples

__all__ = ["ReplayerMetrics", "AdminServer", "TargetScraper", "read_samples", "setup_logging"]
__getattr__ = facade(
    __name__,
    {
        "ReplayerMetrics": ".metrics",
        "AdminServer": ".admin",
        "TargetScraper": ".target_metrics",
        "read_samples": ".target_samples",
        "setup_logging": ".logs",
    },
)
