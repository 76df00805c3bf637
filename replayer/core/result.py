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
from dataclasses import dataclass, field, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(slots=True)
class RequestResult:
    """What happened to one scheduled request.

    Times (``*_ns``): ns since the run anchor ``t0_ns``; ``None`` when the moment never came.
    ``prompt_tokens``/``completion_tokens``: from the server's ``usage`` (``None`` if none arrived:
    then ``tpot_ms`` is None and ``itl_ms`` empty, since both need the output token count).
    ``itl_ms``: token-weighted inter-token latencies (a gap ending in an event that carries k
    tokens adds k samples of gap/k), so mean(itl_ms) == tpot_ms when token counts are known.
    ``output_tokens_estimate``: the tokens counted per event, only for a response without
    ``completion_tokens`` (an estimate, never added to the server-reported totals).
    """

    row: int  # row index in the (sorted) trace, 0-based
    loop: int = 0
    shard: int = 0
    request_id: str | None = None
    input_length: int = 0  # from the trace
    output_length: int = 0  # from the trace
    prompt_len_sent: int = 0  # token ids actually sent (== input_length unless text mode)
    max_tokens: int = 0  # as sent
    due_ns: int = 0
    sent_ns: int | None = None  # just before the request was written (or, when no connection
    #                                could be opened, when that attempt began: it was issued)
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    end_ns: int | None = None  # stream closed / response done
    outcome: str = "not_started"  # replayer.core.errors.Outcome value
    error_kind: str = "none"  # replayer.core.errors.ErrorKind value
    http_status: int | None = None
    error: str | None = None  # message (server's error text or exception), truncated
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    usage_source: str = "none"  # "server" (usage object seen) or "none"
    n_chunks: int = 0  # choice events received
    output_tokens_estimate: int | None = None  # no usage: events with text (an estimate, see above)
    invalid_utf8: int = 0  # invalid UTF-8 sequences in the response, decoded as U+FFFD
    finish_reason: str | None = None
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    tpot_ms: float | None = None
    decode_tpot_ms: float | None = None  # (last - first) / (N - first chunk's tokens); None: that count unknown
    dispatch_lag_ms: float | None = None  # dispatched - due (positive = late); dispatched = the kernel took
    #                                       the request's last byte (sent_ns when the socket took it whole)
    connect_ms: float | None = None  # waiting for a connection (0 when a pooled one was free)
    send_wait_ms: float | None = None  # the socket's buffer full (a link slower than the bytes): from the first
    #                                    byte to the last handed to the kernel; 0 when the socket took the request
    #                                    whole, None when it was never written (the first send's, as dispatch_lag_ms)
    expected_prefix_hit_tokens: int | None = None  # prompt tokens the trace implies are cached (prefix_cache)
    retries: int = 0  # times re-sent after a retryable failure (client retry policy); the
    # other fields describe the last attempt, dispatch_lag_ms the first send
    endpoint: str = "/v1/completions"  # the API the request went to (replayer.payload.body endpoint kinds)
    session_id: str | None = None  # from the trace (multi-turn sessions)
    turn: int | None = None
    session_wait_ms: float | None = None  # held back for the previous turn (or parent) to end: release - due
    #                                       (the server's slowness, not ours; dispatch_lag_ms is from release)
    queue_wait_ms: float | None = None  # --max-concurrency: waited for a free slot, from the time it was due (or
    #                                     released) to the slot's release; None without a cap. Included in the
    #                                     latencies from the due time; dispatch_lag_ms excludes it
    warmup: bool = False  # sent during the warm-up (--warmup-requests, --warmup-seconds): out of the summary
    n_documents: int | None = None  # pooling: inputs (embeddings) or documents (score, rerank)
    expected_prompt_tokens_once: int | None = None  # score/rerank: query once + documents
    expected_prompt_tokens_per_document: int | None = None  # score/rerank: query per document + documents
    usage_audit: str = "n/a"  # pooling usage: ok, inflated (server reported more than both
    #                                expectations), missing; n/a for generation (see prompt_tokens)
    partial_output_tokens: int | None = None  # failed or cancelled after it was sent: output tokens that
    #                                arrived (the server's running usage when usage_source is "server", else one
    #                                per token-carrying event); never in completion_tokens or any total
    # the verdict (replayer.results.verdict): latency from the due time (a held session turn's from its
    # release; the hold is session_wait_ms) and, with --goodput bounds, whether the SLO was met
    ttft_from_due_ms: float | None = None
    e2el_from_due_ms: float | None = None
    slo_met: bool | None = None  # None: no bounds, a bound's value unknown, or not judged
    x_request_id: str | None = None  # the X-Request-Id header sent: <run_id>-<loop>-<row> (join key with the
    #                                  server's logs; vLLM takes it as its request id)
    # --server-timings: the server's own per-request timings (vLLM's `metrics` object; None when off or not
    # reported). vLLM's time_to_first_token_ms starts when the request is scheduled (after its queue time)
    server_queue_time_ms: float | None = None
    server_time_to_first_token_ms: float | None = None
    server_generation_time_ms: float | None = None
    client_overhead_ms: float | None = None  # ttft_ms - (server queue + server TTFT): network, the server's
    #                                          HTTP/tokenizer front end and this client (never below 0 in theory)
    tenant: str | None = None  # the trace of a mix this row came from (replayer.trace.mix); None unmixed
    target: str | None = None  # with several --target: the URL it went to (replayer.send.routing); None with one
    # multimodal rows: images sent and their encoded bytes; image tokens expected (the trace's
    # image_tokens or --image-token-rule) and as the server reported them
    # (usage.prompt_tokens_details.image_tokens); text_tokens = prompt_tokens - image_tokens when both are known
    images: int = 0
    image_bytes: int = 0
    expected_image_tokens: int | None = None
    image_tokens: int | None = None
    text_tokens: int | None = None
    expected_image_cache_hits: int = 0  # images of this request sent before in the run
    itl_ms: list[float] = field(default_factory=list)


_TYPES: dict[str, pa.DataType] = {
    "row": pa.int64(),
    "loop": pa.int32(),
    "shard": pa.int32(),
    "request_id": pa.string(),
    "input_length": pa.int64(),
    "output_length": pa.int64(),
    "prompt_len_sent": pa.int64(),
    "max_tokens": pa.int64(),
    "due_ns": pa.int64(),
    "sent_ns": pa.int64(),
    "first_token_ns": pa.int64(),
    "last_token_ns": pa.int64(),
    "end_ns": pa.int64(),
    "outcome": pa.string(),
    "error_kind": pa.string(),
    "http_status": pa.int32(),
    "error": pa.string(),
    "prompt_tokens": pa.int64(),
    "completion_tokens": pa.int64(),
    "usage_source": pa.string(),
    "n_chunks": pa.int32(),
    "output_tokens_estimate": pa.int64(),
    "invalid_utf8": pa.int32(),
    "finish_reason": pa.string(),
    "ttft_ms": pa.float64(),
    "e2e_ms": pa.float64(),
    "tpot_ms": pa.float64(),
    "decode_tpot_ms": pa.float64(),
    "dispatch_lag_ms": pa.float64(),
    "connect_ms": pa.float64(),
    "send_wait_ms": pa.float64(),
    "expected_prefix_hit_tokens": pa.int64(),
    "retries": pa.int32(),
    "endpoint": pa.string(),
    "session_id": pa.string(),
    "turn": pa.int64(),
    "session_wait_ms": pa.float64(),
    "queue_wait_ms": pa.float64(),
    "warmup": pa.bool_(),
    "n_documents": pa.int32(),
    "expected_prompt_tokens_once": pa.int64(),
    "expected_prompt_tokens_per_document": pa.int64(),
    "usage_audit": pa.string(),
    "partial_output_tokens": pa.int64(),
    "ttft_from_due_ms": pa.float64(),
    "e2el_from_due_ms": pa.float64(),
    "slo_met": pa.bool_(),
    "x_request_id": pa.string(),
    "server_queue_time_ms": pa.float64(),
    "server_time_to_first_token_ms": pa.float64(),
    "server_generation_time_ms": pa.float64(),
    "client_overhead_ms": pa.float64(),
    "tenant": pa.string(),
    "target": pa.string(),
    "images": pa.int32(),
    "image_bytes": pa.int64(),
    "expected_image_tokens": pa.int64(),
    "image_tokens": pa.int64(),
    "text_tokens": pa.int64(),
    "expected_image_cache_hits": pa.int32(),
    "itl_ms": pa.list_(pa.float32()),
    "itl_counts": pa.list_(pa.int32()),
}

#: ``itl_ms`` as written: ``exact`` (every gap) or ``sketch`` (the compact form, see ``compact_itl``)
ITL_FORMATS = ("exact", "sketch")
#: the results columns: the fields of ``RequestResult``, then ``itl_counts`` (null in the exact form)
COLUMNS: tuple[str, ...] = (*(f.name for f in fields(RequestResult)), "itl_counts")
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
