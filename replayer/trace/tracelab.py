"""Reader of TraceLab-style agentic rounds -> agentic sessions -> ``_Raw``.

The shape (uw-syfi/TraceLab, ``syfi_coding_trace.jsonl.gz``, CC BY 4.0; AIPerf's ``tracelab``
loader): one JSON line per LLM round with ``session_id``, ``round_index``,
``input_tokens_total`` = ``prefix_tokens`` (reused from the previous round) +
``newly_append_tokens``, ``output_tokens``, ``model`` and ``timing_events[]`` of
{``event_type``, ``timestamp`` ISO-8601} (``user_message`` and ``tool_result`` feed the round;
``text``, ``reasoning``, ``tool_call``, ... are the model's output).

Mapping (``agentic``): rounds are grouped by ``session_id`` and ordered by ``round_index`` (file
order breaks ties); a round arrives at its latest input event (``user_message`` /
``tool_result``; without one, its earliest event) and ends at its latest event. Its wait is its
arrival minus the previous round's end (tool time or user idle), never below 0. The prefix reuse
is ``prefix_tokens`` (whole blocks of ``--block-size``, default 64, as for Copilot).
``output_tokens`` 0 is sent as 1 (counted in the metadata note).
"""

from __future__ import annotations

from replayer.trace.agentic import AgentCall, AgentSession, get_int, parse_time_ns, read_records, sessions_to_raw
from replayer.trace.columns import _Raw
from replayer.trace.mapping import _Opts
from replayer.trace.model import _Problems

TRACELAB_BLOCK_SIZE = 64
_INPUT_EVENTS = ("user_message", "tool_result")


def _read_tracelab(path: str, probs: _Problems, opts: _Opts) -> _Raw | None:
    by_session: dict[str, list[tuple[int, int, AgentCall, int]]] = {}
    raised = 0
    for rec, obj in read_records(path, probs):
        if not isinstance(obj, dict):
            probs.add(rec, "json", "expected a JSON object (one round)")
            continue
        sid = obj.get("session_id")
        if not isinstance(sid, str):
            probs.add(rec, "session_id", "missing" if sid is None else f"expected a string, got {sid!r}"[:120])
            continue
        ri = get_int(obj, "round_index", rec, "", probs, minimum=0)
        total = get_int(obj, "input_tokens_total", rec, "", probs, minimum=1)
        prefix = get_int(obj, "prefix_tokens", rec, "", probs, minimum=0)
        new = get_int(obj, "newly_append_tokens", rec, "", probs, minimum=0)
        out = get_int(obj, "output_tokens", rec, "", probs, minimum=0)
        if total is not None and prefix is not None and new is not None and prefix + new != total:
            probs.add(
                rec,
                "input_tokens_total",
                f"prefix_tokens {prefix} + newly_append_tokens {new} = {prefix + new} != input_tokens_total {total}",
            )
            continue
        events = obj.get("timing_events")
        if not isinstance(events, list) or not events:
            probs.add(rec, "timing_events", "missing" if events is None else "expected a non-empty list of events")
            continue
        times: list[tuple[int, str]] = []
        for k, e in enumerate(events):
            if not isinstance(e, dict):
                probs.add(rec, f"timing_events[{k}]", "expected a JSON object")
                continue
            t = parse_time_ns(e.get("timestamp"), rec, f"timing_events[{k}].timestamp", probs)
            if t is not None:
                times.append((t, str(e.get("event_type"))))
        if ri is None or total is None or prefix is None or new is None or out is None or len(times) != len(events):
            continue
        inputs = [t for t, kind in times if kind in _INPUT_EVENTS]
        arrive = max(inputs) if inputs else min(t for t, _ in times)
        end = max(t for t, _ in times)
        if out == 0:
            raised += 1
        model = obj.get("model") if isinstance(obj.get("model"), str) else None
        call = AgentCall(rec, "", arrive, total, max(1, out), reused_tokens=prefix, model=model)
        by_session.setdefault(sid, []).append((ri, rec, call, end))
    if probs:
        return None
    sessions = []
    for sid, rounds in by_session.items():
        rounds.sort(key=lambda r: (r[0], r[1]))
        s = AgentSession(sid)
        prev_end = None
        for _, _, call, end in rounds:
            if prev_end is not None:
                call.wait_s = max(0, call.time_ns - prev_end) / 1e9
            s.calls.append(call)
            prev_end = end
        sessions.append(s)
    notes = [f"{raised} rounds with output_tokens 0 sent with output_length 1"] if raised else []
    bs = opts.block_size if opts.block_size is not None else TRACELAB_BLOCK_SIZE
    return sessions_to_raw(sessions, "tracelab", bs, probs, notes)
