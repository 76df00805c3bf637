"""A shard's clock against the coordinator's: the offset from round-trip probes (pure).

Each probe is three readings: the shard's wall clock when it asked, the coordinator's wall clock
in the answer, the shard's wall clock when the answer came (NTP's simple case). The coordinator's
reading was taken somewhere inside the round trip, so ``offset = coordinator - midpoint`` is off
by at most half the round trip. Of several probes the one with the smallest round trip is kept:
its bound is the tightest (queueing only ever adds to a round trip). The same rule as NTP's
clock filter and AIPerf's offset estimate (the minimum over a window of samples).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: an offset above this is worth a warning at start (clocks that far apart are not in NTP sync)
SKEW_WARN_S = 0.050


@dataclass(frozen=True, slots=True)
class Probe:
    """One round trip: the shard's wall clock at send and at receipt, the coordinator's between."""

    sent_s: float
    coordinator_s: float
    received_s: float

    @property
    def rtt_s(self) -> float:
        return self.received_s - self.sent_s

    @property
    def offset_s(self) -> float:
        return self.coordinator_s - (self.sent_s + self.received_s) / 2


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """The shard's clock against the coordinator's: ``coordinator = shard + offset_s``, known to
    within ``uncertainty_s`` (half the kept probe's round trip)."""

    offset_s: float
    rtt_s: float
    uncertainty_s: float
    probes: int

    def to_coordinator(self, shard_wall_s: float) -> float:
        return shard_wall_s + self.offset_s

    def to_shard(self, coordinator_wall_s: float) -> float:
        return coordinator_wall_s - self.offset_s

    def as_dict(self) -> dict[str, float | int]:
        return {
            "offset_s": self.offset_s,
            "rtt_s": self.rtt_s,
            "uncertainty_s": self.uncertainty_s,
            "probes": self.probes,
        }


def best_offset(probes: Sequence[Probe]) -> ClockOffset:
    """The offset of the probe with the smallest round trip. Raises ValueError for no probe or a
    probe whose answer came before its question (a clock stepped back during the probe)."""
    good = [p for p in probes if p.rtt_s >= 0]
    if not good:
        raise ValueError("no usable clock probe (none, or each with a negative round trip)")
    p = min(good, key=lambda q: q.rtt_s)
    return ClockOffset(offset_s=p.offset_s, rtt_s=p.rtt_s, uncertainty_s=p.rtt_s / 2, probes=len(good))
