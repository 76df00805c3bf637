"""The coordinator's book of shards (pure): who is ready, when the fleet starts, who is lost.

A shard registers once it is ready to send (trace open, first lead window built, pool open).
When all N have registered, the start epoch is set ``margin_s`` ahead on the coordinator's wall
clock; when ``ready_timeout_s`` passes first, the shards ready by then start without the others,
which are named (``missing_at_start``) and join the schedule in step when they come. A shard that
registers after the epoch (late, or restarted after a crash) gets the same epoch: it sends what is
still due and records what it missed. A shard not heard from for ``lost_after_s`` is ``lost``; it
keeps its last counts in the fleet's totals (never silently dropped) and is ``running`` again when
heard from. The fleet has ended when every shard has ended, or when those left are lost or never
came for ``give_up_s``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: the counts a heartbeat carries that add up across shards
TOTALS = ("scheduled", "sent", "in_flight", "completed", "failed", "missed_while_down")

#: a shard's states, in the order /status lists them
STATES = ("waiting", "ready", "running", "lost", "ended")


@dataclass
class Member:
    """One shard as the coordinator knows it."""

    shard: int
    state: str = "waiting"  # never registered yet
    host: str | None = None
    pid: int | None = None
    registered: int = 0  # registrations: more than one = the shard restarted and rejoined
    lost: int = 0  # times it was marked lost
    last_heard_s: float | None = None
    clock: dict[str, Any] = field(default_factory=dict)  # its offset, round trip and uncertainty
    counts: dict[str, Any] = field(default_factory=dict)  # its last heartbeat's numbers
    results: str | None = None  # its results folder (as the shard names it)
    summary: dict[str, Any] | None = None  # its summary, once ended

    def view(self, now_s: float) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "state": self.state,
            "host": self.host,
            "pid": self.pid,
            "registered": self.registered,
            "lost_times": self.lost,
            "last_heard_s_ago": None if self.last_heard_s is None else round(now_s - self.last_heard_s, 3),
            "clock": self.clock,
            **{k: self.counts.get(k) for k in (*TOTALS, "dispatch_lag_max_s")},
            "run_state": self.counts.get("state"),
            "results": self.results,
        }


class Roster:
    """The fleet's state; every method takes the coordinator's wall-clock time ``now_s``."""

    def __init__(
        self,
        shards: int,
        *,
        started_s: float,
        ready_timeout_s: float = 120.0,
        margin_s: float = 2.0,
        lost_after_s: float = 10.0,
        give_up_s: float = 600.0,
    ) -> None:
        if shards < 1:
            raise ValueError("shards must be at least 1")
        self.shards = shards
        self.started_s = started_s
        self.ready_timeout_s = ready_timeout_s
        self.margin_s = margin_s
        self.lost_after_s = lost_after_s
        self.give_up_s = give_up_s
        self.members = [Member(i) for i in range(shards)]
        self.epoch_s: float | None = None
        self.missing_at_start: list[int] = []
        self.events: list[str] = []  # what happened, in words, for the log and /status

    def _member(self, shard: int) -> Member:
        if not 0 <= shard < self.shards:
            raise ValueError(f"shard {shard} is not one of 0..{self.shards - 1}")
        return self.members[shard]

    def ready(self, shard: int, now_s: float, info: dict[str, Any]) -> None:
        """Shard ``shard`` is ready to send (or, after the epoch, ready to rejoin)."""
        m = self._member(shard)
        m.registered += 1
        if m.registered > 1:
            self.events.append(f"shard {shard} registered again (restarted): it rejoins the schedule in step")
        m.host, m.pid = info.get("host"), info.get("pid")
        m.clock = dict(info.get("clock") or {})
        m.results = info.get("results")
        m.last_heard_s = now_s
        m.state = "running" if self.epoch_s is not None else "ready"
        m.summary = None
        if self.epoch_s is None and all(x.state == "ready" for x in self.members):
            self._start(now_s)

    def heard(self, shard: int, now_s: float, counts: dict[str, Any]) -> None:
        """A heartbeat: the shard is alive, with its current counts."""
        m = self._member(shard)
        m.last_heard_s = now_s
        m.counts = dict(counts)
        if m.state == "lost":
            self.events.append(f"shard {shard} heard from again after being lost")
        if m.state in ("lost", "ready", "waiting") and self.epoch_s is not None:
            m.state = "running"

    def ended(self, shard: int, now_s: float, summary: dict[str, Any], counts: dict[str, Any]) -> None:
        """The shard's run ended (by itself or stopped): its summary."""
        m = self._member(shard)
        m.last_heard_s = now_s
        m.counts = dict(counts)
        m.summary = summary
        m.state = "ended"

    def tick(self, now_s: float) -> None:
        """The deadline for readiness, and lost shards."""
        if self.epoch_s is None and now_s - self.started_s >= self.ready_timeout_s:
            if any(m.state == "ready" for m in self.members):
                self._start(now_s)
        for m in self.members:
            if (
                m.state == "running"  # (a ready shard waits in a long poll: it sends no heartbeat)
                and m.last_heard_s is not None
                and now_s - m.last_heard_s > self.lost_after_s
            ):
                m.state = "lost"
                m.lost += 1
                self.events.append(f"shard {m.shard} lost: not heard from for {now_s - m.last_heard_s:.1f} s")

    def _start(self, now_s: float) -> None:
        self.epoch_s = now_s + self.margin_s
        self.missing_at_start = [m.shard for m in self.members if m.state != "ready"]
        for m in self.members:
            if m.state == "ready":
                m.state = "running"
        if self.missing_at_start:
            self.events.append(
                f"start without shard(s) {', '.join(map(str, self.missing_at_start))}: not ready after "
                f"{self.ready_timeout_s:g} s (they join in step when they come)"
            )

    def finished(self, now_s: float) -> bool:
        """Every shard ended, or the rest lost (or never come) for ``give_up_s``."""
        if self.epoch_s is None:
            return False
        for m in self.members:
            if m.state == "ended":
                continue
            since = m.last_heard_s if m.last_heard_s is not None else self.epoch_s
            if m.state in ("lost", "waiting") and now_s - since > self.give_up_s:
                continue
            return False
        return True

    def not_ended(self) -> list[int]:
        return [m.shard for m in self.members if m.state != "ended"]

    def totals(self) -> dict[str, int]:
        """The fleet's counts: each shard's last report, lost ones included."""
        out = dict.fromkeys(TOTALS, 0)
        for m in self.members:
            for k in TOTALS:
                v = m.counts.get(k)
                if isinstance(v, int | float):
                    out[k] += int(v)
        return out

    def status(self, now_s: float) -> dict[str, Any]:
        by_state = {s: sum(1 for m in self.members if m.state == s) for s in STATES}
        return {
            "shards": self.shards,
            "epoch_s": self.epoch_s,
            "started": self.epoch_s is not None and now_s >= self.epoch_s,
            "missing_at_start": self.missing_at_start,
            "states": by_state,
            "totals": self.totals(),
            "members": [m.view(now_s) for m in self.members],
            "events": self.events[-50:],
        }
