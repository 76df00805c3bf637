"""Which part of the replayer is saturated when it falls behind its schedule.

A late send is the client's fault, not the server's, and past saturation the user needs to know
what ran out: the CPU, the event loop (stream reads), request preparation, the hand-over to the
launcher process, the launcher process itself, garbage collection, or the network send (the
link to the target slower than the requests' bytes: they wait for the socket to take them, and
the wait is dispatch lag, see ``replayer.http.client``). ``read`` takes one
``Reading`` of the replayer's own cumulative counters; ``saturated(prev, cur, loop_lag_ms)`` is
pure and names each part saturated between two readings, with its numbers. The daemon's
self-watch logs them (``replayer.run.live.watch_self``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

#: dispatch or event-loop lag above this means the replayer itself is too slow
BEHIND_MS = 50.0
#: process CPU (all threads) per wall second at or above which the CPU is named as saturated
CPU_BUSY = 0.9
#: share of wall time spent in garbage collection at or above which it is named
GC_BUSY = 0.05
#: the name of the part that says the link to the target is slower than the requests' bytes
NETWORK_SEND = "network send"


@dataclass(frozen=True, slots=True)
class Reading:
    """The replayer's own counters at one moment (cumulative, except ``launcher_late_ms``)."""

    wall_s: float = 0.0  # time.monotonic()
    cpu_s: float = 0.0  # process CPU time, every thread
    sent: int = 0  # requests sent
    prepared_late: int = 0  # requests whose body was built after their due time
    fired_by_loop: int = 0  # requests the loop wrote although a launcher process runs
    gc_s: float = 0.0  # time spent in paced garbage collections
    launcher_late_ms: float = 0.0  # the launcher's latest write past its due time since the last reading
    send_waited: int = 0  # requests whose bytes waited for the socket to take them (the clients' send_waited)
    send_wait_max_ms: float = 0.0  # the longest such wait since the last reading


def read(dispatcher=None, launcher=None, gc_pacer=None, clients=()) -> Reading:
    """A reading of the live parts (any of them may be None; ``clients``: the HTTP clients, one
    per target); resets the launcher's and the clients' maxima."""
    late_ms = 0.0
    if launcher is not None:
        late_ms = launcher.take_late_max_ns() / 1e6
    waited, wait_ms = 0, 0.0
    for c in clients:
        waited += c.send_waited
        wait_ms = max(wait_ms, c.take_send_wait_max_ms())
    return Reading(
        wall_s=time.monotonic(),
        cpu_s=time.process_time(),
        sent=dispatcher.sent if dispatcher is not None else 0,
        prepared_late=dispatcher.prepared_late if dispatcher is not None else 0,
        fired_by_loop=dispatcher.fired_by_loop if dispatcher is not None else 0,
        gc_s=gc_pacer.spent_ns / 1e9 if gc_pacer is not None else 0.0,
        launcher_late_ms=late_ms,
        send_waited=waited,
        send_wait_max_ms=wait_ms,
    )


def saturated(prev: Reading, cur: Reading, loop_lag_ms: float) -> list[str]:
    """What ran out between readings ``prev`` and ``cur`` (``loop_lag_ms``: the largest event-loop
    lag in that interval), each as a short phrase with its numbers; empty when nothing did. The
    network send is named when a request's bytes waited for the socket longer than ``BEHIND_MS``
    (a short wait is a socket buffer filling and emptying, not a link that falls behind)."""
    out: list[str] = []
    wall = max(cur.wall_s - prev.wall_s, 1e-9)
    cpu = (cur.cpu_s - prev.cpu_s) / wall
    if cpu >= CPU_BUSY:
        out.append(f"CPU ({cpu:.0%} of a core)")
    if loop_lag_ms > BEHIND_MS:
        out.append(f"event loop (stalled up to {loop_lag_ms:.0f} ms: stream reads and callbacks)")
    sent = cur.sent - prev.sent
    late = cur.prepared_late - prev.prepared_late
    if late > 0:
        out.append(f"request preparation ({late} of {sent} requests sent had their body built after their due time)")
    by_loop = cur.fired_by_loop - prev.fired_by_loop
    if by_loop > 0:
        out.append(
            f"hand-over to the launcher process ({by_loop} of {sent} requests written by the event loop "
            "at or after their due time)"
        )
    if cur.launcher_late_ms > BEHIND_MS:
        out.append(f"launcher process (wrote up to {cur.launcher_late_ms:.0f} ms past a due time)")
    gc = cur.gc_s - prev.gc_s
    if gc / wall >= GC_BUSY:
        out.append(f"garbage collection ({gc * 1e3:.0f} ms in {wall:.1f} s)")
    waited = cur.send_waited - prev.send_waited
    if waited > 0 and cur.send_wait_max_ms > BEHIND_MS:
        out.append(
            f"{NETWORK_SEND} ({waited} request{'s' if waited > 1 else ''} waited up to {cur.send_wait_max_ms:.0f} ms "
            f"for the socket to take {'their' if waited > 1 else 'its'} bytes, {sent} sent in {wall:.1f} s: the link to the target is slower "
            "than the requests' bytes)"
        )
    return out


def network_bound(parts: list[str]) -> bool:
    """Whether ``saturated``'s ``parts`` name only the network send: then the link, not the
    replayer's own resources, is what falls behind."""
    return bool(parts) and all(p.startswith(NETWORK_SEND) for p in parts)
