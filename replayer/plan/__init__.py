"""When each request is due: the schedule (due times from one anchor, the time scale, loops, the
idle-gap cap), sessions and the pure planner. Never sleeps, never sends.

The names below are this stage's facade (imported on first use); the modules are its own.
"""

from replayer.core.facade import facade

TYPE_CHECKING = False  # (no typing import: see replayer.core.facade)

if TYPE_CHECKING:
    from replayer.plan.planner import Planner
    from replayer.plan.schedule import IdleGapCap, Timeline, iter_schedule
    from replayer.plan.sessions import SessionGate

__all__ = ["Timeline", "iter_schedule", "IdleGapCap", "Planner", "SessionGate"]
__getattr__ = facade(
    __name__,
    {
        "Timeline": ".schedule",
        "iter_schedule": ".schedule",
        "IdleGapCap": ".schedule",
        "Planner": ".planner",
        "SessionGate": ".sessions",
    },
)
