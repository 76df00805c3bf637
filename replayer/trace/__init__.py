"""Trace loading, validation and conversion.

A *trace* is a list of requests: when each one arrives, how many prompt tokens it has, how many
tokens it must generate, and which prompt blocks (``hash_ids``) it shares with other requests.

Formats (details in :func:`read_trace` and ``docs/reference/trace-formats.md``): canonical Parquet (one file, a
folder or a glob of shards; streamed by :func:`open_trace`), Mooncake JSONL (FAST'25 release,
kvcache-ai/Mooncake ``FAST25-release/traces``), the Azure LLM inference trace CSV (Azure Public
Dataset AzureLLMInferenceTrace 2023; Splitwise, ISCA 2024) and generic JSONL / CSV / Parquet with
a column mapping and a time unit. Hash ids are 64-bit integers or strings
(:func:`hash_id_from_string`); sources without them get unique ids from :data:`SYNTH_ID_BASE`.

Canonical Parquet (``docs/reference/trace-formats.md`` documents it exactly): columns ``timestamp``,
``input_length``, ``output_length`` (int64), ``hash_ids`` (list<int64> or list<uint64>), optional
``request_id``, ``session_id``, ``model`` (string), ``priority`` (int64), ``extra_body`` (string
holding a JSON object); optional session and endpoint columns ``turn`` (int64), ``parent_request_id``
(string), ``think_time_s`` (float64), ``endpoint`` (string, one of :data:`ENDPOINTS`),
``query_length`` (int64), ``document_lengths`` (list<int64>); file metadata
``replayer.schema_version``, ``replayer.block_size``, ``replayer.time_unit``, ``replayer.source``,
``replayer.license`` (and ``replayer.hash_ids`` = ``synthesised`` for synthesised hash ids).

``read_trace`` validates the whole file and raises one :class:`TraceError` that lists every problem
(file, 1-based row, field, message). Rows are then stable-sorted by timestamp as whole rows (a
timestamp never gets another row's lengths) and times become int64 nanosecond offsets from the
smallest timestamp.

Modules of this package: ``model`` (constants, problems and errors, :class:`Trace`), ``values``
(value checks and coercion), ``options`` (column mapping, reading options), ``timestamps``
(timestamp columns), ``columns`` (raw columns of a table, hash id counts), the readers
``parquet``, ``jsonl`` and ``csv``, ``read`` (whole-row checks, sorting, :func:`read_trace`),
``source`` (streaming: :class:`TraceSource`, :func:`open_trace`) and ``write``
(:func:`trace_table`, :func:`write_parquet`, :func:`convert`). Everything public is imported
from ``replayer.trace``.
"""

from __future__ import annotations

from replayer.trace.mapping import parse_mapping
from replayer.trace.mix import MixEntry, mix_traces, open_mix, parse_entry
from replayer.trace.model import (
    DEFAULT_BLOCK_SIZE,
    ENDPOINTS,
    EXTRA_BODY_RESERVED,
    FORMATS,
    HASH_ID_KEY,
    ROW_GROUP_SIZE,  # noqa: F401 - not in __all__; replayer.trace.synth imports it
    SCHEMA_VERSION,
    SYNTH_ID_BASE,
    TIME_UNITS,
    Trace,
    TraceError,
    TraceOrderWarning,
    TraceProblem,
    TraceUnitWarning,
    _cut_optional,  # noqa: F401 - private; replayer.trace.tools imports it
)
from replayer.trace.parquet import trace_paths
from replayer.trace.read import read_trace
from replayer.trace.source import TraceSource, open_trace, slice_rows
from replayer.trace.values import hash_id_from_string
from replayer.trace.write import coarsest_unit, convert, trace_table, write_parquet

__all__ = [
    "TraceProblem",
    "TraceError",
    "TraceOrderWarning",
    "TraceUnitWarning",
    "Trace",
    "read_trace",
    "write_parquet",
    "trace_table",
    "slice_rows",
    "convert",
    "coarsest_unit",
    "SCHEMA_VERSION",
    "DEFAULT_BLOCK_SIZE",
    "TIME_UNITS",
    "FORMATS",
    "SYNTH_ID_BASE",
    "HASH_ID_KEY",
    "hash_id_from_string",
    "parse_mapping",
    "TraceSource",
    "open_trace",
    "trace_paths",
    "ENDPOINTS",
    "EXTRA_BODY_RESERVED",
    "MixEntry",
    "mix_traces",
    "open_mix",
    "parse_entry",
]
