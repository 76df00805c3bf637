"""A fleet of replayers: one start and one clock across shards on several hosts.

``coordinator`` (``replayer coordinate``) holds the start barrier, the shards' clock offsets and the
fleet's live view; ``member`` is a shard's side (``replayer run --coordinator URL``); ``roster``
(the coordinator's book of shards) and ``clocksync`` (offsets from round trips) are pure.
"""

from replayer.core.facade import facade

TYPE_CHECKING = False  # (no typing import: see replayer.core.facade)

if TYPE_CHECKING:
    from replayer.fleet.coordinator import coordinate
    from replayer.fleet.member import FleetError, Heartbeat, Joined, join
    from replayer.fleet.roster import Roster

__all__ = ["FleetError", "Heartbeat", "Joined", "Roster", "coordinate", "join"]
__getattr__ = facade(
    __name__,
    {
        "coordinate": ".coordinator",
        "FleetError": ".member",
        "Heartbeat": ".member",
        "Joined": ".member",
        "join": ".member",
        "Roster": ".roster",
    },
)
