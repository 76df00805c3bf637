"""Standalone server: ``replayer sim`` flags (``parser``, generated from ``SimConfig``), :func:`main` and
:func:`run_sim`."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import ssl
import sys
from dataclasses import fields
from typing import get_args, get_type_hints

from replayer.core.background import BackgroundTasks
from replayer.core.ports import port_number
from replayer.sim.config import ReceivedRequest, SimConfig
from replayer.sim.server import SimServer

# ---------------------------------------------------------------------------------------
# Standalone server


class ListenError(Exception):
    """The server could not listen on its host:port (in use, not permitted): ``main`` prints it
    on one line and exits 2, as ``replayer run`` does for an unusable ``--admin-port``."""


async def _serve(
    config: SimConfig,
    host: str,
    port: int,
    record_file: str | None,
    parent_pid: int | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    fh = open(record_file, "ab") if record_file else None  # noqa: SIM115 - closed below
    written = 0

    def on_request(rec: ReceivedRequest) -> None:
        nonlocal written
        if fh is None or written >= config.record_limit:
            return
        fh.write(rec.to_json() + b"\n")
        fh.flush()  # one line per request survives a kill
        written += 1

    server = SimServer(config, on_request=on_request if fh else None)
    try:
        try:
            url = await server.start(host, port, ssl_context)
        except OSError as e:
            raise ListenError(
                f"cannot listen on {host}:{port}: {os.strerror(e.errno) if e.errno else e} "
                "(another server may be there: --port 0 takes a free port, or pick another port)"
            ) from None
        if not parent_pid:  # (a run's embedded simulator: the run logs where it serves, at INFO: issue 47)
            print(f"replayer sim: model {config.model!r} serving at {url}", file=sys.stderr, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        # owned: a watch that crashes is logged and stops the simulator (it was to stop with the parent)
        background = BackgroundTasks(on_failure=lambda name, exc: stop.set())
        if parent_pid:
            background.start("parent watch", _exit_with(parent_pid, stop, server))
        await stop.wait()
        await background.close()
    finally:
        await server.stop()
        if fh is not None:
            fh.close()


def run_sim(
    config: SimConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    record_file: str | None = None,
    parent_pid: int | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM (blocking, uvloop). ``record_file``: append JSON lines.
    ``parent_pid``: also stop once that process has ended (checked twice a second).
    ``ssl_context``: serve HTTPS (``replayer.sim.certs.server_context``)."""
    try:
        import uvloop

        uvloop.run(_serve(config, host, port, record_file, parent_pid, ssl_context))
    except ImportError:  # pragma: no cover - uvloop is a dependency
        asyncio.run(_serve(config, host, port, record_file, parent_pid, ssl_context))


PARENT_IDLE_S = 2.0  # after the parent is gone: exit once no request came for this long
PARENT_GRACE_S = 300.0  # ... or after this long at the most


async def _exit_with(pid: int, stop: asyncio.Event, server: SimServer) -> None:
    """Set ``stop`` when process ``pid`` (our parent) is gone (we are then re-parented) and no
    request has been in flight for ``PARENT_IDLE_S``: the workers of a killed ``--workers``
    parent (its other children) drain their requests first, as they stop too."""
    while os.getppid() == pid:
        await asyncio.sleep(0.5)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PARENT_GRACE_S
    idle_since = loop.time()
    while loop.time() < deadline:
        if server.requests_in_flight:
            idle_since = loop.time()
        elif loop.time() - idle_since >= PARENT_IDLE_S:
            break
        await asyncio.sleep(0.1)
    stop.set()


def parser() -> argparse.ArgumentParser:
    """``replayer sim``'s flags: where it listens and what it writes, then the simulated
    server's, one per ``SimConfig`` field made with ``config.flag`` (``add_config_flags``)."""
    p = argparse.ArgumentParser(
        prog="replayer sim",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
        description="Simulated vLLM OpenAI-compatible server: its timing model and limits are in docs/simulator.md.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument(
        "--port",
        type=port_number,
        default=8000,
        help="port to listen on (0 = a free port; the URL is printed at start)",
    )
    p.add_argument(
        "--record-requests",
        metavar="FILE",
        default=None,
        help="append one JSON line per received request (prompt included)",
    )
    p.add_argument(
        "--parent-pid",
        type=int,
        metavar="PID",
        default=None,
        help="stop when this process (the parent: replayer run's embedded simulator) has ended and no request came "
        "for 2 s; the 'serving at' line is then not printed (the run logs the URL, and --quiet keeps stderr quiet)",
    )
    p.add_argument("--tls-cert", metavar="FILE", default=None, help="serve HTTPS with this PEM certificate (chain)")
    p.add_argument(
        "--tls-key", metavar="FILE", default=None, help="the PEM private key of --tls-cert (if not in that file)"
    )
    p.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        default=None,
        help="require a client certificate signed by a CA in this PEM file (mutual TLS)",
    )
    add_config_flags(p.add_argument_group("the simulated server"))
    return p


def add_config_flags(p: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """One flag per ``SimConfig`` field that has a help text (``config.flag``), in field order:
    its name from the field's (or the field's ``flags``), its type from its annotation, its
    default the field's; a bool is a switch to the other value."""
    hints = get_type_hints(SimConfig)
    for f in fields(SimConfig):
        meta = dict(f.metadata)
        if "help" not in meta:
            continue
        names = meta.pop("flags", (f"--{f.name.replace('_', '-')}",))
        typ = next((t for t in get_args(hints[f.name]) if t is not type(None)), hints[f.name])
        if typ is bool:
            action = "store_false" if f.default else "store_true"
            p.add_argument(*names, dest=f.name, action=action, default=f.default, **meta)
        else:
            p.add_argument(*names, dest=f.name, type=typ, default=f.default, **meta)


def config_from_flags(a: argparse.Namespace) -> SimConfig:
    """The ``SimConfig`` of parsed flags (``ValueError`` names a bad value)."""
    return SimConfig(**{f.name: getattr(a, f.name) for f in fields(SimConfig) if "help" in f.metadata})


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``replayer sim``: parse flags, serve until SIGINT/SIGTERM, return 0 (2: bad flags
    or the port cannot be listened on)."""
    a = parser().parse_args(argv)
    try:
        cfg = config_from_flags(a)
        ctx = None
        if a.tls_cert:
            from replayer.sim.certs import server_context

            ctx = server_context(a.tls_cert, a.tls_key, a.tls_client_ca)
        elif a.tls_key or a.tls_client_ca:
            raise ValueError("--tls-key and --tls-client-ca need --tls-cert")
    except ValueError as e:
        print(f"replayer sim: {e}", file=sys.stderr)
        return 2
    try:
        run_sim(cfg, a.host, a.port, a.record_requests, a.parent_pid, ctx)
    except ListenError as e:
        print(f"replayer sim: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
