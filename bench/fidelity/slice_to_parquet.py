"""Fidelity slice (Mooncake JSONL, ms timestamps that may be fractional) -> canonical Parquet with
integer ns timestamps (``replayer.time_unit = ns``), so the replay adds no rounding."""

import sys

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

src, dst = sys.argv[1], sys.argv[2]
rows = [orjson.loads(line) for line in open(src, "rb") if line.strip()]
table = pa.table({
    "timestamp": pa.array([round(r["timestamp"] * 1_000_000) for r in rows], pa.int64()),
    "input_length": pa.array([r["input_length"] for r in rows], pa.int64()),
    "output_length": pa.array([r["output_length"] for r in rows], pa.int64()),
    "hash_ids": pa.array([r["hash_ids"] for r in rows], pa.list_(pa.int64())),
}).replace_schema_metadata({"replayer.schema_version": "1", "replayer.block_size": "512",
                            "replayer.time_unit": "ns", "replayer.source": f"fidelity slice {src}"})
pq.write_table(table, dst)
