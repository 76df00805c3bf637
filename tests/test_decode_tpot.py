"""Decode TPOT (issue 47): ``tpot_ms`` stays vllm bench serve's (E2E - TTFT) / (N - 1), which
understates the per-token time when the first chunk carries several tokens; ``decode_tpot_ms``
divides by the tokens after the first chunk, null (and counted in ``decode_tpot_unknown``) where
that chunk's count is not known."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from conftest import replay_against
from faultserver import DONE, Plan, ThreadedFaultServer, choice

from replayer.core import Timestamps, derive
from replayer.core.timestamps import decode_tpot_ms

MS = 1_000_000


def test_decode_tpot_divides_by_the_tokens_after_the_first_chunk():
    assert decode_tpot_ms(0, 200 * MS, [3, 1, 1], 5) == 100.0
    assert decode_tpot_ms(0, 200 * MS, [1, 2, 2], 5) == 50.0  # (a first chunk of one: vllm's TPOT)
    assert decode_tpot_ms(0, 200 * MS, [2, 1], 5) is None  # counts do not add up: k1 unknown
    assert decode_tpot_ms(0, 200 * MS, [5], 5) is None  # nothing after the first chunk
    lat = derive(
        Timestamps(
            0, 0, 10 * MS, 210 * MS, token_ns=[10 * MS, 110 * MS, 210 * MS], token_counts=[3, 1, 1], output_tokens=5
        )
    )
    assert lat.tpot_ms == 50.0 and lat.decode_tpot_ms == 100.0


def _usage(n: int) -> dict:
    return {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}


# a first event of 3 tokens (continuous usage says how many), then one token every 100 ms
BIG_FIRST = Plan(
    transcript=[
        (0, choice("abc", usage=_usage(3))),
        (100, choice("d", usage=_usage(4))),
        (200, choice("e", finish="length", usage=_usage(5))),
        (201, DONE),
    ]
)


def test_a_run_records_decode_tpot_beside_tpot(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 4, "output_length": 5, "hash_ids": [1]}) + "\n")
    with ThreadedFaultServer(BIG_FIRST) as srv:
        p = replay_against(trace, srv.url, tmp_path / "r")
    assert p.returncode == 0, p.stderr[-2000:]
    [row] = pq.read_table(tmp_path / "r" / "requests.parquet", columns=["tpot_ms", "decode_tpot_ms"]).to_pylist()
    assert row["decode_tpot_ms"] == pytest.approx(2 * row["tpot_ms"], rel=1e-9)  # 200 ms / 2 against / 4
    assert row["decode_tpot_ms"] >= 90
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["decode_tpot_ms_count"] == 1 and s["decode_tpot_unknown"] == 0
    assert "decode, after the 1st chunk (ms)" in p.stdout
