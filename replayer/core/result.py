"""The per-request record (``RequestResult``) and its Parquet schema.

One ``RequestResult`` per scheduled trace row, whatever happened to it. Times are integer
nanoseconds on the one monotonic clock (``replayer.core.clock``), as offsets from the run's anchor
``t0_ns`` (the results file's metadata holds the anchor's wall-clock time). Durations derived
from them are float milliseconds, the unit `vllm bench serve` reports. ``None`` means
"not measured" and is never replaced by 0 (docs/metrics.md has the definitions).
"""

from __future__ import annotations

import array
import operator
from dataclasses import Field, dataclass, field, fields
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: The two groups of a result's fields. ``BIRTH``: copied once from the request when its record
#: is made (``PreparedRequest.new_result``, ``RequestFactory.unsent``) and never assigned after.
#: ``MEASURED``: what happened to it, assigned afterwards by the packages its ``by`` names
#: (``tests/test_result_columns.py`` checks every assignment in ``replayer/`` against it).
BIRTH = "birth"
MEASURED = "measured"


def _birth(arrow: pa.DataType, doc: str, default: object = None) -> Any:
    return field(default=default, metadata={"group": BIRTH, "arrow": arrow, "doc": doc, "by": ()})


def _measured(arrow: pa.DataType, doc: str, default: object = None, by: tuple[str, ...] = ("http",)) -> Any:
    return field(default=default, metadata={"group": MEASURED, "arrow": arrow, "doc": doc, "by": by})


@dataclass(slots=True)
class RequestResult:
    """What happened to one scheduled request: one field per results column, each declaring its
    Arrow type, its group (``BIRTH`` or ``MEASURED``), the packages that may assign it and what
    it holds (the results reference in docs/reference/results.md is generated from these).

    Times (``*_ns``): ns since the run anchor ``t0_ns``; ``None`` when the moment never came.
    ``prompt_tokens``/``completion_tokens``: from the server's ``usage`` (``None`` if none arrived:
    then ``tpot_ms`` is None and ``itl_ms`` empty, since both need the output token count).
    ``itl_ms``: token-weighted inter-token latencies (a gap ending in an event that carries k
    tokens adds k samples of gap/k), so mean(itl_ms) == tpot_ms when token counts are known.
    ``output_tokens_estimate``: the tokens counted per event, only for a response without
    ``completion_tokens`` (an estimate, never added to the server-reported totals).
    """

    row: int = field(
        metadata={"group": BIRTH, "arrow": pa.int64(), "doc": "row index in the (sorted) trace, 0-based", "by": ()}
    )
    loop: int = _birth(pa.int32(), "the pass over the trace (`--loop`), 0-based", 0)
    shard: int = _birth(pa.int32(), "the shard that sent it (`--shard`, a `--workers` worker)", 0)
    request_id: str | None = _birth(
        pa.string(), "always null: the trace's own request ids are not carried (`x_request_id` names the request)"
    )
    input_length: int = _birth(pa.int64(), "prompt tokens, from the trace", 0)
    output_length: int = _birth(pa.int64(), "output tokens asked for, from the trace", 0)
    prompt_len_sent: int = _birth(
        pa.int64(), "prompt token ids actually sent (`input_length` unless text prompts; 0 when not sent)", 0
    )
    max_tokens: int = _birth(pa.int64(), "`max_tokens` as sent (0 when not sent)", 0)
    due_ns: int = _birth(pa.int64(), "when it was due, from the schedule", 0)
    sent_ns: int | None = _measured(
        pa.int64(),
        "just before the request was written (or, when no connection could be opened, when that attempt began)",
    )
    first_token_ns: int | None = _measured(pa.int64(), "the first token-carrying event arrived")
    last_token_ns: int | None = _measured(pa.int64(), "the last token-carrying event arrived")
    end_ns: int | None = _measured(pa.int64(), "the response ended (stream closed, body done, or the failure)")
    outcome: str = _measured(
        pa.string(),
        "`ok`, `failed`, `cancelled`, `not_started`, `missed_while_down` (`replayer.core.errors.Outcome`)",
        "not_started",
        ("http", "send"),
    )
    error_kind: str = _measured(
        pa.string(),
        "`none` or why it failed (`replayer.core.errors.ErrorKind`: `http_4xx`, `timeout`, `connect`, ...)",
        "none",
        ("http", "send"),
    )
    http_status: int | None = _measured(pa.int32(), "the response's HTTP status")
    error: str | None = _measured(
        pa.string(),
        "the failure's message (the server's error text or the exception), truncated",
        None,
        ("http", "send"),
    )
    prompt_tokens: int | None = _measured(pa.int64(), "`usage.prompt_tokens` as the server reported it")
    completion_tokens: int | None = _measured(
        pa.int64(),
        "`usage.completion_tokens` as the server reported it (null for a failed request: see `partial_output_tokens`)",
    )
    usage_source: str = _measured(pa.string(), "`server` (a usage object arrived) or `none`", "none")
    n_chunks: int = _measured(pa.int32(), "choice events received", 0)
    output_tokens_estimate: int | None = _measured(
        pa.int64(), "without usage: the events that carried text (an estimate, never in the totals)"
    )
    invalid_utf8: int = _measured(pa.int32(), "invalid UTF-8 sequences in the response, decoded as U+FFFD", 0)
    finish_reason: str | None = _measured(pa.string(), "the last choice's `finish_reason`")
    ttft_ms: float | None = _measured(pa.float64(), "time to first token, from `sent_ns`")
    e2e_ms: float | None = _measured(
        pa.float64(), "end-to-end latency, from `sent_ns` to the last token (a whole body: its arrival)"
    )
    tpot_ms: float | None = _measured(
        pa.float64(), "time per output token after the first: (last - first token) / (completion tokens - 1)"
    )
    decode_tpot_ms: float | None = _measured(
        pa.float64(),
        "time per output token after the first chunk: (last - first token) / (completion tokens - the first "
        "chunk's tokens); null where that count is unknown (counted in the summary's `decode_tpot_unknown`)",
    )
    dispatch_lag_ms: float | None = _measured(
        pa.float64(),
        "dispatched - due (positive: late); dispatched is when the kernel took the request's last byte. With retries, the first send's",
    )
    connect_ms: float | None = _measured(pa.float64(), "waiting for a connection (0 when a pooled one was free)")
    send_wait_ms: float | None = _measured(
        pa.float64(),
        "the request's bytes waiting for the socket, from its first byte (`sent_ns`) to its last handed to the kernel; 0 when the socket took it whole, null when never written. Included in `dispatch_lag_ms`, not in TTFT or E2E",
    )
    expected_prefix_hit_tokens: int | None = _birth(
        pa.int64(), "prompt tokens the trace implies the server has cached (its hash ids seen before)"
    )
    retries: int = _measured(
        pa.int32(),
        "times re-sent after a retryable failure (`--retry-max`); the other columns describe the last attempt",
        0,
    )
    endpoint: str = _birth(
        pa.string(), "the API it went to (`/v1/completions`, `/v1/chat/completions`, ...)", "/v1/completions"
    )
    session_id: str | None = _birth(pa.string(), "the trace's session (multi-turn sessions)")
    turn: int | None = _birth(pa.int64(), "the turn in its session")
    session_wait_ms: float | None = _measured(
        pa.float64(),
        "held back for the previous turn (or parent) to end: release - due (the server's slowness, not ours)",
        None,
        ("send",),
    )
    queue_wait_ms: float | None = _measured(
        pa.float64(),
        "with `--max-concurrency`: waited for a free slot after it was due (0: a slot was free); null without a cap. Included in `ttft_from_due_ms` and `e2el_from_due_ms`, not in `dispatch_lag_ms`",
        None,
        ("send",),
    )
    warmup: bool = _measured(
        pa.bool_(),
        "sent during the warm-up (`--warmup-requests`, `--warmup-seconds`): left out of the summary, the verdict and the report's distributions",
        False,
        ("run",),
    )
    n_documents: int | None = _birth(pa.int32(), "pooling: inputs (embeddings) or documents (score, rerank)")
    expected_prompt_tokens_once: int | None = _birth(
        pa.int64(), "score/rerank: prompt tokens expected with the query counted once"
    )
    expected_prompt_tokens_per_document: int | None = _birth(
        pa.int64(), "score/rerank: prompt tokens expected with the query counted per document"
    )
    usage_audit: str = _measured(
        pa.string(),
        "pooling usage: `ok`, `inflated` (more than both expectations), `missing`; `n/a` for generation",
        "n/a",
    )
    partial_output_tokens: int | None = _measured(
        pa.int64(),
        "failed or cancelled after it was sent: the output tokens that arrived (never in `completion_tokens` or a total)",
    )
    ttft_from_due_ms: float | None = _measured(
        pa.float64(), "TTFT from the due time (a held session turn's: from its release)"
    )
    e2el_from_due_ms: float | None = _measured(
        pa.float64(), "E2E from the due time (a held session turn's: from its release)"
    )
    slo_met: bool | None = _measured(
        pa.bool_(),
        "with `--goodput`: whether it met every bound; null without bounds, with a bound's value unknown, or not judged",
        None,
        ("core",),
    )
    x_request_id: str | None = _birth(
        pa.string(), "the `X-Request-Id` header sent, `<run_id>-<loop>-<row>` (the join key with the server's logs)"
    )
    server_queue_time_ms: float | None = _measured(
        pa.float64(), "`--server-timings`: the server's queue time (vLLM's `metrics`)"
    )
    server_time_to_first_token_ms: float | None = _measured(
        pa.float64(), "`--server-timings`: the server's TTFT (vLLM's, from when the request is scheduled)"
    )
    server_generation_time_ms: float | None = _measured(
        pa.float64(), "`--server-timings`: the server's generation time"
    )
    client_overhead_ms: float | None = _measured(
        pa.float64(), "`ttft_ms` - (server queue + server TTFT): the network, the server's front end and this client"
    )
    tenant: str | None = _birth(pa.string(), "the trace of a mix it came from; null unmixed")
    target: str | None = _birth(pa.string(), "with several `--target`: the URL it went to; null with one")
    images: int = _birth(pa.int32(), "images sent", 0)
    image_bytes: int = _birth(pa.int64(), "their encoded bytes (before base64)", 0)
    expected_image_tokens: int | None = _birth(
        pa.int64(), "image tokens expected (the trace's `image_tokens`, else `--image-token-rule`)"
    )
    image_tokens: int | None = _measured(
        pa.int64(), "image tokens as the server reported them (`usage.prompt_tokens_details.image_tokens`)"
    )
    text_tokens: int | None = _measured(pa.int64(), "`prompt_tokens` - `image_tokens` when both are known")
    expected_image_cache_hits: int = _birth(
        pa.int32(), "its images sent before in the run (an encoder cache could hit them)", 0
    )
    max_gap_ms: float | None = _measured(
        pa.float64(),
        "the longest wait between two successive token-carrying events of the stream: the stall a mean hides "
        "(the request preempted, another request's long prefill batched in); known without usage, unlike ITL. "
        "Null for fewer than two such events or a whole (non-streamed) body",
    )
    itl_ms: list[float] = field(
        default_factory=list,
        metadata={
            "group": MEASURED,
            "arrow": pa.list_(pa.float32()),
            "doc": "inter-token latencies, token-weighted (exact form: every gap; sketch form: see `itl_counts`)",
            "by": ("http",),
        },
    )


#: columns written beside the fields: name -> (Arrow type, what it holds)
EXTRA_COLUMNS: dict[str, tuple[pa.DataType, str]] = {
    "itl_counts": (
        pa.list_(pa.int32()),
        "`--itl-format sketch`: how many gaps each `itl_ms` value stands for; null in the exact form",
    ),
}


def column_type(f: Field[Any]) -> pa.DataType:
    """A field's declared Arrow type; a field made without ``_birth``/``_measured`` has none,
    and the results files cannot have its column: said at import, naming the field."""
    if "arrow" not in f.metadata:
        raise TypeError(f"RequestResult.{f.name} declares no column: make it with _birth(...) or _measured(...)")
    t: pa.DataType = f.metadata["arrow"]
    return t


_TYPES: dict[str, pa.DataType] = {
    **{f.name: column_type(f) for f in fields(RequestResult)},
    **{name: t for name, (t, _) in EXTRA_COLUMNS.items()},
}

#: ``itl_ms`` as written: ``exact`` (every gap) or ``sketch`` (the compact form, see ``compact_itl``)
ITL_FORMATS = ("exact", "sketch")
#: the results columns: the fields of ``RequestResult``, then ``EXTRA_COLUMNS``
COLUMNS: tuple[str, ...] = tuple(_TYPES)
SCHEMA: pa.Schema = pa.schema([pa.field(name, _TYPES[name]) for name in COLUMNS])


class Rows:
    """Results gathered into Arrow record batches as they come (``add``: ~2 us per result plus
    ~20 ns per ITL sample on the caller's thread, and ~1 ms per ``batch_rows`` results when
    their batch is built; bench/bench_hotpaths.py).

    Why here and not in the recorder's writer thread: converting Python objects to Arrow holds
    the GIL, and a thread holding it makes the event loop wait the interpreter's switch interval
    (5 ms) each time the loop gives it up, so a 2,000-row conversion in the thread stalled the
    loop for ~35 ms (requests due then went out 20-40 ms late at 470 requests/s). Built in small
    batches on the loop, the writer thread only concatenates and encodes (pyarrow releases the
    GIL there). ``take()`` returns the batches so far (the last one partial) and starts afresh."""

    __slots__ = ("batch_rows", "itl_format", "_rows", "_itl", "_lens", "_batches", "n")

    def __init__(self, batch_rows: int = 128, itl_format: str = "exact") -> None:
        if itl_format not in ITL_FORMATS:
            raise ValueError(f"itl_format must be one of {', '.join(ITL_FORMATS)}, got {itl_format!r}")
        self.batch_rows = batch_rows
        self.itl_format = itl_format
        self._batches: list[pa.RecordBatch] = []
        self.n = 0  # results held
        self._reset()

    def _reset(self) -> None:
        self._rows: list[tuple[object, ...]] = []  # one tuple of the scalar fields per result
        self._itl = array.array("f")
        self._lens = array.array("i")

    def add(self, res: RequestResult) -> None:
        self._rows.append(_fields(res))
        itl = res.itl_ms
        self._itl.fromlist(itl)
        self._lens.append(len(itl))
        self.n += 1
        if len(self._rows) >= self.batch_rows:
            self._close_batch()

    def _close_batch(self) -> None:
        rows = self._rows
        if not rows:
            return
        cols = list(zip(*rows))
        arrays = [pa.array(col, type=t) for col, t in zip(cols, _SCALAR_TYPES)]
        lens = np.frombuffer(self._lens, dtype=np.int32)
        itl = np.frombuffer(self._itl, dtype=np.float32)
        counts = None
        if self.itl_format == "sketch":
            itl, counts, lens = compact_itl(itl, lens)
        offsets = np.zeros(len(rows) + 1, dtype=np.int32)
        np.cumsum(lens, out=offsets[1:])
        offsets_arr = pa.array(offsets)
        arrays.append(pa.ListArray.from_arrays(offsets_arr, pa.array(itl)))
        arrays.append(
            pa.ListArray.from_arrays(offsets_arr, pa.array(counts))
            if counts is not None
            else pa.nulls(len(rows), pa.list_(pa.int32()))
        )
        self._batches.append(pa.RecordBatch.from_arrays(arrays, schema=_SCALARS_THEN_ITL))
        self._reset()

    def take(self) -> list[pa.RecordBatch]:
        self._close_batch()
        out, self._batches, self.n = self._batches, [], 0
        return out


def batches_to_table(batches: list[pa.RecordBatch]) -> pa.Table:
    """One table in ``SCHEMA``'s column order from ``Rows.take()``'s batches."""
    return pa.Table.from_batches(batches, schema=_SCALARS_THEN_ITL).select(list(COLUMNS))


def to_table(results: list[RequestResult], itl_format: str = "exact") -> pa.Table:
    """Columnar Arrow table (schema ``SCHEMA``) from a list of results."""
    rows = Rows(batch_rows=max(1, len(results)), itl_format=itl_format)
    for r in results:
        rows.add(r)
    return batches_to_table(rows.take())


_SCALARS = tuple(name for name in COLUMNS if name not in ("itl_ms", "itl_counts"))
_SCALAR_TYPES = tuple(_TYPES[name] for name in _SCALARS)
_SCALARS_THEN_ITL = pa.schema([pa.field(name, _TYPES[name]) for name in (*_SCALARS, "itl_ms", "itl_counts")])


def compact_itl(itl: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The compact ITL form of a batch: each request's gaps (``itl``, the requests' lists one
    after the other, ``lens`` gaps each) rounded to the buckets of the summary's DDSketch
    (``stats.RELATIVE_ACCURACY``: each bucket's representative value is within 0.5 % of every
    gap in it; zero and negative gaps are kept as they are) and counted: returns (distinct
    values per request, in increasing order; how many gaps each stands for; values per request).
    A request's ITL statistics from the compact form are those of its gaps within the sketch's
    error (the count exactly), and bucketed again they fall in the same buckets, so the run's
    ITL percentiles are the same whichever form the results were written in. The size: a
    request of n tokens keeps one value and one count per occupied bucket (~1 % wide) instead of
    n values."""
    from replayer.core.stats import itl_bucket_values

    if not itl.size:
        return itl.astype(np.float32), np.zeros(0, np.int32), np.asarray(lens, np.int32)
    row = np.repeat(np.arange(lens.size, dtype=np.int64), lens)
    rep = itl_bucket_values(itl.astype(np.float64)).astype(np.float32)
    order = np.lexsort((rep, row))
    row, rep = row[order], rep[order]
    new = np.ones(row.size, dtype=bool)
    new[1:] = (row[1:] != row[:-1]) | (rep[1:] != rep[:-1])
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, row.size)).astype(np.int32)
    return rep[starts], counts, np.bincount(row[starts], minlength=lens.size).astype(np.int32)


def itl_samples(t: pa.Table | pa.RecordBatch, mask: np.ndarray | None = None) -> np.ndarray:
    """Every ITL sample (ms, float64) of the rows of ``t`` selected by ``mask`` (all: None), in
    either form: the exact lists as they are; the compact form's values each repeated as many
    times as its count (so a statistic of them counts every gap once; see ``compact_itl``)."""
    sel = pa.array(mask) if mask is not None else None
    lists = t.column("itl_ms") if sel is None else t.column("itl_ms").filter(sel)
    values: np.ndarray = pc.list_flatten(lists).to_numpy(zero_copy_only=False).astype(np.float64)
    if "itl_counts" not in t.schema.names:
        return values
    counts = t.column("itl_counts") if sel is None else t.column("itl_counts").filter(sel)
    if counts.null_count == len(counts):
        return values
    if counts.null_count == 0:
        return np.repeat(values, pc.list_flatten(counts).to_numpy(zero_copy_only=False))
    # rows of both forms in one table (results files of runs with different --itl-format)
    lens = pc.list_value_length(lists).to_numpy(zero_copy_only=False)
    weights = [np.ones(n, np.int64) if c is None else np.asarray(c, np.int64) for n, c in zip(lens, counts.to_pylist())]
    return np.repeat(values, np.concatenate(weights) if weights else np.zeros(0, np.int64))


def without_warmup(t: pa.Table) -> pa.Table:
    """The rows of ``t`` that are not warm-up (``warmup`` true: ``--warmup-requests``,
    ``--warmup-seconds``), the rows every statistic of a run is computed from; ``t`` itself when
    it has no warm-up row (or no ``warmup`` column: files written before it existed)."""
    if "warmup" not in t.column_names:
        return t
    warm = pc.fill_null(t.column("warmup"), False)
    return t.filter(pc.invert(warm)) if pc.any(warm).as_py() else t


_fields = operator.attrgetter(*_SCALARS)
