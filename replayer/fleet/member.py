"""A shard's side of the fleet protocol (``replayer run --coordinator URL``).

``join`` measures the shard's clock against the coordinator's (``replayer.fleet.clocksync``),
registers the shard as ready and waits for the start epoch (a long poll, asked again until the
epoch comes or ``timeout_s`` passes). ``Heartbeat`` then reports the shard's counts every second
and its summary at the end. A coordinator that stops answering after the start never stops the
replay: the shard keeps its schedule (the epoch is known) and says once that it cannot report.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from replayer.fleet.clocksync import SKEW_WARN_S, ClockOffset, Probe, best_offset

log = logging.getLogger("replayer")

#: offset probes per join (the smallest round trip is kept)
PROBES = 16


class FleetError(RuntimeError):
    """The shard could not join its fleet (coordinator unreachable, or no start in time)."""


@dataclass(frozen=True, slots=True)
class Joined:
    """The fleet's start as this shard knows it."""

    coordinator: str
    epoch_s: float  # the start, on the coordinator's wall clock
    clock: ClockOffset
    shards: int
    missing_at_start: tuple[int, ...]

    @property
    def local_epoch_s(self) -> float:
        """The start on this shard's wall clock."""
        return self.clock.to_shard(self.epoch_s)

    def as_dict(self) -> dict[str, Any]:
        return {
            "coordinator": self.coordinator,
            "epoch_s": self.epoch_s,
            "local_epoch_s": self.local_epoch_s,
            **self.clock.as_dict(),
            "missing_at_start": list(self.missing_at_start),
        }


async def probe_clock(session: aiohttp.ClientSession, url: str, n: int = PROBES) -> ClockOffset:
    """``n`` round trips to ``GET url/clock``; the offset of the fastest."""
    probes = []
    for _ in range(n):
        sent = time.time()
        async with session.get(url + "/clock") as r:
            r.raise_for_status()
            body = await r.json()
        probes.append(Probe(sent, float(body["wall_s"]), time.time()))
    return best_offset(probes)


async def join(url: str, shard: int, *, results: str | None, timeout_s: float) -> Joined:
    """Probe the clock, register as ready, wait for the epoch. Raises FleetError naming the
    coordinator and the last error when it does not answer or gives no start within ``timeout_s``."""
    url = url.rstrip("/")
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    said = 0.0
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        clock: ClockOffset | None = None
        while time.monotonic() < deadline:
            try:
                if clock is None:
                    clock = await probe_clock(session, url)
                    if abs(clock.offset_s) > SKEW_WARN_S:
                        log.warning(
                            "this host's clock is %+.3f s off the coordinator's (+/- %.4f s): the shard "
                            "anchors on the coordinator's clock, but check the hosts' time sync",
                            clock.offset_s,
                            clock.uncertainty_s,
                        )
                    else:
                        log.info(
                            "clock offset to the coordinator %+.4f s (+/- %.4f s)", clock.offset_s, clock.uncertainty_s
                        )
                info = {
                    "shard": shard,
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "clock": clock.as_dict(),
                    "results": os.path.abspath(results) if results else None,
                    "wait_s": max(0.0, min(20.0, deadline - time.monotonic())),
                }
                async with session.post(url + "/ready", json=info) as r:
                    if r.status != 200:
                        raise FleetError(f"coordinator {url} refused shard {shard}: HTTP {r.status} {await r.text()}")
                    body = await r.json()
                if body.get("epoch_s") is not None:
                    return Joined(
                        url, float(body["epoch_s"]), clock, int(body["shards"]), tuple(body.get("missing_at_start", ()))
                    )
                last = "the other shards are not all ready"
            except FleetError:
                raise
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, KeyError) as e:
                last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                await asyncio.sleep(0.2)
            if time.monotonic() - said > 10:
                said = time.monotonic()
                log.info("waiting for the fleet's start from %s (%s)", url, last)
    raise FleetError(f"no start from the coordinator {url} within {timeout_s:g} s ({last}; --ready-timeout)")


class Heartbeat:
    """Reports ``counts()`` to the coordinator every ``every_s``; ``ended`` sends the summary."""

    def __init__(self, url: str, shard: int, counts: Callable[[], dict[str, Any]], every_s: float = 1.0) -> None:
        self.url = url.rstrip("/")
        self.shard = shard
        self.counts = counts
        self.every_s = every_s
        self.failures = 0
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        return self._session

    async def _post(self, path: str, body: dict[str, Any]) -> bool:
        try:
            async with self._client().post(self.url + path, json=body) as r:
                await r.read()
                ok = r.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            ok = False
            if self.failures == 0:
                log.warning(
                    "cannot report to the coordinator %s (%s): the replay goes on", self.url, e or type(e).__name__
                )
        self.failures += not ok
        return ok

    async def run(self) -> None:
        while True:
            await self._post("/heartbeat", {"shard": self.shard, "counts": self.counts()})
            await asyncio.sleep(self.every_s)

    async def ended(self, summary: dict[str, Any]) -> None:
        await self._post("/ended", {"shard": self.shard, "counts": self.counts(), "summary": summary})

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
