"""``replayer trace from-log LOG.jsonl -o OUT.parquet``: the rows ``replayer record`` writes, from
request/response logs a gateway already keeps (for teams that cannot put a proxy in the path).

One JSON object per line and per request::

    {"timestamp": 1733050000.125, "endpoint": "/v1/chat/completions", "request": {...the body...},
     "usage": {"prompt_tokens": 812, "completion_tokens": 64}, "status": 200,
     "request_id": "abc", "session_id": "u-17"}

``timestamp`` (required): a number in ``--time-unit`` (default s) or an ISO-8601 string; ``request``
(required): the request body as sent; ``usage``, or ``response`` holding ``usage``: the server's
usage (without it the lengths come from the tokens and are flagged, or stay unknown);
``endpoint`` (default ``--endpoint``, else read from the body's shape: ``messages`` is chat,
``prompt`` completions, ``input`` embeddings, ``text_1``/``text_2`` score, ``query`` with
``documents`` rerank), ``status`` (default 200), ``request_id``, ``session_id`` (else the body's
``user``) are optional. Prompts are hashed exactly as by ``replayer record``:
token-id prompts as they are, text with ``--tokenizer`` or an upstream's ``/tokenize``
(``--tokenize-url``). The log itself is only read; nothing of its text reaches the output.

A row that cannot be replayed (nothing to hash, a length unknown, an error status) is kept, as
``replayer record`` keeps it, and counted under its reason (``NOT_REPLAYABLE``); a log with no
replayable row writes no trace and exits 2.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from replayer.capture.blocks import BlockHasher, content_hash
from replayer.capture.rows import CAPTURED, GENERATION, SCHEMA, fit_hash_ids, request_facts
from replayer.trace.model import CAPTURE_META, MAX_PROBLEMS

_UNITS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}

#: the body field each endpoint reads its prompt from (the endpoint is inferred from it too)
PROMPT_FIELD = {
    "/v1/chat/completions": "messages",
    "/v1/completions": "prompt",
    "/v1/embeddings": "input",
    "/v1/score": "text_1 and text_2",
    "/v1/rerank": "query and documents",
}

#: why a row cannot be replayed (a row counts under the first that applies)
NOT_REPLAYABLE = {
    "error_status": "the request failed (status >= 400)",
    "no_prompt": "the body has no prompt where its endpoint reads one (chat: messages, completions: prompt, "
    "embeddings: input; check --endpoint and the lines' endpoint)",
    "no_tokenizer": "a text prompt, and neither --tokenizer nor --tokenize-url to hash it",
    "tokenize_url_failed": "--tokenize-url returned no tokens (unreachable, or an error)",
    "empty_text": "nothing to tokenize (an empty prompt, or images only)",
    "no_input_length": "input length 0",
    "no_output_length": "no usage.completion_tokens: the output length is unknown",
    "no_output": "no output token came back (completion_tokens 0)",
}


def infer_endpoint(body: dict) -> str | None:
    """The endpoint a request body was sent to, read from its shape; None when it says nothing."""
    if "messages" in body:
        return "/v1/chat/completions"
    if "prompt" in body:
        return "/v1/completions"
    if "input" in body:
        return "/v1/embeddings"
    if "text_1" in body or "text_2" in body:
        return "/v1/score"
    if "query" in body and "documents" in body:
        return "/v1/rerank"
    return None


class LogError(ValueError):
    """Problems of a log, one per line: ``FILE: line N: FIELD: message``."""

    def __init__(self, problems: list[str], more: int = 0) -> None:
        self.problems = problems
        super().__init__("\n".join(problems + ([f"... and {more} more problems"] if more else [])))


def _timestamp_ns(v, unit: str) -> int:
    if isinstance(v, bool):
        raise ValueError("a number or an ISO-8601 string expected, got a boolean")
    if isinstance(v, (int, float)):
        if v != v or v in (float("inf"), float("-inf")) or v < 0:
            raise ValueError(f"must be a finite number >= 0, got {v}")
        return int(round(v * _UNITS[unit]))
    if isinstance(v, str):
        try:
            t = _dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"not an ISO-8601 date-time: {v[:40]!r}") from None
        if t.tzinfo is None:
            t = t.replace(tzinfo=_dt.timezone.utc)
        return int(t.timestamp() * 1_000_000_000)
    raise ValueError(f"a number or an ISO-8601 string expected, got {type(v).__name__}")


def _tokenize_remote(url: str, body: dict) -> list[int] | None:
    req = urllib.request.Request(url, data=orjson.dumps(body), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            tokens = orjson.loads(r.read()).get("tokens")
    except (OSError, urllib.error.URLError, orjson.JSONDecodeError, AttributeError):
        return None
    return tokens if type(tokens) is list and tokens and all(type(t) is int for t in tokens) else None


def rows_from_log(
    path: str,
    *,
    block_size: int = 512,
    key: bytes,
    tokenizer=None,
    tokenize_url: str | None = None,
    time_unit: str = "s",
    endpoint: str | None = None,
) -> tuple[list[dict], dict]:
    """The capture rows of a log (in file order) and counts (``rows``, ``replayable``,
    ``tokenize_failures``, ``not_replayable``: a count per ``NOT_REPLAYABLE`` reason). ``endpoint``:
    that of lines without one (None: inferred from each body). Raises LogError listing every bad
    line (at most ``MAX_PROBLEMS``), OSError when unreadable."""
    hasher = BlockHasher(key, block_size)
    problems: list[str] = []
    n_problems = 0
    rows: list[dict] = []
    failures = 0
    why: Counter[str] = Counter()
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj, ep, ts, status, usage = _parse_line(raw, time_unit, endpoint)
            except _BadLine as e:
                n_problems += 1
                if len(problems) < MAX_PROBLEMS:
                    problems.append(f"{path}: line {line_no}: {e.field}: {e}")
                continue
            body = obj["request"]
            facts = request_facts(ep, orjson.dumps(body), obj.get("session_id"), lambda d: content_hash(key, d))
            row = _row(obj, ep, ts, status, usage, facts)
            failed = _hash(row, facts, body, ep, hasher, tokenizer, tokenize_url)
            if row["tokenized_by"] in ("none", "failed"):
                failures += 1
            reason = _not_replayable(row, failed)
            if reason:
                why[reason] += 1
            rows.append(row)
    if n_problems:
        raise LogError(problems, n_problems - len(problems))
    return rows, {
        "rows": len(rows),
        "replayable": len(rows) - sum(why.values()),
        "tokenize_failures": failures,
        "not_replayable": {k: why[k] for k in NOT_REPLAYABLE if why[k]},
        "distinct_blocks": hasher.distinct_blocks,
    }


class _BadLine(ValueError):
    """A line that cannot be a row: the field at fault, and why (the message)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _parse_line(raw: bytes, time_unit: str, endpoint: str | None) -> tuple[dict, str, int, int, dict | None]:
    """One log line -> (its object, endpoint, timestamp ns, status, usage or None). Raises
    _BadLine naming the field at fault."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise _BadLine("line", f"not valid JSON ({e})") from None
    if type(obj) is not dict:
        raise _BadLine("line", "not a JSON object")
    if "timestamp" not in obj:
        raise _BadLine("timestamp", "missing")
    try:
        ts = _timestamp_ns(obj["timestamp"], time_unit)
    except ValueError as e:
        raise _BadLine("timestamp", str(e)) from None
    body = obj.get("request")
    if type(body) is not dict:
        raise _BadLine("request", "missing or not a JSON object (the request body)")
    ep = obj.get("endpoint", endpoint or infer_endpoint(body))
    if ep is None:
        raise _BadLine(
            "endpoint", "missing, and the body has none of messages, prompt, input, text_1, query (pass --endpoint)"
        )
    if ep not in CAPTURED:
        raise _BadLine("endpoint", f"{ep!r} is not one of {', '.join(CAPTURED)}")
    resp = obj.get("response")
    usage = obj.get("usage", resp.get("usage") if type(resp) is dict else None)
    if usage is not None and type(usage) is not dict:
        raise _BadLine("usage", "not a JSON object")
    status = obj.get("status", 200)
    if type(status) is not int:
        raise _BadLine("status", f"an integer expected, got {status!r}")
    return obj, ep, ts, status, usage


def _row(obj: dict, ep: str, ts: int, status: int, usage: dict | None, facts) -> dict:
    """The capture row of a line, before its prompt is tokenized and hashed (``_hash``)."""
    usage = usage or {}
    il = usage.get("prompt_tokens") if type(usage.get("prompt_tokens")) is int else None
    ol = usage.get("completion_tokens") if type(usage.get("completion_tokens")) is int else None
    if ep not in GENERATION:
        ol = 1 if status < 400 else 0
    return {
        "timestamp": ts,
        "input_length": il,
        "output_length": ol,
        "hash_ids": None,
        "request_id": None if obj.get("request_id") is None else str(obj["request_id"]),
        "session_id": None if facts.session_id is None else str(facts.session_id),
        "endpoint": ep,
        "model": facts.model,
        "max_tokens": facts.max_tokens,
        "status": status,
        "outcome": "ok" if status < 400 else "http_error",
        "input_length_source": "usage" if il is not None else None,
        "output_length_source": ("usage" if ep in GENERATION else "pooling") if ol is not None else None,
        "tokenized_by": None,
        "hashed_tokens": None,
        "image_count": len(facts.images) if ep == "/v1/chat/completions" else None,
        "image_hashes": facts.images or None,
        "duration_ms": None,
    }


def _hash(row: dict, facts, body: dict, ep: str, hasher: BlockHasher, tokenizer, tokenize_url: str | None) -> str:
    """The row's prompt tokenized (the request's own ids, the upstream's ``/tokenize``, or the
    local tokenizer) and hashed into its ``hash_ids``; returns why it could not be when it could
    not (``_not_replayable``'s ``failed``)."""
    tokens: Sequence[int] | None = None
    by = "none"
    failed = "no_prompt" if facts.token_ids is None and facts.tokenize_body is None else "no_tokenizer"
    if facts.token_ids is not None:
        tokens, by = facts.token_ids, "request"
    elif facts.tokenize_body is not None and tokenize_url:
        tokens, by = _tokenize_remote(tokenize_url, facts.tokenize_body), "upstream"
        failed = "tokenize_url_failed"
    if tokens is None and tokenizer is not None and failed != "no_prompt":
        text = facts.text
        if text is None and ep == "/v1/chat/completions":  # message contents (no chat template)
            text = "\n".join(_contents(body.get("messages")))
        if text:
            tokens, by = list(tokenizer.encode(text).ids), "tokenizer"
        else:
            failed = "empty_text"
    if tokens is None:
        row["tokenized_by"] = "none" if by == "none" else "failed"
        return failed
    row.update(tokenized_by=by, hashed_tokens=len(tokens))
    if row["input_length"] is None:
        row.update(input_length=len(tokens), input_length_source="tokens")
    if row["input_length"] >= 1:
        row["hash_ids"] = fit_hash_ids(hasher.hash_ids(tokens), row["input_length"], hasher.block_size, hasher.fresh_id)
    return failed


def _not_replayable(row: dict, failed: str) -> str | None:
    """Why the trace reader will leave ``row`` out (a ``NOT_REPLAYABLE`` key), or None."""
    if row["status"] >= 400:
        return "error_status"
    if row["hash_ids"] is None:
        return failed if row["hashed_tokens"] is None else "no_input_length"
    if row["output_length"] is None:
        return "no_output_length"
    if row["output_length"] < 1:
        return "no_output"
    return None


def _contents(msgs) -> list[str]:
    out = []
    for m in msgs if type(msgs) is list else []:
        c = m.get("content") if type(m) is dict else None
        if type(c) is str:
            out.append(c)
        elif type(c) is list:
            out += [p["text"] for p in c if type(p) is dict and type(p.get("text")) is str]
    return out


def write_rows(rows: list[dict], out: str, *, block_size: int, source: str) -> None:
    """Rows sorted by timestamp into one Parquet file with the capture metadata."""
    from replayer.record.recorder import atomic_file

    meta = {
        CAPTURE_META: "1",
        "replayer.block_size": str(block_size),
        "replayer.time_unit": "ns",
        "replayer.source": source,
    }
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    table = table.take(pc.sort_indices(table, sort_keys=[("timestamp", "ascending")]))
    table = table.replace_schema_metadata({k.encode(): v.encode() for k, v in meta.items()})
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    with atomic_file(out) as f:
        f.write(sink.getvalue())


def main_from_log(args) -> int:
    import sys

    from replayer.capture.blocks import HashKeyError, load_key
    from replayer.capture.record import StartError, _load_tokenizer

    try:
        if not args.output.endswith(".parquet"):
            raise StartError(f"-o {args.output}: the output must be a .parquet file")
        tokenizer = _load_tokenizer(args.tokenizer) if args.tokenizer else None
        key = load_key(args.hash_key_file)
        rows, counts = rows_from_log(
            args.log,
            block_size=args.block_size,
            key=key,
            tokenizer=tokenizer,
            tokenize_url=args.tokenize_url,
            time_unit=args.time_unit,
            endpoint=args.endpoint,
        )
    except (StartError, HashKeyError, LogError) as e:
        print(f"replayer trace from-log: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"replayer trace from-log: {args.log}: cannot read: {e.strerror or e}", file=sys.stderr)
        return 2
    if not rows:
        print(f"replayer trace from-log: {args.log}: no requests", file=sys.stderr)
        return 2
    skipped = counts["not_replayable"]
    if skipped:
        lines = [f"  {n:,} {NOT_REPLAYABLE[k]}" for k, n in skipped.items()]
        head = f"{sum(skipped.values()):,} of {len(rows):,} rows cannot be replayed"
        if not counts["replayable"]:
            print(f"replayer trace from-log: {args.log}: no row can be replayed, no trace written:", file=sys.stderr)
            print("\n".join(lines), file=sys.stderr)
            return 2
        print(f"replayer trace from-log: {head} (kept, as replayer record keeps them):", file=sys.stderr)
        print("\n".join(lines), file=sys.stderr)
    write_rows(
        rows, args.output, block_size=args.block_size, source=f"replayer trace from-log {os.path.basename(args.log)}"
    )
    print(json.dumps({"output": args.output, **counts}))
    return 0
