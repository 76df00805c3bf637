"""The merged summary of ``--workers`` (and ``replayer merge``) keeps every shard's run events."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
from conftest import replay_against

from replayer.results.merge import merge_results


def test_workers_summary_and_merge_hold_every_shards_events_on_one_axis(tmp_path):
    n = 20
    trace = tmp_path / "t.parquet"
    pq.write_table(
        pa.table(
            {
                "timestamp": [i * 25 for i in range(n)],
                "input_length": [32] * n,
                "output_length": [2] * n,
                "hash_ids": [[2 * i, 2 * i + 1] for i in range(n)],
            }
        ).replace_schema_metadata({"replayer.block_size": "16", "replayer.time_unit": "ms"}),
        trace,
    )
    res = tmp_path / "res"
    p = replay_against(trace, None, res, "--workers", "2", "--loop", "2", model=None)
    assert p.returncode == 0, p.stderr[-3000:]
    merged = json.loads((res / "summary.json").read_text())
    own = {d: json.loads((res / d / "summary.json").read_text())["events"] for d in ("worker-0", "worker-1")}
    for d, events in own.items():  # each worker: start, the second loop, stop
        assert [e["event"] for e in events] == ["start", "loop", "stop"]
        mine = [e for e in merged["events"] if e["folder"].endswith(d)]
        assert [(e["event"], e["time_s"]) for e in mine] == [(e["event"], e["time_s"]) for e in events]
    times = [e["time_s"] for e in merged["events"]]
    assert len(times) == 6 and times == sorted(times)
    # on the shared axis: seconds after the earliest anchor, the same offset for every event
    offsets = [e["time_s"] - e["t_s"] for e in merged["events"]]
    assert max(offsets) - min(offsets) < 0.02  # (both rounded to 10 ms: a rounding step apart at most)
    # replayer merge of the two folders: the same events
    again = merge_results([str(res / "worker-0"), str(res / "worker-1")], quiet=True)
    assert [(e["event"], e["time_s"], e["t_s"]) for e in again["events"]] == [
        (e["event"], e["time_s"], e["t_s"]) for e in merged["events"]
    ]
