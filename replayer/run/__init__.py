"""The composition root: builds a run from its ``RunConfig`` (the send path, the one result fan-out,
the lifecycle whose parts register their own close), resume, ``--workers`` and the sweep.

The names below are this stage's facade (imported on first use); the modules are its own.
"""

from replayer.core.facade import facade

TYPE_CHECKING = False  # (no typing import: see replayer.core.facade)

if TYPE_CHECKING:
    from replayer.run.daemon import main_run, run_replay
    from replayer.run.fanout import result_fanout
    from replayer.run.lifecycle import START_UP

__all__ = ["run_replay", "main_run", "result_fanout", "START_UP"]
__getattr__ = facade(
    __name__, {"run_replay": ".daemon", "main_run": ".daemon", "result_fanout": ".fanout", "START_UP": ".lifecycle"}
)
