"""Reader of Weka / SemiAnalysis agentic coding traces -> agentic sessions -> ``_Raw``.

The shape (Weka KV-Cache-Tester captures; SemiAnalysis ``cc-traces-weka-*`` on Hugging Face;
AIPerf's ``weka_trace`` loader): one JSON record per session (a file holding one object, a
JSON array, or JSON lines) with ``id``, ``block_size`` (64 in the published corpora),
``hash_id_scope`` (``"local"``: ids mean something only inside this record) and ``requests[]``:
``t`` (seconds from the session's start), ``type`` (``"n"``, ``"s"``, or ``"subagent"``),
``model``, ``in`` (prompt tokens), ``out`` (output tokens), ``hash_ids`` (one per block of
``in``) and an optional ``think_time`` (seconds the client waited before the request).

Mapping (``agentic``): one session per record (``session_id`` = ``id``, else ``record-N``), a
call per ``n``/``s`` request in order; local ids are salted by the session; ``think_time``
becomes the wait. Every session starts at time 0 (the corpus gives no session start). Entries of
type ``subagent`` are not replayed (counted in the metadata note). ``out`` 0 is sent as 1
(counted).
"""

from __future__ import annotations

from .agentic import AgentCall, AgentSession, get_float, get_int, read_records, sessions_to_raw
from .columns import _Raw
from .model import _Problems
from .options import _Opts

WEKA_BLOCK_SIZE = 64


def _read_weka(path: str, probs: _Problems, opts: _Opts) -> _Raw | None:
    sessions: list[AgentSession] = []
    block_size: int | None = opts.block_size
    bs_from: int | None = None
    subagents = raised = 0
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
        s = AgentSession(str(sid) if sid is not None else f"record-{rec}", local_ids=scope != "global")
        reqs = obj.get("requests")
        if not isinstance(reqs, list):
            probs.add(rec, "requests", "missing" if reqs is None else "expected a list of requests")
            continue
        for j, r in enumerate(reqs):
            where = f"requests[{j}]"
            if not isinstance(r, dict):
                probs.add(rec, where, "expected a JSON object")
                continue
            if r.get("type") == "subagent":
                subagents += 1
                continue
            t = get_float(r, "t", rec, where, probs)
            n_in = get_int(r, "in", rec, where, probs, minimum=1)
            n_out = get_int(r, "out", rec, where, probs, minimum=0)
            ids = r.get("hash_ids")
            ok_ids = isinstance(ids, list) and all(isinstance(h, int) and not isinstance(h, bool) and h >= 0
                                                   for h in ids)
            if not ok_ids:
                probs.add(rec, f"{where}.hash_ids", "missing" if ids is None else "expected a list of integers >= 0")
            think = get_float(r, "think_time", rec, where, probs, required=False)
            model = r.get("model") if isinstance(r.get("model"), str) else None
            if t is None or n_in is None or n_out is None or not ok_ids:
                continue
            if n_out == 0:
                raised += 1
            s.calls.append(AgentCall(rec, where, round(t * 1e9), n_in, max(1, n_out), hash_ids=ids,
                                     wait_s=think, model=model))
        sessions.append(s)
    if probs:
        return None
    notes = []
    if subagents:
        notes.append(f"{subagents} subagent entries not replayed")
    if raised:
        notes.append(f"{raised} requests with out 0 sent with output_length 1")
    return sessions_to_raw(sessions, "weka", block_size or WEKA_BLOCK_SIZE, probs, notes)
