"""Reader of the Azure LLM inference trace CSV and generic CSV (header row) -> ``_Raw``."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from replayer.trace.columns import _Raw, _raw_from_table
from replayer.trace.mapping import _Opts, _src
from replayer.trace.model import DEFAULT_BLOCK_SIZE, DEFAULT_TIME_UNIT, _Problems

#: Columns of the Azure LLM inference trace CSV (a header with two of them is taken for one).
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _sniff_csv_header(path: str) -> list[str]:
    try:
        with open(path, "rb") as f:
            first = f.readline(65536).decode("utf-8", "replace").strip()
    except OSError:
        return []
    return [c.strip().strip('"') for c in first.split(",")]


def _read_csv(path: str, probs: _Problems, opts: _Opts) -> _Raw | None:
    """Azure LLM inference trace CSV or generic CSV (header row; rows are line numbers, header = 1)."""
    import pyarrow.csv as pcsv

    types = {}
    unit = opts.time_unit or ("datetime" if opts.fmt == "azure" else DEFAULT_TIME_UNIT)
    if unit == "datetime":
        types[_src(opts, "timestamp")] = pa.string()
    for name in (
        "hash_ids",
        "request_id",
        "session_id",
        "model",
        "extra_body",
        "parent_request_id",
        "endpoint",
        "document_lengths",
        "image_ids",
        "image_sizes",
    ):
        if _src(opts, name):
            types[_src(opts, name)] = pa.string()
    try:
        table = pcsv.read_csv(path, convert_options=pcsv.ConvertOptions(column_types=types, strings_can_be_null=True))
    except (pa.ArrowException, OSError, ValueError) as e:
        probs.add(0, "file", f"not a readable CSV file: {e}")
        return None
    if opts.fmt == "azure":
        missing = [c for c in AZURE_COLUMNS if c not in table.column_names and c in opts.mapping.values()]
        if missing:
            probs.add(
                0,
                "format",
                f"Azure CSV is missing {' and '.join(missing)} (columns present: "
                f"{', '.join(table.column_names)}); another CSV: name its columns with --map",
            )
            return None
    bs = opts.block_size if opts.block_size is not None else DEFAULT_BLOCK_SIZE
    meta = {"format": opts.fmt, "time_unit": unit, "block_size": str(bs)}
    if opts.fmt == "azure" and "NumImages" in table.column_names:
        meta["source"] = (
            "Azure LMM inference trace 2025 (AzurePublicDataset AzureLMMInferenceTrace_multimodal; "
            "ModServe, SoCC 2025): " + os.path.basename(path)
        )
        meta["license"] = "CC-BY-4.0"
    elif opts.fmt == "azure":
        meta["source"] = (
            "Azure LLM inference trace 2023 (AzurePublicDataset AzureLLMInferenceTrace; "
            "Splitwise, ISCA 2024): " + os.path.basename(path)
        )
        meta["license"] = "CC-BY-4.0"
    return _raw_from_table(table, probs, meta, bs, opts, np.arange(2, table.num_rows + 2, dtype=np.int64))
