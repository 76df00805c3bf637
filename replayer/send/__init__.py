"""Sending at the due time: the dispatcher (an injected clock, one task group) and the senders (in-
loop, launcher, routed to several targets). The planner decides when; this package does it.

The names below are this stage's facade (imported on first use); the modules are its own.
"""

from replayer.core.facade import facade

TYPE_CHECKING = False  # (no typing import: see replayer.core.facade)

if TYPE_CHECKING:
    from replayer.send.dispatcher import Dispatcher
    from replayer.send.feed import Feed
    from replayer.send.routing import RoutingSender
    from replayer.send.sender import LauncherSender, LoopSender, Sender

__all__ = ["Dispatcher", "Feed", "Sender", "LoopSender", "LauncherSender", "RoutingSender"]
__getattr__ = facade(
    __name__,
    {
        "Dispatcher": ".dispatcher",
        "Feed": ".feed",
        "Sender": ".sender",
        "LoopSender": ".sender",
        "LauncherSender": ".sender",
        "RoutingSender": ".routing",
    },
)
