"""The composition root: a run's inputs, its parts assembled from its ``RunConfig`` (pure), the one
implementation of the request event stream, the lifecycle (start-up steps, the exit stack,
signals) and the finish; resume, ``--workers`` and the sweep.

The names below are this stage's facade (imported on first use); the modules are its own.
"""

from replayer.core.facade import facade

TYPE_CHECKING = False  # (no typing import: see replayer.core.facade)

if TYPE_CHECKING:
    from replayer.run.daemon import main_run, run_replay
    from replayer.run.fanout import result_fanout
    from replayer.run.startup import START_UP

__all__ = ["run_replay", "main_run", "result_fanout", "START_UP"]
__getattr__ = facade(
    __name__, {"run_replay": ".daemon", "main_run": ".daemon", "result_fanout": ".fanout", "START_UP": ".startup"}
)
