"""The warm-up boundary cuts by token (issue 47): tokens a warm-up request streamed inside the
measured window (after the first measured send, before the last end) count in the window's output
throughput; those before the boundary do not."""

from __future__ import annotations

import numpy as np
import pytest

from replayer.core import RequestResult
from replayer.record import Recorder, result_files
from replayer.results import summarize_files
from replayer.results.warmtokens import WarmTokens

S = 1_000_000_000


def test_the_tokens_inside_the_window_are_the_share_of_the_span_inside_it():
    w = WarmTokens()
    w.add(np.array([1.0 * S, 2.0 * S, 7.0 * S]), np.array([11.0 * S, 4.0 * S, 7.0 * S]), np.array([100.0, 10.0, 5.0]))
    # window 6 s .. 8 s: 2 of the first one's 10 s (20 tokens), none of the second, the third whole
    assert w.within(6 * S, 8 * S) == 25
    assert w.within(float("inf"), 8 * S) == 0
    w.add(np.array([np.nan]), np.array([1.0]), np.array([3.0]))  # (unknown: left out)
    assert w.within(0, 100 * S) == 115


def test_a_warm_up_request_streaming_past_the_boundary_counts_in_the_throughput(tmp_path):
    rec = Recorder(str(tmp_path / "r"))
    rec.add(RequestResult(row=0, outcome="success", sent_ns=0, first_token_ns=1 * S, last_token_ns=11 * S,
                          end_ns=11 * S, completion_tokens=100, prompt_tokens=4, warmup=True))  # fmt: skip
    rec.add(RequestResult(row=1, outcome="success", sent_ns=6 * S, first_token_ns=6 * S + S // 2,
                          last_token_ns=8 * S, end_ns=8 * S, completion_tokens=10, prompt_tokens=4))  # fmt: skip
    rec.close()
    s = summarize_files(result_files(str(tmp_path / "r")))
    assert s["warmup"]["output_tokens_after_boundary"] == 20  # 100 tokens over 1..11 s, 6..8 s of them
    assert s["total_output_tokens"] == 10 and s["duration"] == pytest.approx(2.0)
    assert s["output_throughput"] == pytest.approx((10 + 20) / 2.0)
