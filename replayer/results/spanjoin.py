"""The join of replayer's spans with the server's (``replayer report --spans FILE``): where each
request's time went, client TTFT split into network and front end, queue, prefill, and E2E
into decode, per request and as distributions.

The file is OTLP JSON lines as the OpenTelemetry Collector's file exporter writes them: one
``ExportTraceServiceRequest`` per line (``{"resourceSpans": [{"scopeSpans": [{"spans":
[...]}]}]}``), ids in hex (the Collector's form) or base64 (protobuf's JSON mapping), 64-bit
integers as strings or numbers; or one span per line (an OTLP span object, or the SDKs'
``to_json`` shape, as some receivers write them). A file with no span in any of these shapes is
an error, not an empty join. A request is replayer's CLIENT span (it carries
``replayer.row``); its server span is the SERVER span whose parent is that span (vLLM's
``llm_request``, or the simulator's), read with vLLM's attribute names, in seconds:

- ``ttft_s``: the client's TTFT (``replayer.ttft_ms``);
- ``network_front_end_s``: client TTFT − server TTFT (``gen_ai.latency.time_to_first_token``,
  which vLLM measures from the request's arrival): the network, the HTTP server, the tokenizer;
- ``queue_s``: ``gen_ai.latency.time_in_queue``; ``prefill_s``: ``time_in_model_prefill``;
- ``server_other_s``: server TTFT − queue − prefill (the engine's own steps before scheduling);
- ``decode_s``: ``time_in_model_decode``; ``e2e_s``: the client's E2E; ``e2e_network_s``:
  client E2E − server E2E (``gen_ai.latency.e2e``).

Unknown is not zero: a part whose inputs are missing is None, left out of the distributions. A
CLIENT span without a server span is listed (``missing``): a request the server never traced
(not sampled there, or lost on the way).
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["PARTS", "SpanSplit", "SpansError", "compare_rows", "read_spans", "split_spans", "split_text"]

CLIENT_KINDS = (3, "SPAN_KIND_CLIENT")
SERVER_KINDS = (2, "SPAN_KIND_SERVER")
#: the split's parts (seconds), in the order they happen
PARTS = (
    "network_front_end_s",
    "queue_s",
    "server_other_s",
    "prefill_s",
    "decode_s",
    "e2e_network_s",
)


class SpansError(ValueError):
    """A spans file that cannot be read: the file and line named."""


@dataclass(slots=True)
class Span:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: object
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)


def _id(v: object) -> str:
    """An id as lowercase hex: the Collector writes hex, protobuf's JSON mapping base64."""
    if not v or not isinstance(v, str):
        return ""
    low = v.lower()
    if len(v) in (16, 32) and all(c in "0123456789abcdef" for c in low):
        return low
    return base64.b64decode(v).hex()


def _value(v: dict) -> Any:
    for k in ("stringValue", "boolValue", "doubleValue"):
        if k in v:
            return v[k]
    if "intValue" in v:
        return int(v["intValue"])
    if "arrayValue" in v:
        return tuple(_value(x) for x in v["arrayValue"].get("values", ()))
    return None


def _otlp_span(s: dict) -> Span:
    """One span in OTLP JSON (the Collector's, or one object per line in the same shape)."""
    attrs = s.get("attributes") or ()
    return Span(
        trace_id=_id(s.get("traceId")),
        span_id=_id(s.get("spanId")),
        parent_span_id=_id(s.get("parentSpanId")),
        name=str(s.get("name", "")),
        kind=s.get("kind"),
        start_ns=int(s.get("startTimeUnixNano", 0)),
        end_ns=int(s.get("endTimeUnixNano", 0)),
        attributes=dict(attrs) if isinstance(attrs, dict) else {a["key"]: _value(a.get("value", {})) for a in attrs},
    )


#: the OpenTelemetry SDKs' span kinds as their ``to_json`` writes them
_SDK_KINDS = {"SpanKind.CLIENT": 3, "SpanKind.SERVER": 2, "SpanKind.INTERNAL": 1}


def _sdk_time_ns(v: object) -> int:
    """An SDK span's ISO-8601 time (``2026-01-02T03:04:05.123456Z``) as Unix ns."""
    if isinstance(v, (int, float)):
        return int(v)
    if not isinstance(v, str) or not v:
        return 0
    import datetime as dt

    t = dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000


def _sdk_span(s: dict) -> Span:
    """One span as an OpenTelemetry SDK writes it (``span.to_json()``: the console exporter's and
    many receivers' one-object-per-span shape): ``context.trace_id``/``span_id`` as ``0x`` hex,
    ``parent_id``, ``kind`` ``SpanKind.CLIENT``, ISO times, attributes as a plain object."""
    ctx = s.get("context") or {}
    return Span(
        trace_id=_id(str(ctx.get("trace_id") or "").removeprefix("0x")),
        span_id=_id(str(ctx.get("span_id") or "").removeprefix("0x")),
        parent_span_id=_id(str(s.get("parent_id") or "").removeprefix("0x")),
        name=str(s.get("name", "")),
        kind=_SDK_KINDS.get(str(s.get("kind")), s.get("kind")),
        start_ns=_sdk_time_ns(s.get("start_time")),
        end_ns=_sdk_time_ns(s.get("end_time")),
        attributes=dict(s.get("attributes") or {}),
    )


def _line_spans(doc: Any) -> list[Span]:
    """The spans of one line: an ``ExportTraceServiceRequest``, one OTLP span, or one SDK span."""
    if isinstance(doc, list):  # (a JSON array of spans on one line)
        return [sp for d in doc for sp in _line_spans(d)]
    if not isinstance(doc, dict):
        return []
    if "resourceSpans" in doc:
        return [
            _otlp_span(s) for rs in doc["resourceSpans"] for ss in rs.get("scopeSpans", ()) for s in ss.get("spans", ())
        ]
    if "spanId" in doc and "traceId" in doc:
        return [_otlp_span(doc)]
    if isinstance(doc.get("context"), dict) and "span_id" in doc["context"]:
        return [_sdk_span(doc)]
    return []


def read_spans(path: str) -> list[Span]:
    """Every span of a spans file, one JSON document per line: the OpenTelemetry Collector's
    file exporter (``resourceSpans``), or one span per line (OTLP JSON's span object, or an
    SDK's ``to_json`` shape). Raises SpansError naming the line of a bad one, or saying the file
    holds no span at all (a file of some other shape is not read as "0 requests traced")."""
    out: list[Span] = []
    lines = 0
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            lines += 1
            try:
                out.extend(_line_spans(orjson.loads(line)))
            except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as e:
                raise SpansError(
                    f"{path}: line {n}: not an OTLP JSON ExportTraceServiceRequest or span ({e})"
                ) from None
    if lines and not out:
        raise SpansError(
            f"{path}: holds no OTLP spans ({lines} line(s), none an ExportTraceServiceRequest with resourceSpans, "
            "an OTLP span with traceId/spanId, or an SDK span with context.span_id)"
        )
    return out


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def _minus(a: float | None, *b: float | None) -> float | None:
    if a is None:
        return None
    for x in b:
        if x is None:
            return None
        a -= x
    return a


@dataclass(slots=True)
class SpanSplit:
    """The join: ``rows`` one dict per request (CLIENT span) with its split, ``missing`` the
    requests whose server span is not in the file, ``t0_ns`` the first request's send time."""

    rows: list[dict[str, Any]]
    missing: list[dict[str, Any]]
    t0_ns: int | None

    def distributions(self) -> dict[str, dict[str, float | int]]:
        """Per part (``ttft_s`` and ``e2e_s`` too): count, mean, p50, p90, p99, max over the
        requests where it is known (nearest rank)."""
        out: dict[str, dict[str, float | int]] = {}
        for part in ("ttft_s", *PARTS[:4], "e2e_s", *PARTS[4:]):
            vals = sorted(v for r in self.rows if (v := r.get(part)) is not None)
            if not vals:
                continue
            n = len(vals)

            def rank(p: float, vals: list[float] = vals, n: int = n) -> float:
                return vals[max(0, math.ceil(p / 100 * n) - 1)]

            out[part] = {
                "count": n,
                "mean": sum(vals) / n,
                "p50": rank(50),
                "p90": rank(90),
                "p99": rank(99),
                "max": vals[-1],
            }
        return out

    def over_time(self, bins: int = 40) -> dict[str, Any]:
        """The mean of each TTFT part per send-time bin: ``{"x": bin starts (s since the first
        send), part: [mean or None per bin]}`` over the requests with a server span."""
        joined = [r for r in self.rows if r.get("server")]
        if not joined or self.t0_ns is None:
            return {"x": []}
        span_s = max(r["sent_s"] for r in joined) or 1.0
        width = span_s / bins
        acc: dict[str, list[list[float]]] = {p: [[] for _ in range(bins)] for p in PARTS[:4]}
        for r in joined:
            i = min(bins - 1, int(r["sent_s"] / width))
            for p in PARTS[:4]:
                if r.get(p) is not None:
                    acc[p][i].append(r[p])
        out: dict[str, Any] = {"x": [i * width for i in range(bins)]}
        for p, cells in acc.items():
            out[p] = [sum(c) / len(c) if c else None for c in cells]
        return out


def split_spans(spans: list[Span], run_id: str | None = None) -> SpanSplit:
    """Join each CLIENT span (replayer's) with the SERVER span that is its child; with
    ``run_id``, only that run's requests (a collector's file holds every run it received)."""
    server_by_parent: dict[str, Span] = {}
    for s in spans:
        if s.kind in SERVER_KINDS and s.parent_span_id:
            server_by_parent.setdefault(s.parent_span_id, s)
    clients = [
        s
        for s in spans
        if s.kind in CLIENT_KINDS
        and "replayer.row" in s.attributes
        and (run_id is None or s.attributes.get("replayer.run_id") == run_id)
    ]
    clients.sort(key=lambda s: s.start_ns)
    t0 = clients[0].start_ns if clients else None
    rows: list[dict[str, Any]] = []
    missing: list[dict[str, Any]] = []
    for c in clients:
        a = c.attributes
        ttft_ms, e2e_ms = _num(a.get("replayer.ttft_ms")), _num(a.get("replayer.e2e_ms"))
        row: dict[str, Any] = {
            "row": a.get("replayer.row"),
            "loop": a.get("replayer.loop", 0),
            "x_request_id": a.get("replayer.x_request_id"),
            "span_id": c.span_id,
            "sent_s": (c.start_ns - t0) / 1e9 if t0 is not None else None,
            "outcome": a.get("replayer.outcome"),
            "ttft_s": None if ttft_ms is None else ttft_ms / 1e3,
            "e2e_s": None if e2e_ms is None else e2e_ms / 1e3,
        }
        sv = server_by_parent.get(c.span_id)
        row["server"] = sv is not None
        if sv is None:
            missing.append({k: row[k] for k in ("row", "loop", "x_request_id", "span_id", "outcome")})
            row.update(dict.fromkeys(PARTS))
            rows.append(row)
            continue
        b = sv.attributes
        s_ttft = _num(b.get("gen_ai.latency.time_to_first_token"))
        queue = _num(b.get("gen_ai.latency.time_in_queue"))
        prefill = _num(b.get("gen_ai.latency.time_in_model_prefill"))
        row.update(
            {
                "server_ttft_s": s_ttft,
                "server_e2e_s": _num(b.get("gen_ai.latency.e2e")),
                "network_front_end_s": _minus(row["ttft_s"], s_ttft),
                "queue_s": queue,
                "server_other_s": _minus(s_ttft, queue, prefill),
                "prefill_s": prefill,
                "decode_s": _num(b.get("gen_ai.latency.time_in_model_decode")),
                "e2e_network_s": _minus(row["e2e_s"], _num(b.get("gen_ai.latency.e2e"))),
                "server_prompt_tokens": b.get("gen_ai.usage.prompt_tokens"),
            }
        )
        rows.append(row)
    return SpanSplit(rows, missing, t0)


def split_text(split: SpanSplit) -> str:
    """The split's distributions as the lines ``replayer report --spans`` prints (ms)."""
    lines = [
        f"spans: {len(split.rows):,} requests traced, {len(split.rows) - len(split.missing):,} joined with "
        f"their server span, {len(split.missing):,} without one",
        f"{'part':<22}{'count':>8}{'mean ms':>12}{'p50 ms':>12}{'p90 ms':>12}{'p99 ms':>12}",
    ]
    for part, d in split.distributions().items():
        lines.append(
            f"{part:<22}{d['count']:>8,}" + "".join(f"{d[k] * 1e3:>12.3f}" for k in ("mean", "p50", "p90", "p99"))
        )
    return "\n".join(lines)


def compare_rows(a: SpanSplit, b: SpanSplit) -> list[dict[str, Any]]:
    """``replayer compare --spans``: the split's p50 and p99 (ms) of run A and run B, and the
    requests without a server span, as ``replayer.results.compare``'s rows (lower is better)."""
    da, db = a.distributions(), b.distributions()
    rows: list[dict[str, Any]] = []

    def row(key: str, label: str, va: float | int | None, vb: float | int | None) -> None:
        diff = None if va is None or vb is None else vb - va
        pct = 100.0 * diff / abs(va) if diff is not None and va else None
        better = "" if not diff else ("b" if diff < 0 else "a")
        rows.append({"key": key, "label": label, "a": va, "b": vb, "diff": diff, "pct": pct, "better": better})

    for part in ("ttft_s", *PARTS):
        if part not in da and part not in db:
            continue
        for q in ("p50", "p99"):
            va = da[part][q] * 1e3 if part in da else None
            vb = db[part][q] * 1e3 if part in db else None
            row(f"spans.{part}.{q}", f"spans: {part.removesuffix('_s')} {q} (ms)", va, vb)
    row("spans.missing", "spans: requests without a server span", len(a.missing), len(b.missing))
    return rows
