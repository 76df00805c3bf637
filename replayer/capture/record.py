"""``replayer record``: flags -> a running capture proxy; checks at start, drain at the end.

Start-up refuses (exit 2, naming the flag): an ``--out`` that cannot be written or that holds an
earlier capture (the compact hash ids of two captures would collide), a ``--tokenizer`` or
``--hash-key-file`` that cannot be loaded, a bad ``--listen``. Then it listens, writes
``OUT/capture.json`` (the wall-clock start and settings; never the key) and serves until SIGTERM or
SIGINT: it stops accepting, waits up to ``--drain-timeout`` s for requests in flight, tokenizes
what is queued, writes and rolls the last rows, and exits 0 (a second signal stops waiting). Its
periodic flush is owned (``replayer.core.background``): if it crashes, that is logged with its traceback,
the capture stops the same way and exits 4.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from replayer import __version__
from replayer.core.background import EXIT_TASK_FAILED, BackgroundTasks
from replayer.http.tls import TLSOptions
from replayer.record.recorder import write_json
from replayer.record.rolling import EXIT_WRITE_FAILED

if TYPE_CHECKING:
    from replayer.capture.metrics import CaptureMetrics
    from replayer.capture.offload import OffloadWorker
    from replayer.capture.proxy import CaptureProxy
    from replayer.capture.writer import CaptureWriter
    from replayer.observe.admin import AdminServer

log = logging.getLogger("replayer.record")


def _tls(args: argparse.Namespace) -> TLSOptions:
    """The upstream's TLS settings from the flags."""
    return TLSOptions(args.ca_bundle, args.client_cert, args.client_key, args.tls_server_name, args.insecure)


class StartError(Exception):
    """A setting that keeps the capture from starting (message names it)."""


def _check_out(out: str) -> None:
    if os.path.isfile(os.path.join(out, "capture.json")) or any(
        n.endswith(".parquet") for n in (os.listdir(out) if os.path.isdir(out) else [])
    ):
        raise StartError(
            f"--out {out}: holds an earlier capture or trace; use a new folder (hash ids of two captures would collide)"
        )
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, ".write-test")
        with open(probe, "wb") as f:
            f.write(b"x")
        os.remove(probe)
    except OSError as e:
        raise StartError(f"--out {out}: cannot write there: {e.strerror or e}") from None


def _load_tokenizer(path: str):
    from tokenizers import Tokenizer

    from replayer.core.tokenizerfiles import tokenizer_file

    try:
        return Tokenizer.from_file(tokenizer_file(path))
    except Exception as e:  # the library raises plain Exceptions for a missing or bad file
        raise StartError(f"--tokenizer {path}: cannot load: {e}") from None


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    try:
        if not sep or not host or not 0 <= int(port) < 65536:
            raise ValueError
        return host.strip("[]"), int(port)
    except ValueError:
        raise StartError(f"--listen {text!r}: expected HOST:PORT") from None


def main_record(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from replayer.capture.blocks import BlockHasher, HashKeyError, content_hash, load_key

    try:
        if args.block_size < 1:
            raise StartError(f"--block-size {args.block_size}: must be >= 1")
        if not 0 <= args.poll_interval <= 0.1:
            raise StartError(f"--poll-interval {args.poll_interval}: must be between 0 and 0.1 s")
        if not args.upstream.startswith(("http://", "https://")):
            raise StartError(f"--upstream {args.upstream!r}: expected an http:// or https:// URL")
        host, port = _listen(args.listen)
        _check_out(args.out)
        if args.upstream.startswith("https://"):
            try:
                _tls(args).context()
            except ValueError as e:
                raise StartError(str(e)) from None
            if args.insecure:
                logging.getLogger("replayer").warning(
                    "--insecure: the TLS certificate of %s is NOT verified", args.upstream
                )
        tokenizer = _load_tokenizer(args.tokenizer) if args.tokenizer else None
        try:
            key = load_key(args.hash_key_file)
        except HashKeyError as e:
            raise StartError(str(e)) from None
    except StartError as e:
        print(f"replayer record: {e}", file=sys.stderr)
        return 2
    import uvloop

    try:
        return uvloop.run(
            _serve(
                args,
                host,
                port,
                key,
                tokenizer,
                BlockHasher(key, args.block_size),
                lambda data: content_hash(key, data),
            )
        )
    except StartError as e:
        print(f"replayer record: {e}", file=sys.stderr)
        return 2


@dataclass(frozen=True)
class _Capture:
    """The capture's parts (``_assemble``)."""

    upstream: str
    started: float  # wall clock, s
    metrics: CaptureMetrics
    writer: CaptureWriter
    offload: OffloadWorker
    proxy: CaptureProxy
    hasher: object  # blocks.BlockHasher (distinct_blocks)


def _assemble(args, key: bytes, tokenizer, hasher, image_hash) -> _Capture:
    """The capture's parts from its flags: which part gets which flag, constructors only."""
    from replayer.capture.metrics import CaptureMetrics
    from replayer.capture.offload import OffloadWorker
    from replayer.capture.proxy import CaptureProxy
    from replayer.capture.tokenize import Tokenization
    from replayer.capture.writer import CaptureWriter

    t0 = time.perf_counter_ns()
    started = time.time()
    upstream = args.upstream.rstrip("/").removesuffix("/v1")
    metrics = CaptureMetrics()
    meta = {
        "replayer.block_size": str(args.block_size),
        "replayer.time_unit": "ns",
        "replayer.source": f"replayer record {__version__}, upstream {upstream}",
        "replayer.capture_started_at": f"{started:.6f}",
        "replayer.capture_monotonic_origin_ns": str(t0),
    }
    writer = CaptureWriter(
        args.out,
        meta,
        flush_interval_s=args.flush_interval,
        roll_rows=args.roll_rows,
        roll_interval_s=args.roll_interval,
    )
    offload = OffloadWorker()
    tok_url = upstream + "/tokenize" if args.upstream_tokenize else None

    def tokenization(session):
        return Tokenization(
            hasher,
            writer.add,
            metrics,
            maxsize=args.tokenize_queue,
            session=session,
            tokenize_url=tok_url,
            tokenizer=tokenizer,
            image_hash=image_hash,
            offload=offload,
        )

    proxy = CaptureProxy(
        upstream,
        tokenization,
        metrics,
        t0_ns=t0,
        session_header=args.session_header,
        poll_interval_s=args.poll_interval,
        stamp_responses=args.stamp_responses,
        tls=_tls(args),
    )
    return _Capture(upstream, started, metrics, writer, offload, proxy, hasher)


async def _serve(args, host: str, port: int, key: bytes, tokenizer, hasher, image_hash) -> int:
    """Assemble the capture, start it, serve until a stop signal, drain, finish."""
    c = _assemble(args, key, tokenizer, hasher, image_hash)
    stop = asyncio.Event()
    await c.offload.start(key, args.block_size)  # started now, not during the first requests
    admin = await _start(args, c, host, port, stop)
    signals: list[str] = []

    def on_signal(name: str) -> None:
        signals.append(name)
        if len(signals) == 1:
            log.info("%s: draining %d request(s) in flight (a second signal stops waiting)", name, c.proxy.in_flight)
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig.name)

    async def flusher() -> None:
        while True:
            await asyncio.sleep(min(0.5, args.flush_interval))
            c.writer.flush_if_due()

    # owned: a flusher that crashes is logged and stops the capture (drain, close), never lost silently
    background = BackgroundTasks(on_failure=lambda name, exc: stop.set())
    background.start("trace flush", flusher())
    await stop.wait()
    await _drain(c, args.drain_timeout, signals)
    await background.close()
    await admin.stop()
    await loop.run_in_executor(None, c.writer.close)
    return _finish(args, c, task_failed=bool(background.failures))


async def _start(args, c: _Capture, host: str, port: int, stop: asyncio.Event) -> AdminServer:
    """The proxy listening, the admin server up, ``capture.json`` written, the start said; what
    started is closed again when a step fails (StartError)."""
    from replayer.observe.admin import AdminServer

    proxy, writer = c.proxy, c.writer
    await proxy.start()
    tokenizing = proxy.tokenization
    assert tokenizing is not None  # opened by start()
    try:
        bound = proxy.listen(host, port)
    except OSError as e:
        await proxy.close()
        raise StartError(f"--listen {args.listen}: cannot listen: {e.strerror or e}") from None
    admin = AdminServer(
        c.metrics.registry,
        ready=lambda: True,
        status=lambda: {
            "state": "draining" if stop.is_set() else "capturing",
            "in_flight": proxy.in_flight,
            "rows_written": writer.rows_written,
            "tokenize_backlog": tokenizing.queue.qsize(),
            "distinct_blocks": c.hasher.distinct_blocks,  # type: ignore[attr-defined]
            "reads_without_kernel_stamp": proxy.listener.unstamped,
        },
    )
    try:
        admin_url = await admin.start(args.admin_host, args.admin_port)
    except OSError as e:
        await proxy.close()
        raise StartError(f"--admin-port {args.admin_port}: cannot listen: {e.strerror or e}") from None
    admin_port = int(admin_url.rsplit(":", 1)[1])
    listen_url = f"http://{host}:{bound}"
    try:
        _write_capture_json(args, c.started, listen_url, c.upstream, admin_port)
    except OSError as e:  # (a full disk at the start)
        await admin.stop()
        await proxy.close()
        raise StartError(f"--out {args.out}: cannot write capture.json: {e.strerror or e}") from None
    print(
        f"replayer record: listening on {listen_url}, upstream {c.upstream}, admin {admin_url}, writing {args.out}",
        file=sys.stderr,
        flush=True,
    )
    return admin


async def _drain(c: _Capture, drain_timeout_s: float, signals: list[str]) -> None:
    """No new connection; the requests in flight waited for (up to ``drain_timeout_s``, or until
    another signal), then what is queued tokenized and the connections closed."""
    proxy = c.proxy
    proxy.stop_accepting()
    n = len(signals)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + drain_timeout_s
    while proxy.in_flight and len(signals) == n and loop.time() < deadline:
        await proxy.wait_idle(0.2)
    if proxy.in_flight:
        log.warning("stopping with %d request(s) still in flight (their rows are not written)", proxy.in_flight)
    await proxy.close()  # tokenizes what is queued, closes the connections


def _finish(args, c: _Capture, *, task_failed: bool) -> int:
    """What the capture wrote, said; its exit code."""
    writer = c.writer
    print(
        f"replayer record: {writer.rows_written} rows in {args.out} ({c.hasher.distinct_blocks} distinct blocks; "  # type: ignore[attr-defined]
        f"{c.proxy.listener.unstamped} reads without a kernel arrival stamp)",
        file=sys.stderr,
        flush=True,
    )
    if writer.unwritten_rows or writer.roll_error:
        lost = f"{writer.unwritten_rows} captured rows could not be written (lost)" if writer.unwritten_rows else ""
        rolled = f"the last roll failed ({writer.roll_error}): the parts in {args.out}/parts stay, readable" * bool(
            writer.roll_error
        )
        print(
            f"replayer record: {'; '.join(x for x in (lost, rolled) if x)}: exit {EXIT_WRITE_FAILED}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_WRITE_FAILED
    return EXIT_TASK_FAILED if task_failed else 0


def _write_capture_json(args, started, listen_url: str, upstream: str, admin_port: int) -> None:
    """``OUT/capture.json``: what the capture listens on, forwards to, and hashes with."""
    write_json(
        os.path.join(args.out, "capture.json"),
        {
            "capture_started_at": started,
            "listen": listen_url,
            "upstream": upstream,
            "admin_port": admin_port,
            "block_size": args.block_size,
            "hash_key": "file" if args.hash_key_file else "random (not kept)",
            "tokenizer": args.tokenizer,
            "upstream_tokenize": args.upstream_tokenize,
            "version": __version__,
        },
    )
