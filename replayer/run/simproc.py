"""The embedded simulator as a child process: spawn it on a free loopback port, stop it; and
``PARENT_PID_ENV``, which ties a ``--workers`` worker to its parent.

Kept free of heavy imports so ``replayer run`` can start the simulator first thing, letting it
boot on the other core while the replayer itself imports and loads the trace.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable

log = logging.getLogger("replayer")

#: set by ``--workers`` in each worker's environment: the parent's pid. The workers run in
#: sessions of their own, so a worker stops by itself when that process is gone
#: (``stop_with_parent``)
PARENT_PID_ENV = "REPLAYER_PARENT_PID"
#: set by ``--workers`` in each worker's environment when the workers share the parent's embedded
#: simulator: its URL, so the worker's ``--target`` is recorded as the embedded simulator
#: (``summary.json``'s ``target_embedded``), not as a server of the user's
EMBEDDED_TARGET_ENV = "REPLAYER_EMBEDDED_TARGET"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def embedded_args(
    tokenizer: str | None, otlp_endpoint: str | None = None, *, ttft_drift: float = 0.0, itl_drift: float = 0.0
) -> list[str]:
    """The embedded simulator's flags for a run: its ``--tokenizer`` (the simulator then counts
    text and chat prompts as vLLM does, through the folder's chat template), with tracing on
    its ``--otlp-endpoint`` (its ``llm_request`` spans go to the run's collector: the whole
    journey traced without a GPU), and the test aid of the drift verdict (``--sim-ttft-drift-ms-per-min``,
    ``--sim-itl-drift-ms-per-min``: the simulator degrades on purpose), and ``--accept-any-model``: a trace's rows may name models of
    their own (an agentic trace's), answered as the run's; ``--model`` is still checked against
    its ``/v1/models`` at start."""
    args = ["--tokenizer", tokenizer] if tokenizer else []
    args += ["--ttft-drift-ms-per-min", repr(ttft_drift)] if ttft_drift else []
    args += ["--itl-drift-ms-per-min", repr(itl_drift)] if itl_drift else []
    # (a trace's rows may name models of their own; --model is still checked against /v1/models)
    args.append("--accept-any-model")
    return args + (["--otlp-endpoint", otlp_endpoint] if otlp_endpoint else [])


def spawn_sim(extra_args: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``replayer sim`` on a free loopback port; returns the process and its base URL.
    Readiness is the caller's to wait for (``GET /v1/models``).

    It runs in a session of its own, so a Ctrl-C in the terminal (SIGINT to the foreground
    process group) or ``timeout`` (which signals its group) reaches only the replayer: that
    drains the requests in flight, then stops the simulator (``stop_sim``); in the same group
    the simulator died at once and every request in flight failed as a disconnect. It exits by
    itself when this process is gone (``--parent-pid``), so a SIGKILL leaves no server behind."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "replayer",
            "sim",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--parent-pid",
            str(os.getpid()),
            *(extra_args or []),
        ],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    return proc, f"http://127.0.0.1:{port}"


def stop_sim(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``. Blocking."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def stop_with_parent(pid: int, stop: Callable[[str], None], every_s: float = 0.5) -> None:
    """Stop the run as on SIGHUP once process ``pid`` (the ``--workers`` parent) is gone: the
    workers run in sessions of their own, so nothing else would stop them when it is killed."""
    import asyncio  # (not at import: this module is imported first thing, to start the simulator)

    while os.getppid() == pid:
        await asyncio.sleep(every_s)
    log.warning("the --workers parent (pid %d) is gone: stopping", pid)
    stop("SIGHUP")


class ForwardStops:
    """A parent's stop signals (SIGTERM, SIGINT, SIGHUP) forwarded to its children, which run in
    sessions of their own and drain as on SIGTERM (a hang-up goes on as SIGTERM); the signals
    received are kept in ``signals``. Installed at once; ``restore`` puts the handlers back."""

    def __init__(self) -> None:
        import signal

        self.signals: list[int] = []
        self.children: list[subprocess.Popen] = []
        self._old = {s: signal.signal(s, self._forward) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}

    def _forward(self, signum: int, frame: object) -> None:
        import signal

        self.signals.append(signum)
        for p in self.children:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)

    def restore(self) -> None:
        import signal

        for s, h in self._old.items():
            signal.signal(s, h)
