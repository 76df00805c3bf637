"""``replayer.core.timestamps.derive``: the latencies of one request from its moments."""

from __future__ import annotations

import dataclasses

import pytest

from replayer.core import Latencies, Timestamps, derive

MS = 1_000_000


def test_a_streamed_request_multi_token_chunk_and_from_due_views():
    # due 100 ms, sent 105 ms; events at 150 (1 token), 170 (1), 200 (2 tokens: MTP)
    ts = Timestamps(
        due_ns=100 * MS,
        sent_ns=105 * MS,
        first_token_ns=150 * MS,
        last_token_ns=200 * MS,
        token_ns=[150 * MS, 170 * MS, 200 * MS],
        token_counts=[1, 1, 2],
        output_tokens=4,
    )
    assert derive(ts) == Latencies(
        ttft_ms=45.0,
        e2e_ms=95.0,
        tpot_ms=50.0 / 3,
        itl_ms=[20.0, 15.0, 15.0],
        ttft_from_due_ms=50.0,
        e2el_from_due_ms=100.0,
        decode_tpot_ms=50.0 / 3,  # (a first chunk of one token: decode TPOT is TPOT)
    )
    # sum(ITL) == E2E - TTFT, mean(ITL) == TPOT
    lat = derive(ts)
    assert sum(lat.itl_ms) == pytest.approx(lat.e2e_ms - lat.ttft_ms)


def test_a_held_session_turn_counts_from_its_release():
    # due 100 ms, released 130 ms (held 30 ms), sent 131 ms
    ts = Timestamps(
        due_ns=100 * MS,
        sent_ns=131 * MS,
        first_token_ns=140 * MS,
        last_token_ns=140 * MS,
        token_ns=[140 * MS],
        token_counts=[1],
        output_tokens=1,
        session_wait_ms=30.0,
    )
    lat = derive(ts)
    assert (lat.ttft_ms, lat.ttft_from_due_ms, lat.tpot_ms, lat.itl_ms) == (9.0, 10.0, None, [])


@pytest.mark.parametrize(
    "change, unknown",
    [
        ({"output_tokens": None}, "N unknown (no usage): no TPOT, no ITL"),
        ({"token_counts": [1, 1, 1]}, "counts do not add up to N: no ITL"),
        ({"streamed": False}, "a whole JSON body: no per-token timing"),
    ],
)
def test_unknown_is_none_never_zero(change, unknown):
    ts = Timestamps(
        due_ns=0,
        sent_ns=0,
        first_token_ns=10 * MS,
        last_token_ns=30 * MS,
        token_ns=[10 * MS, 20 * MS, 30 * MS],
        token_counts=[1, 1, 2],
        output_tokens=4,
    )
    lat = derive(dataclasses.replace(ts, **change))
    assert lat.itl_ms == [], unknown
    assert (lat.tpot_ms is None) == ("TPOT" in unknown or "whole" in unknown), unknown
    assert lat.ttft_ms == 10.0 and lat.e2e_ms == 30.0


def test_a_pooling_body_ends_at_its_arrival_and_an_unsent_request_has_no_latency():
    lat = derive(Timestamps(due_ns=0, sent_ns=2 * MS, body_ns=9 * MS, streamed=False))
    assert (lat.ttft_ms, lat.e2e_ms, lat.e2el_from_due_ms) == (None, 7.0, 9.0)
    assert derive(Timestamps(due_ns=0, sent_ns=None, first_token_ns=5)) == Latencies(None, None, None)
