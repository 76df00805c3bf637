"""A run's live state: the counters behind ``/status``, the console and the progress line (fed by
the event stream's ``live state`` subscriber, ``replayer.run.fanout.Accounting``), the control
API over the dispatcher, and the self-watch that says when the replayer itself falls behind."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import replayer.observe.selfwatch as selfwatch
from replayer.core.clock import Anchor, now_ns
from replayer.observe.metrics import ReplayerMetrics
from replayer.observe.selfwatch import BEHIND_MS
from replayer.record.recorder import Recorder
from replayer.send.dispatcher import Dispatcher

log = logging.getLogger("replayer")


@dataclass
class RunState:
    """Live counters behind ``/status`` and the progress line."""

    state: str = "starting"
    scheduled: int = 0
    sent: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    not_started: int = 0
    missed_while_down: int = 0  # a fleet shard's rows due while it was down
    max_lag_ms: float = 0.0
    window_max_lag_ms: float = 0.0
    watch_max_lag_ms: float = 0.0  # the same, for the self-watch window
    target: str = ""
    results: str = ""
    started_wall: float = field(default_factory=time.time)
    recorder: Recorder | None = None  # its folder size and oldest result (/status)
    fleet: dict | None = None  # a fleet shard's start and clock (replayer.fleet.member.Joined)


class RunControl:
    """The admin server's ``Controller`` over the dispatcher: each change is logged, and each
    speed-up change is kept with its time (``speedup_changes``: ``{"t_s", "speedup"}``, ``t_s`` in
    seconds after the run's anchor) for ``summary.json``, which otherwise says only the speed-up
    the run started with."""

    def __init__(self, dispatcher: Dispatcher, on_change: Callable[[], None] = lambda: None) -> None:
        self.d = dispatcher
        self.speedup_changes: list[dict] = []
        self._on_change = on_change  # called after a pause, resume or speed-up change

    def _t_s(self) -> float:
        return round(self.d.now_rel() / 1e9, 3)

    def pause(self) -> None:
        if not self.d.timeline.paused:
            log.info("paused (POST /pause) at t=%.1f s: no request is sent until POST /resume", self._t_s())
        self.d.pause()
        self._on_change()

    def resume(self) -> None:
        if self.d.timeline.paused:
            log.info("resumed (POST /resume) at t=%.1f s", self._t_s())
        self.d.resume()
        self._on_change()

    def set_speedup(self, speedup: float) -> None:
        old = self.d.timeline.speedup
        self.d.set_speedup(speedup)
        self.speedup_changes.append({"t_s": self._t_s(), "speedup": speedup})
        log.info("speed-up %g -> %g (POST /speedup) at t=%.1f s", old, speedup, self._t_s())
        self._on_change()

    def stop(self) -> None:
        if not self.d.stopping:
            log.info("stopping (POST /stop) at t=%.1f s: no new requests; draining the ones in flight", self._t_s())
        self.d.stop()


class StatusView:
    """``/status`` and the console's numbers: the live counters, and the dispatcher's once
    ``attach`` gave it (the admin server answers before the replay is built)."""

    def __init__(self, state: RunState, metrics: ReplayerMetrics) -> None:
        self.state = state
        self.metrics = metrics
        self.dispatcher: Dispatcher | None = None
        self.control: RunControl | None = None
        self.extra: Callable[[], dict] | None = None  # more of /status (issue 45: the live verdicts)

    def attach(self, dispatcher: Dispatcher, control: RunControl) -> None:
        self.dispatcher, self.control = dispatcher, control

    def __call__(self) -> dict:
        extra = self.extra() if self.extra is not None else {}
        return {**status(self.state, self.dispatcher), **self.metrics.snapshot(), **extra}


def status(state: RunState, d: Dispatcher | None) -> dict:
    pos = d.position if d else None
    st, rec = state.state, state.recorder
    if st == "running" and d is not None and d.stopping:  # after SIGTERM or /stop
        st = "draining"
    elif st == "running" and d is not None and d.timeline.paused:  # POST /pause
        st = "paused"
    elif st == "running" and d is not None and d.now_rel() < 0:  # before --start-at (or the start delay)
        st = "waiting"
    return {
        "state": st,
        "target": state.target,
        "results": state.results,
        "scheduled": state.scheduled,
        "sent": state.sent,
        "completed": state.completed,
        "failed": state.failed,
        "cancelled": state.cancelled,
        "not_started": state.not_started,
        "missed_while_down": state.missed_while_down,
        "in_flight": d.in_flight if d else 0,
        "position": {"index": pos.index, "loop": pos.loop, "row": pos.row} if pos else None,
        "speedup": d.timeline.speedup if d else None,
        "paused": d.timeline.paused if d else False,
        "dispatch_lag_max_s": round(state.max_lag_ms / 1e3, 6),  # (seconds, as every /status time)
        # the results folder's size and its oldest result kept (Unix s), as of the last flush
        "results_bytes": rec.results_bytes if rec else None,
        "results_oldest_timestamp_s": rec.oldest_timestamp_s if rec else None,
        # results a failed write keeps in memory until writing works again (0: all on disk)
        "results_unwritten": rec.unwritten_rows if rec else None,
        **(_cap_status(d) if d is not None and d.max_concurrency is not None else {}),
        # a fleet shard: the coordinator, the start epoch, this host's clock offset and its uncertainty
        **({"fleet": state.fleet} if state.fleet is not None else {}),
    }


def _cap_status(d: Dispatcher) -> dict:
    """``--max-concurrency``'s live numbers: the cap, the requests due and waiting for a slot
    now, how many waited so far, and whether the cap is the bottleneck now (some wait)."""
    return {
        "max_concurrency": d.max_concurrency,
        "queued": d.queued,
        "queued_total": d.queued_total,
        "concurrency_capped": d.queued > 0,
    }


def hms(wall_s: float) -> str:
    """A Unix time as local ``YYYY-mm-dd HH:MM:SS``."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall_s))


async def progress(state: RunState, dispatcher: Dispatcher, anchor: Anchor, every_s: float = 5.0) -> None:
    if anchor.t0_ns - now_ns() > 1_000_000_000:  # a --start-at ahead
        log.info("waiting to start: %.0f s to go (at %s)", (anchor.t0_ns - now_ns()) / 1e9, hms(anchor.wall_s))
    while True:
        await asyncio.sleep(every_s)
        t = (now_ns() - anchor.t0_ns) / 1e9
        if t < 0:
            log.info("waiting to start: %.0f s to go (at %s)", -t, hms(anchor.wall_s))
            continue
        log.info(
            "t=%.0fs sent %d/%s in-flight %d%s ok %d failed %d max lag %.1f ms (last %.0fs)",
            t,
            state.sent,
            state.scheduled or "?",
            dispatcher.in_flight,
            _cap_text(dispatcher),
            state.completed,
            state.failed,
            state.window_max_lag_ms,
            every_s,
        )
        state.window_max_lag_ms = 0.0


def _cap_text(d: Dispatcher) -> str:
    """The progress line's word on ``--max-concurrency`` ("" without a cap)."""
    if d.max_concurrency is None:
        return ""
    if d.queued:
        return f" (cap {d.max_concurrency} reached: {d.queued} waiting for a slot, the cap is the bottleneck)"
    return f" (cap {d.max_concurrency})"


_CLIENT_BOUND = (
    "its own resources are the bottleneck (measured latencies include client delay): use --workers, shards "
    "or a lower --speedup"
)
_LINK_BOUND = (
    "the link to the target is the bottleneck, not the replayer's resources (requests go out late, "
    "latencies from the due time include it): a faster link, the replayer nearer the target, or a lower --speedup"
)


async def watch_self(
    state: RunState,
    metrics: ReplayerMetrics,
    every_s: float = 1.0,
    probe: Callable[[], selfwatch.Reading] = selfwatch.Reading,
    repeat_s: float = 10.0,
) -> None:
    """Say loudly when the replayer, not the server, is the bottleneck: late sends and a busy
    event loop are the client's problem and would otherwise be reported as server latency.
    Checked every ``every_s`` (the first warning comes within about that much of falling behind);
    the warning names what is saturated (``replayer.observe.selfwatch``: CPU, event loop, preparation,
    hand-over, launcher process, GC, network send) from ``probe()`` readings, and is repeated at most every
    ``repeat_s`` while that list stays the same.
    (The numbers are also exported: replayer_dispatch_lag_seconds, replayer_event_loop_lag_*.)"""
    warned = False
    said_at, said = -float("inf"), None
    prev = probe()
    while True:
        await asyncio.sleep(every_s)
        cur = probe()
        lag, state.watch_max_lag_ms = state.watch_max_lag_ms, 0.0
        # both maxima are over this interval (the exported loop-lag gauge is over 10-20 s)
        loop_lag, metrics.loop_lag_recent_s = metrics.loop_lag_recent_s * 1e3, 0.0
        parts = selfwatch.saturated(prev, cur, loop_lag)
        prev = cur
        if lag > BEHIND_MS:
            names = [p.split(" (")[0] for p in parts]
            if names != said or time.monotonic() - said_at >= repeat_s:
                said, said_at = names, time.monotonic()
                log.warning(
                    "the replayer is behind schedule: max dispatch lag %.0f ms, event-loop lag %.0f ms "
                    "in the last %g s; saturated: %s; %s",
                    lag,
                    loop_lag,
                    every_s,
                    "; ".join(parts) or "nothing measured (another process takes the CPU?)",
                    _LINK_BOUND if selfwatch.network_bound(parts) else _CLIENT_BOUND,
                )
            warned = True
        elif loop_lag > BEHIND_MS:  # sends on time (the launcher process), but reads waited
            log.warning(
                "the replayer's event loop stalled for up to %.0f ms in the last %g s (requests still "
                "went out on time, max dispatch lag %.1f ms): TTFT and ITL of tokens read then include "
                "up to that much client delay",
                loop_lag,
                every_s,
                lag,
            )
        elif warned:
            log.info("the replayer is back on schedule (max dispatch lag %.1f ms)", lag)
            warned, said = False, None
