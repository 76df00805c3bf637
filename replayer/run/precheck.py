"""The checks a run makes of its own input, made first by the roots that start runs as children
(``--workers``, ``replayer sweep``): the trace (read, every row checked under
``--validate-trace full``, the endpoints and images it needs), tracing's SDK, and the admin
ports the children will bind. They run before the embedded simulator or any child starts, so bad
input is named once, with exit 2, and nothing is started only to be stopped (each child still
checks its own share, as any run does).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable

from replayer.config.model import RunConfig

__all__ = ["input_problem", "port_problem"]


def input_problem(cfg: RunConfig, admin_ports: Iterable[int] = (), *, quiet: bool = False) -> str | None:
    """What is wrong with ``cfg``'s trace, its tracing or the ``admin_ports`` its children will
    bind (``replayer.run.inputs``' own checks, the same words), or None. Reads the trace as a run
    does before it sends (every row under ``--validate-trace full``); starts nothing. ``quiet``:
    the checks' warnings (a coarse timestamp grid, ...) not logged, where each child logs them
    to the same stream again."""
    from replayer.run.inputs import check_tracing, open_batches_factory
    from replayer.run.readiness import StartupError
    from replayer.trace import TraceError

    if quiet:
        logging.disable(logging.WARNING)
    try:
        open_batches_factory(cfg)
        check_tracing(cfg)
    except (StartupError, TraceError) as e:
        return str(e)
    finally:
        if quiet:
            logging.disable(logging.NOTSET)
    return port_problem(cfg.admin_host, admin_ports)


def port_problem(host: str, ports: Iterable[int]) -> str | None:
    """Why one of ``ports`` cannot be bound on ``host`` now (the admin server's words: another
    process listens there), or None. Port 0 (a free one) is never a problem."""
    for port in ports:
        if not port:
            continue
        try:
            family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            with socket.socket(family, kind, proto) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as the admin server binds)
                s.bind(addr)
        except OSError as e:
            return f"--admin-port {port} on {host}: {e.strerror or e} (--admin-port 0 takes a free port)"
    return None
