"""Standalone server: ``replayer sim`` flags (``_parser``), :func:`main` and :func:`run_sim`."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import ssl
import sys

from replayer.core.background import BackgroundTasks
from replayer.sim.config import SCORE_USAGE_MODES, ReceivedRequest, SimConfig
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
    d = SimConfig()
    p = argparse.ArgumentParser(
        prog="replayer sim",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
        description="Simulated vLLM OpenAI-compatible server: its timing model and limits are in docs/simulator.md.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument(
        "--port", type=int, default=8000, help="port to listen on (0 = a free port; the URL is printed at start)"
    )
    p.add_argument("--model", default=d.model, help="served model name")
    p.add_argument("--kv-block-size", type=int, default=d.kv_block_size, help="prefix-cache block size, tokens")
    p.add_argument(
        "--prefix-cache-tokens",
        type=int,
        default=d.prefix_cache_tokens,
        help="prefix-cache capacity, tokens (0 disables)",
    )
    p.add_argument(
        "--ttft-base-ms", type=float, default=d.ttft_base_ms, help="time to first token of an empty prompt, ms"
    )
    p.add_argument(
        "--prefill-us-per-token",
        type=float,
        default=d.prefill_us_per_token,
        help="microseconds per uncached prompt token",
    )
    p.add_argument(
        "--itl-base-ms", type=float, default=d.itl_base_ms, help="gap between two tokens with one request running, ms"
    )
    p.add_argument(
        "--itl-per-running-us",
        type=float,
        default=d.itl_per_running_us,
        help="added to every token gap per running request, us (a batch decodes slower)",
    )
    p.add_argument(
        "--ttft-drift-ms-per-min",
        type=float,
        default=d.ttft_drift_ms_per_min,
        help="a test aid: every time to first token grows by this many ms per minute since the start "
        "(a server that degrades, for the drift verdict)",
    )
    p.add_argument(
        "--itl-drift-ms-per-min",
        type=float,
        default=d.itl_drift_ms_per_min,
        help="a test aid: every gap between tokens grows by this many ms per minute since the start",
    )
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, help="max running requests (0 = unlimited)")
    p.add_argument(
        "--vocab-size", type=int, default=d.vocab_size, help="a prompt token id outside [0, N) is an error, as in vLLM"
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        default=d.max_model_len,
        help="longest prompt + output in tokens; a longer request is answered 400, as vLLM does",
    )
    p.add_argument(
        "--record-requests",
        metavar="FILE",
        default=None,
        help="append one JSON line per received request (prompt included)",
    )
    p.add_argument(
        "--record-limit", type=int, default=d.record_limit, help="max requests written to --record-requests FILE"
    )
    p.add_argument("--embedding-dim", type=int, default=d.embedding_dim, help="length of /v1/embeddings vectors")
    p.add_argument(
        "--score-usage",
        choices=SCORE_USAGE_MODES,
        default=d.score_usage,
        help="score/rerank prompt tokens: per_document (cross-encoder, query "
        "counted per document) or once (query counted once)",
    )
    p.add_argument(
        "--parent-pid",
        type=int,
        metavar="PID",
        default=None,
        help="stop when this process (the parent: replayer run's embedded simulator) has ended and no request came for 2 s",
    )
    p.add_argument(
        "--inflate-score-usage",
        type=int,
        metavar="N",
        default=d.score_usage_inflate_tokens,
        help="add N tokens per document to score/rerank usage (imitates an old vLLM usage bug; /metrics stays honest)",
    )
    p.add_argument(
        "--tokens-per-chunk",
        type=int,
        metavar="K",
        default=d.tokens_per_chunk,
        help="tokens per decode step and streamed chunk after the first token (as "
        "speculative decoding or MTP delivers them)",
    )
    p.add_argument(
        "--otlp-endpoint",
        "--otlp-traces-endpoint",
        dest="otlp_endpoint",
        default=None,
        metavar="URL",
        help="as vLLM's --otlp-traces-endpoint: export an llm_request SERVER span per request (vLLM's "
        "attribute names, parented by the request's traceparent) over OTLP/HTTP to this collector "
        "(/v1/traces added unless given)",
    )
    p.add_argument(
        "--enable-per-request-metrics",
        action="store_true",
        help="as vLLM's flag: every completions/chat response carries its timings in a "
        "'metrics' object (streams: on the final usage chunk); without it, only requests "
        'with "include_metrics": true get them',
    )
    p.add_argument(
        "--image-token-rule",
        default=d.image_token_rule,
        help="tokens of each decoded image: qwen2-vl, llava (576), fixed:N or none (0); the "
        "default is replayer run's default expectation",
    )
    p.add_argument(
        "--encoder-cache-images",
        type=int,
        default=d.encoder_cache_images,
        help="images the encoder cache holds (LRU keyed by image content; 0 = no cache)",
    )
    p.add_argument(
        "--image-encode-us-per-token",
        type=float,
        default=d.image_encode_us_per_token,
        help="simulated encoder time per image token, skipped when the image hits the encoder cache",
    )
    p.add_argument(
        "--no-prompt-tokens-details",
        dest="prompt_tokens_details",
        action="store_false",
        help="leave usage.prompt_tokens_details (image_tokens) out, as vLLM does without "
        "--enable-prompt-tokens-details",
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
    p.add_argument(
        "--tokenizer",
        default=None,
        help="count text prompts as vLLM does: a local tokenizer.json or folder (or builtin:gpt2); chat "
        "messages are rendered through the folder's chat template first (default: whitespace words)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``replayer sim``: parse flags, serve until SIGINT/SIGTERM, return 0 (2: bad flags
    or the port cannot be listened on)."""
    a = parser().parse_args(argv)
    try:
        cfg = SimConfig(
            model=a.model,
            kv_block_size=a.kv_block_size,
            prefix_cache_tokens=a.prefix_cache_tokens,
            ttft_base_ms=a.ttft_base_ms,
            prefill_us_per_token=a.prefill_us_per_token,
            itl_base_ms=a.itl_base_ms,
            itl_per_running_us=a.itl_per_running_us,
            max_num_seqs=a.max_num_seqs,
            vocab_size=a.vocab_size,
            max_model_len=a.max_model_len,
            record_requests=False,
            record_limit=a.record_limit,
            embedding_dim=a.embedding_dim,
            score_usage=a.score_usage,
            score_usage_inflate_tokens=a.inflate_score_usage,
            tokens_per_chunk=a.tokens_per_chunk,
            per_request_metrics=a.enable_per_request_metrics,
            otlp_endpoint=a.otlp_endpoint,
            image_token_rule=a.image_token_rule,
            encoder_cache_images=a.encoder_cache_images,
            image_encode_us_per_token=a.image_encode_us_per_token,
            prompt_tokens_details=a.prompt_tokens_details,
            tokenizer=a.tokenizer,
            ttft_drift_ms_per_min=a.ttft_drift_ms_per_min,
            itl_drift_ms_per_min=a.itl_drift_ms_per_min,
        )
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
