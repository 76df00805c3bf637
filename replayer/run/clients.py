"""A run's connection pools: one ``Client`` per target from the settings, started, sharing the
launcher process, and their keep-alive connections opened before the schedule is anchored.

Opening connections is start-up, not lateness: the daemon anchors the run only after this (a
server with a small listen backlog can take seconds to accept the warm pool).
"""

from __future__ import annotations

import logging
from typing import Any

from replayer.core.clock import now_ns
from replayer.http.client import Client
from replayer.http.launcher import Launcher
from replayer.send.routing import share_launcher

log = logging.getLogger("replayer")

__all__ = ["open_clients"]


async def open_clients(
    targets: list[str], options: dict[str, Any], *, warm_connections: int, launcher: Launcher | None
) -> dict[str, Client]:
    """One started client per target URL, each built with ``options``
    (``replayer.run.assemble.client_options``: its settings and the run's event stream), and
    ``warm_connections`` shared out between them, opened now; on a failure every client is
    closed and the launcher stopped before it is raised."""
    clients = {url: Client(url, **options) for url in targets}  # one pool per target
    if options.get("delayed_ack"):
        if next(iter(clients.values())).delayed_ack:
            log.info("--delayed-ack: quick ACKs off per response (the target must set TCP_NODELAY)")
        else:
            log.warning("--delayed-ack has no effect here: this OS has no TCP_QUICKACK")
    for c in clients.values():
        await c.start()
    if launcher is not None:
        share_launcher(list(clients.values()), launcher)
    try:
        for c in clients.values():  # (the warm pool shared out between the targets)
            await _open_pool(c, -(-warm_connections // len(clients)))
    except BaseException:
        for c in clients.values():
            await c.close()
        if launcher is not None:
            launcher.stop()
        raise
    return clients


async def _open_pool(client: Client, n: int) -> None:
    """Open ``n`` keep-alive connections before the run is anchored, and say how long it took."""
    if not n:
        return
    t = now_ns()
    opened = await client.warm_up(n)
    log.info(
        "opened %d keep-alive connections ahead of the first request in %.3f s (before the schedule's anchor)",
        opened,
        (now_ns() - t) / 1e9,
    )
