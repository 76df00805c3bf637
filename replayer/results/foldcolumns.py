"""The columns the run summary reads and the numpy helpers its fold uses on them: which results
columns a file is read with, the fold's counters, the server's own timings, and a column as float64
with null as NaN (unknown, never 0)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replayer.results.imagestats import COLUMNS as IMAGE_COLUMNS

PERCENTILES = (50, 90, 99)
POOLING = ("/v1/embeddings", "/v1/score", "/v1/rerank")
#: the results columns the summary reads (a results file is read with only these)
COLUMNS = (
    "outcome",
    "error_kind",
    "http_status",
    "endpoint",
    "due_ns",
    "sent_ns",
    "end_ns",
    "first_token_ns",
    "last_token_ns",
    "prompt_tokens",
    "completion_tokens",
    "input_length",
    "output_length",
    "ttft_ms",
    "tpot_ms",
    "decode_tpot_ms",
    "e2e_ms",
    "ttft_from_due_ms",
    "e2el_from_due_ms",
    "dispatch_lag_ms",
    "expected_prefix_hit_tokens",
    "usage_audit",
    "session_id",
    "session_wait_ms",
    "queue_wait_ms",
    "warmup",
    "partial_output_tokens",
    "output_tokens_estimate",
    "invalid_utf8",
    "server_queue_time_ms",
    "server_time_to_first_token_ms",
    "server_generation_time_ms",
    "client_overhead_ms",
    *IMAGE_COLUMNS,
    "itl_ms",
    "itl_counts",
)
#: rows per batch read from a results file: ~1.4M ITL samples at Mooncake's ~350 tokens per
#: request, ~11 MB a float64 copy (the end-of-run summary of a 250k-row folder peaked at 274 MB
#: with 4,096, 346 MB with 8,192)
BATCH_ROWS = 4_096
#: the count fields of the summary (each a sum over requests)
COUNTS = (
    "scheduled",
    "sent",
    "completed",
    "failed",
    "cancelled",
    "not_started",
    "missed_while_down",
    "total_input_tokens",
    "total_output_tokens",
    "usage_missing",
    "prompt_token_mismatches",
    "prompt_token_drift_total",
    "completion_token_mismatches",
    "ttft_unmeasured",
    "zero_token_successes",
    "expected_prefix_hit_tokens",
    "expected_prefix_known",
    "usage_inflated",
    "session_turns",
    "turns_held",
    "turns_lost",  # (issue 47) turns not sent: an earlier turn of the session failed
    "partial_output_tokens",
    "decode_tpot_unknown",  # (issue 47) tpot_ms known, the first chunk's token count not
    "http_rate_limited",  # (issue 47: results.httpclasses)
    "http_overloaded",
    "http_other",
    "input_tokens_known",
    "input_tokens_values",
    "output_tokens_known",
    "output_tokens_values",
    "output_tokens_estimate",
    "invalid_utf8",
    "queue_capped",
    "queue_waited",
    "warmup_requests",
    "warmup_sent",
    "warmup_completed",
    "warmup_failed",
)
#: the server's own timings (``--server-timings``), summarized when any request reported them
SERVER_TIMINGS = (
    "server_queue_time_ms",
    "server_time_to_first_token_ms",
    "server_generation_time_ms",
    "client_overhead_ms",
)


def add_counts(a, b):
    """Sum of two count values: ints add, dicts merge key by key; None is nothing."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: add_counts(a.get(k), b.get(k)) for k in {**a, **b}}
    return a + b


def mask(col: pa.ChunkedArray | pa.Array, value: str) -> np.ndarray:
    """Boolean numpy mask: ``col == value`` (null is False)."""
    return pc.fill_null(pc.equal(col, value), False).to_numpy(zero_copy_only=False)


def f64_or_nan(t: pa.Table | pa.RecordBatch, name: str) -> np.ndarray:
    """Column ``name`` as float64, all NaN (unknown) where a results file has no such column."""
    if name in t.schema.names:
        return f64(t.column(name))
    return np.full(t.num_rows, np.nan)


def f64(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A numeric column as float64 (null -> NaN)."""
    return col.to_numpy(zero_copy_only=False).astype(np.float64)


def nansum(v: np.ndarray) -> int:
    """Sum of the known values (NaN: unknown, left out)."""
    return int(np.nansum(v))
