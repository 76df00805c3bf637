"""``replayer record``'s flags (its command is ``replayer.capture.record.main_record``)."""

from __future__ import annotations

import argparse

from replayer.core.ports import port_number

__all__ = ["add_record_parser"]


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
        type=port_number,
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
    _add_tuning_flags(p)


def _add_tuning_flags(p: argparse.ArgumentParser) -> None:
    """``replayer record``'s flags for writing, tokenizing, reading and the upstream's TLS."""
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
