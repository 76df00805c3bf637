"""What a stop leaves unsent (``replayer.send.unsent.never_sent``), pure: the requests waiting
for a slot, the held ones and the rest of the current batch become ``not_started`` records with
nothing sent; a schedule without end counts only what was due by the stop."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from replayer.core import PreparedRequest, RequestResult
from replayer.plan import Timeline
from replayer.send.unsent import never_sent


def _req(row: int, trace_ns: int) -> PreparedRequest:
    return PreparedRequest(
        index=row, row=row, due_ns=trace_ns, body=b"{}", input_length=10, output_length=5, prompt_len=10,
        max_tokens=5, trace_ns=trace_ns, expected_hits=4,
    )  # fmt: skip


class _Batch(SimpleNamespace):
    def __len__(self) -> int:
        return len(self.trace_ns)


def _records(until_ns):
    batch = _Batch(trace_ns=np.array([0, 100, 200, 300, 400]))
    return list(
        never_sent(
            [(_req(1, 10), 10)],
            [_req(2, 50), _req(3, 500)],
            (batch, 2),
            timeline=Timeline(2.0),
            until_ns=until_ns,
            shard=7,
            unsent=lambda b, j: RequestResult(row=100 + j, due_ns=Timeline(2.0).due(int(b.trace_ns[j]))),
        )
    )


def test_every_request_a_stop_leaves_is_a_not_started_record_with_nothing_sent():
    recs = _records(None)
    assert [r.row for r in recs] == [1, 2, 3, 102, 103, 104]
    assert all(r.outcome == "not_started" for r in recs)
    waiting, held = recs[0], recs[1]
    assert (waiting.due_ns, held.due_ns, recs[2].due_ns) == (10, 25, 250)  # held ones: their due time now
    for r in recs[:3]:
        assert (r.shard, r.prompt_len_sent, r.max_tokens, r.expected_prefix_hit_tokens) == (7, 0, 0, None)


def test_a_schedule_without_end_counts_only_what_was_due_by_the_stop():
    recs = _records(150)
    # the held request due at 250 and the batch's items due after 150 were never due
    assert [r.row for r in recs] == [1, 2, 102, 103]
