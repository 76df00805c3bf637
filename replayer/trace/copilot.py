"""Reader of the GitHub Copilot coding agent traces 2026 -> agentic sessions -> ``_Raw``.

The shape (Azure Public Dataset, ``GitHubCopilotCodingAgentDataset2026.md`` and
``analysis/GitHubCopilotCodingAgents/schema.json``; CC-BY; gzip JSONL shards, one session per
line): ``session_id``, ``date``, ``turns[]`` of ``turn_id``, ``llm_calls[]`` (``message_id``,
``timestamp`` ISO-8601, ``duration_ms``, ``initiator_type`` ``user``/``agent``, ``model``,
``tokens`` {``prompt``, ``completion``, ``cached``, ...}) and ``tool_batches[]`` (``timestamp``,
``duration_ms``, ``request_id`` = the ``message_id`` of the call that asked for the tools,
``function_calls[]``).

No hash ids: prompts are built from the cached tokens (``agentic``): each call reuses
``floor(cached / B)`` full blocks of the previous call's prompt in the session (across turns
too) and gets fresh blocks for the rest, so the prefix the server can reuse is the reported
cached tokens rounded down to whole blocks. ``B`` is ``--block-size`` (default 64).

Waits: a call's wait is the sum of the durations of the tool batches its predecessor asked for
(``request_id`` = the predecessor's ``message_id``); the first call of a later turn (a user
turn) waits the recorded idle time, its start minus the predecessor's end (start +
``duration_ms``), never below 0; other calls have no wait. ``completion`` 0 (a cancelled call) is
sent as 1 (counted in the metadata note).
"""

from __future__ import annotations

from replayer.trace.agentic import (
    AgentCall,
    AgentSession,
    get_float,
    get_int,
    parse_time_ns,
    read_records,
    sessions_to_raw,
)
from replayer.trace.columns import _Raw
from replayer.trace.mapping import _Opts
from replayer.trace.model import _Problems

COPILOT_BLOCK_SIZE = 64


def _read_copilot(path: str, probs: _Problems, opts: _Opts) -> _Raw | None:  # noqa: C901, PLR0912, PLR0915
    sessions: list[AgentSession] = []
    raised = 0
    for rec, obj in read_records(path, probs):
        if not isinstance(obj, dict):
            probs.add(rec, "json", "expected a JSON object (one session)")
            continue
        sid = obj.get("session_id")
        if not isinstance(sid, (str, int)) or isinstance(sid, bool):
            probs.add(rec, "session_id", "missing" if sid is None else f"expected a string, got {sid!r}"[:120])
            continue
        turns = obj.get("turns")
        if not isinstance(turns, list):
            probs.add(rec, "turns", "missing" if turns is None else "expected a list of turns")
            continue
        s = AgentSession(str(sid))
        prev_end: int | None = None
        prev_msg: object = None
        tool_wait: dict[object, float] = {}
        for ti, turn in enumerate(turns):
            tw = f"turns[{ti}]"
            if not isinstance(turn, dict):
                probs.add(rec, tw, "expected a JSON object")
                continue
            calls, batches = turn.get("llm_calls"), turn.get("tool_batches", [])
            if not isinstance(calls, list):
                probs.add(rec, f"{tw}.llm_calls", "missing" if calls is None else "expected a list")
                continue
            if not isinstance(batches, list):
                probs.add(rec, f"{tw}.tool_batches", "expected a list")
                batches = []
            for bi, b in enumerate(batches):
                bw = f"{tw}.tool_batches[{bi}]"
                if not isinstance(b, dict):
                    probs.add(rec, bw, "expected a JSON object")
                    continue
                parse_time_ns(b.get("timestamp"), rec, f"{bw}.timestamp", probs)
                d = get_float(b, "duration_ms", rec, bw, probs)
                if d is not None and b.get("request_id") is not None:
                    tool_wait[b["request_id"]] = tool_wait.get(b["request_id"], 0.0) + d / 1e3
            for ci, c in enumerate(calls):
                cw = f"{tw}.llm_calls[{ci}]"
                if not isinstance(c, dict):
                    probs.add(rec, cw, "expected a JSON object")
                    continue
                start = parse_time_ns(c.get("timestamp"), rec, f"{cw}.timestamp", probs)
                dur = get_float(c, "duration_ms", rec, cw, probs)
                tok = c.get("tokens")
                if not isinstance(tok, dict):
                    probs.add(rec, f"{cw}.tokens", "missing" if tok is None else "expected an object")
                    continue
                tw_ = f"{cw}.tokens"
                prompt = get_int(tok, "prompt", rec, tw_, probs, minimum=1)
                completion = get_int(tok, "completion", rec, tw_, probs, minimum=0)
                cached = get_int(tok, "cached", rec, tw_, probs, minimum=0)
                if prompt is not None and cached is not None and cached > prompt:
                    probs.add(rec, f"{tw_}.cached", f"cached {cached} is more than prompt {prompt}")
                    continue
                if start is None or dur is None or prompt is None or completion is None or cached is None:
                    continue
                if ci == 0 and ti > 0 and prev_end is not None:
                    wait = max(0.0, (start - prev_end) / 1e9)  # user idle before a new turn
                elif prev_msg is not None and prev_msg in tool_wait:
                    wait = tool_wait[prev_msg]
                else:
                    wait = None
                if completion == 0:
                    raised += 1
                model = c.get("model") if isinstance(c.get("model"), str) else None
                s.calls.append(
                    AgentCall(
                        rec, cw, start, prompt, max(1, completion), reused_tokens=cached, wait_s=wait, model=model
                    )
                )
                prev_end = start + round(dur * 1e6)
                prev_msg = c.get("message_id")
        sessions.append(s)
    if probs:
        return None
    notes = [f"{raised} calls with completion 0 sent with output_length 1"] if raised else []
    bs = opts.block_size if opts.block_size is not None else COPILOT_BLOCK_SIZE
    return sessions_to_raw(sessions, "copilot", bs, probs, notes)
