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

from replayer import __version__
from replayer.core.background import EXIT_TASK_FAILED, BackgroundTasks
from replayer.http.tls import TLSOptions
from replayer.record.recorder import write_json

log = logging.getLogger("replayer.record")


def add_record_parser(sub) -> None:
    p = sub.add_parser(
        "record",
        help="recording reverse proxy: turn live OpenAI API traffic into a "
        "replayable hash-id trace (no prompt text, token ids or image bytes are stored)",
        description="Sit between clients and an OpenAI-compatible server, forward everything "
        "unchanged, and write one trace row per API request into OUT (Parquet; read it with "
        "`replayer trace inspect OUT` and `replayer run OUT`).",
    )
    p.add_argument("--upstream", required=True, metavar="URL", help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--listen",
        default="127.0.0.1:8080",
        metavar="HOST:PORT",
        help="address to serve on (port 0: a free port, written to OUT/capture.json) [default: 127.0.0.1:8080]",
    )
    p.add_argument(
        "--out", required=True, metavar="DIR", help="capture folder (created; must not hold an earlier capture)"
    )
    p.add_argument("--block-size", type=int, default=512, help="tokens per hash id [default: 512]")
    p.add_argument(
        "--tokenizer",
        default=None,
        metavar="PATH",
        help="local tokenizer.json (or a folder holding one, or builtin:gpt2) for text prompts "
        "[default: the upstream's /tokenize]",
    )
    p.add_argument(
        "--no-upstream-tokenize",
        dest="upstream_tokenize",
        action="store_false",
        help="never call the upstream's /tokenize",
    )
    p.add_argument(
        "--hash-key-file",
        default=None,
        metavar="FILE",
        help="secret key for the block hashes (>= 16 bytes), to make two captures' ids comparable "
        "[default: a random key, kept only in memory]",
    )
    p.add_argument(
        "--session-header",
        default="X-Session-Id",
        metavar="NAME",
        help="request header holding the session id (else the body's user field) [default: X-Session-Id]",
    )
    p.add_argument(
        "--admin-port",
        type=int,
        default=9401,
        metavar="P",
        help="/metrics, /healthz and /status on ADMIN_HOST:P (0 = a free port) [default: 9401]",
    )
    p.add_argument(
        "--admin-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address of the admin port (0.0.0.0 in a container, for Prometheus) [default: 127.0.0.1]",
    )
    p.add_argument(
        "--flush-interval",
        type=float,
        default=2.0,
        metavar="S",
        help="write finished rows at least every S seconds [default: 2]",
    )
    p.add_argument("--roll-rows", type=int, default=None, metavar="N", help="start a new trace file every N rows")
    p.add_argument(
        "--roll-interval", type=float, default=None, metavar="S", help="start a new trace file every S seconds"
    )
    p.add_argument(
        "--tokenize-queue",
        type=int,
        default=10_000,
        metavar="N",
        help="finished requests that may wait for tokenization; past it rows are written "
        "without hash ids [default: 10000]",
    )
    p.add_argument(
        "--poll-interval",
        type=float,
        default=0.0,
        metavar="S",
        help="while 8 or more requests are in flight, read and forward in turns S seconds apart "
        "instead of waking for every streamed event (each event waits at most S; fewer process "
        "wake-ups per event); 0 = wake per event [default: 0]",
    )
    p.add_argument(
        "--stamp-responses",
        action="store_true",
        help="read the upstream's responses with the kernel's receive stamps, for the response "
        "direction of replayer_capture_forward_delay_seconds (how long each streamed event "
        "stayed in the proxy); costs ~3-4 us of CPU per event [default: requests only]",
    )
    p.add_argument("--ca-bundle", metavar="FILE", default=None, help="PEM CAs to trust for an https:// upstream")
    p.add_argument("--client-cert", metavar="FILE", default=None, help="PEM client certificate (mutual TLS upstream)")
    p.add_argument("--client-key", metavar="FILE", default=None, help="PEM private key of --client-cert")
    p.add_argument(
        "--tls-server-name",
        metavar="NAME",
        default=None,
        help="SNI and certificate name of the upstream [default: the --upstream URL's host]",
    )
    p.add_argument(
        "--insecure", action="store_true", help="do not verify the upstream's TLS certificate (a warning at start)"
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="on SIGTERM/SIGINT, wait S seconds for requests in flight [default: 60]",
    )


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


async def _serve(args, host: str, port: int, key: bytes, tokenizer, hasher, image_hash) -> int:  # noqa: PLR0915
    from replayer.capture.metrics import CaptureMetrics
    from replayer.capture.offload import OffloadWorker
    from replayer.capture.proxy import CaptureProxy
    from replayer.capture.tokenize import Tokenization
    from replayer.capture.writer import CaptureWriter
    from replayer.observe.admin import AdminServer

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
    tok_url = upstream + "/tokenize" if args.upstream_tokenize else None
    offload = OffloadWorker()
    await offload.start(key, args.block_size)  # started now, not during the first requests

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
    stop = asyncio.Event()
    signals: list[str] = []
    await proxy.start()
    tokenizing = proxy.tokenization
    assert tokenizing is not None  # opened by start()
    try:
        bound = proxy.listen(host, port)
    except OSError as e:
        await proxy.close()
        raise StartError(f"--listen {args.listen}: cannot listen: {e.strerror or e}") from None
    admin = AdminServer(
        metrics.registry,
        ready=lambda: True,
        status=lambda: {
            "state": "draining" if stop.is_set() else "capturing",
            "in_flight": proxy.in_flight,
            "rows_written": writer.rows_written,
            "tokenize_backlog": tokenizing.queue.qsize(),
            "distinct_blocks": hasher.distinct_blocks,
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
    print(
        f"replayer record: listening on {listen_url}, upstream {upstream}, admin {admin_url}, writing {args.out}",
        file=sys.stderr,
        flush=True,
    )

    def on_signal(name: str) -> None:
        signals.append(name)
        if len(signals) == 1:
            log.info("%s: draining %d request(s) in flight (a second signal stops waiting)", name, proxy.in_flight)
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig.name)

    async def flusher() -> None:
        while True:
            await asyncio.sleep(min(0.5, args.flush_interval))
            writer.flush_if_due()

    # owned: a flusher that crashes is logged and stops the capture (drain, close), never lost silently
    background = BackgroundTasks(on_failure=lambda name, exc: stop.set())
    background.start("trace flush", flusher())
    await stop.wait()
    proxy.stop_accepting()  # no new connections
    n = len(signals)
    deadline = loop.time() + args.drain_timeout
    while proxy.in_flight and len(signals) == n and loop.time() < deadline:
        await proxy.wait_idle(0.2)
    if proxy.in_flight:
        log.warning("stopping with %d request(s) still in flight (their rows are not written)", proxy.in_flight)
    await proxy.close()  # tokenizes what is queued, closes the connections
    await background.close()
    await admin.stop()
    await asyncio.get_running_loop().run_in_executor(None, writer.close)
    print(
        f"replayer record: {writer.rows_written} rows in {args.out} ({hasher.distinct_blocks} distinct blocks; "
        f"{proxy.listener.unstamped} reads without a kernel arrival stamp)",
        file=sys.stderr,
        flush=True,
    )
    return EXIT_TASK_FAILED if background.failures else 0
