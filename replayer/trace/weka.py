"""Reader of Weka / SemiAnalysis agentic coding traces -> agentic sessions -> ``_Raw``.

The shape (Weka KV-Cache-Tester captures; SemiAnalysis ``cc-traces-weka-*`` on Hugging Face;
AIPerf's ``weka_trace`` models): one JSON record per session (a file holding one object, a
JSON array, or JSON lines) with ``id``, ``block_size`` (64 in the published corpora),
``hash_id_scope`` (``"local"``: ids mean something only inside this record; ``"global"``: one
namespace for the whole corpus) and ``requests[]``: ``t`` (seconds from the session's start),
``type`` (``"n"``, ``"s"``, or ``"subagent"``), ``model``, ``in`` (prompt tokens), ``out``
(output tokens), ``hash_ids`` (one per block of ``in``) and an optional ``think_time`` (seconds
the client waited before the request). A ``subagent`` entry has ``t`` (spawn time),
``agent_id`` and its own ``requests[]`` (which may hold subagents again).

Mapping (``agentic``): one session per record (``session_id`` = ``id``, else ``record-N``), a
call per ``n``/``s`` request in order; ``think_time`` becomes the wait. A subagent is a session
of its own, ``<parent session>::sa:<agent_id>``, spawned by the parent call before its marker:
its first call waits for that call's end (``parent_request_id``); the parent's later calls do
not wait for the subagent (the session gate has one predecessor per call). Local ids are salted
by the record, so a record's subagents share its blocks and other records share none. Inner
``t`` values are taken as absolute when none is before the marker's ``t`` (SemiAnalysis
publications), else as relative to it (raw kv-cache-tester captures). Every record starts at
time 0 (the corpus gives no session start). ``out`` 0 is sent as 1 (counted in the note).
"""

from __future__ import annotations

from replayer.trace.agentic import AgentCall, AgentSession, get_float, get_int, read_records, sessions_to_raw
from replayer.trace.columns import _Raw
from replayer.trace.mapping import _Opts
from replayer.trace.model import _Problems

WEKA_BLOCK_SIZE = 64


class _Record:
    """State of one record's walk: its sessions and counts."""

    def __init__(self, rec: int, scope: str, local: bool, probs: _Problems) -> None:
        self.rec, self.scope, self.local, self.probs = rec, scope, local, probs
        self.sessions: list[AgentSession] = []
        self.raised = 0

    def walk(self, reqs: list, where: str, session: AgentSession, base_s: float) -> None:
        """The requests of one (sub)agent into ``session``; subagents become sessions of their own."""
        rec, probs = self.rec, self.probs
        self.sessions.append(session)
        for j, r in enumerate(reqs):
            w = f"{where}[{j}]"
            if not isinstance(r, dict):
                probs.add(rec, w, "expected a JSON object")
                continue
            t = get_float(r, "t", rec, w, probs)
            if r.get("type") == "subagent":
                inner = r.get("requests")
                agent = r.get("agent_id")
                if not isinstance(inner, list):
                    probs.add(rec, f"{w}.requests", "missing" if inner is None else "expected a list of requests")
                    continue
                if t is None:
                    continue
                ts = [x["t"] for x in inner if isinstance(x, dict) and isinstance(x.get("t"), (int, float))]
                base = 0.0 if all(x >= t for x in ts) else t  # absolute, else relative to the marker
                child = AgentSession(
                    f"{session.session_id}::sa:{agent if agent is not None else j}",
                    local_ids=self.local,
                    scope=self.scope,
                    spawned_by=(session.session_id, len(session.calls) - 1) if session.calls else None,
                )
                self.walk(inner, f"{w}.requests", child, base_s + base)
                continue
            n_in = get_int(r, "in", rec, w, probs, minimum=1)
            n_out = get_int(r, "out", rec, w, probs, minimum=0)
            ids = r.get("hash_ids")
            ok_ids = isinstance(ids, list) and all(
                isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in ids
            )
            if not ok_ids:
                probs.add(rec, f"{w}.hash_ids", "missing" if ids is None else "expected a list of integers >= 0")
            think = get_float(r, "think_time", rec, w, probs, required=False)
            model = r.get("model") if isinstance(r.get("model"), str) else None
            if t is None or n_in is None or n_out is None or not ok_ids:
                continue
            if n_out == 0:
                self.raised += 1
            session.calls.append(
                AgentCall(
                    rec, w, round((base_s + t) * 1e9), n_in, max(1, n_out), hash_ids=ids, wait_s=think, model=model
                )
            )


def _read_weka(path: str, probs: _Problems, opts: _Opts) -> _Raw | None:
    sessions: list[AgentSession] = []
    block_size: int | None = opts.block_size
    bs_from: int | None = None
    raised = subagents = 0
    for rec, obj in read_records(path, probs):
        if not isinstance(obj, dict):
            probs.add(rec, "json", "expected a JSON object (one session)")
            continue
        bs = get_int(obj, "block_size", rec, "", probs, minimum=1, required=False)
        if bs is not None:
            if block_size is None:
                block_size, bs_from = bs, rec
            elif bs != block_size:
                was = f"record {bs_from}" if bs_from else "--block-size"
                probs.add(rec, "block_size", f"{bs} differs from {block_size} ({was}): one trace has one block size")
        scope = obj.get("hash_id_scope", "local")
        if scope not in ("local", "global"):
            probs.add(rec, "hash_id_scope", f"expected 'local' or 'global', got {scope!r}"[:120])
        sid = obj.get("id")
        if sid is not None and not isinstance(sid, (str, int)):
            probs.add(rec, "id", f"expected a string, got {sid!r}"[:120])
        reqs = obj.get("requests")
        if not isinstance(reqs, list):
            probs.add(rec, "requests", "missing" if reqs is None else "expected a list of requests")
            continue
        name = str(sid) if sid is not None else f"record-{rec}"
        walk = _Record(rec, name, scope != "global", probs)
        walk.walk(reqs, "requests", AgentSession(name, local_ids=scope != "global"), 0.0)
        sessions += walk.sessions
        raised += walk.raised
        subagents += len(walk.sessions) - 1
    if probs:
        return None
    notes = []
    if subagents:
        notes.append(f"{subagents} subagents replayed as sessions of their own (spawned, not joined)")
    if raised:
        notes.append(f"{raised} requests with out 0 sent with output_length 1")
    return sessions_to_raw(sessions, "weka", block_size or WEKA_BLOCK_SIZE, probs, notes)
