"""The internal form of agentic sessions, and its one mapping to canonical rows.

Agentic traces (Weka/SemiAnalysis, GitHub Copilot coding agent, TraceLab) describe *sessions*:
ordered LLM calls whose prompts grow, reuse the previous call's context and wait on tools or on
the user between calls. Each reader (``weka``, ``copilot``, ``tracelab``) parses its shape into
:class:`AgentSession` objects of :class:`AgentCall`\\ s, and :func:`sessions_to_raw` turns them into
canonical rows (``_Raw``) in one documented way:

* **session, turn, parent**: every call is a row with ``session_id`` = its session's id and
  ``turn`` = its 0-based position in the session; its parent is the call before it (the session
  chain), so with ``--session-policy wait`` a call is never sent before its predecessor ended.
  A spawned session (a Weka subagent) has as first parent the spawning call: the rows then also
  get ``request_id`` ``<session>#<turn>`` and ``parent_request_id``, and the gate follows them.
* **waits**: ``wait_s`` (a tool batch, user idle time, think time: whatever the source says the
  session waited between the predecessor's end and this call) becomes ``think_time_s``; None
  leaves it unset (only the trace time applies).
* **prefix reuse**: a call carries either its own ``hash_ids`` (Weka) or ``reused_tokens``, the
  tokens of its prompt the source says were a reusable prefix of the previous call's prompt
  (Copilot ``tokens.cached``, TraceLab ``prefix_tokens``). Reused tokens become hash ids: the
  call takes the first ``k = min(reused // B, prev_len // B)`` block ids of the previous call
  (``B`` = block size, ``prev_len`` its prompt length: only its *full* blocks can be shared) and
  fresh ids for the rest. So consecutive calls share exactly ``k * B`` leading tokens; the
  partial block (``reused % B`` tokens, < B) is sent as new tokens, and a reuse larger than the
  previous prompt's full blocks (a cache filled by something else) is cut to them, counted in
  the metadata note.
* **hash scope**: given ids that are local (Weka ``hash_id_scope: "local"``) are salted by the
  session's scope (its record: a Weka subagent shares its record's blocks), and fresh ids are
  drawn from the session's own stream, so sessions of different scopes never share blocks by
  accident; the trace is then ``hash_id_scope`` "local" (``trace.mix`` salts it again per trace
  when traces are mixed). Ids stay below 2**62, clear of the synthesised range.

A session's id in the rows is the source's, so results join back to the source.
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterator

import numpy as np
import orjson

from replayer.core.hashing import mix64 as _mix, mix64_array
from replayer.trace.columns import _Raw
from replayer.trace.model import _Problems

#: Hash ids made here stay below 2**62 (below the reserved synthesised range).
ID_MASK = (1 << 62) - 1
AGENTIC_FORMATS = ("weka", "copilot", "tracelab")


@dataclass
class AgentCall:
    """One LLM call of a session, as its source gives it.

    ``record``: 1-based source record (line) for problems; ``where``: the call's path in the
    record (``requests[3]``), prefixed to field names in problems. ``time_ns``: arrival time (ns;
    any origin: offsets are taken from the trace's earliest call). ``hash_ids`` or
    ``reused_tokens`` (see the module docstring). ``wait_s``: seconds the session waited after
    the predecessor's end (None: not given).
    """

    record: int
    where: str
    time_ns: int
    input_length: int
    output_length: int
    hash_ids: list[int] | None = None
    reused_tokens: int | None = None
    wait_s: float | None = None
    model: str | None = None


@dataclass
class AgentSession:
    """A session: its id, its calls in order, and whether its given hash ids are local.

    ``scope``: the name local ids are salted by (default: the session id; a Weka subagent uses
    its record's, so it shares the record's blocks). ``spawned_by``: (session id, call index) of
    the call whose end this session's first call waits for (a subagent), or None."""

    session_id: str
    calls: list[AgentCall] = field(default_factory=list)
    local_ids: bool = True
    scope: str | None = None
    spawned_by: tuple[str, int] | None = None


# -- ids ---------------------------------------------------------------------------------------


def scope_key(name: str) -> int:
    """A stable 64-bit key of a scope name (a session id, a trace's tenant): keyed BLAKE2b."""
    return int.from_bytes(
        hashlib.blake2b(name.encode("utf-8"), digest_size=8, key=b"replayer.scope.v1").digest(), "big"
    )


def salt_ids(ids: np.ndarray, key: int) -> np.ndarray:
    """``ids`` (int64 bit patterns) moved into the scope ``key``: ``mix64(mix64(key) ^ id)`` cut
    to 62 bits. The same id in one scope maps to the same id; two scopes share none (but by a
    ~2**-62 chance per pair). Vectorised SplitMix64 finalizer (``replayer.core.hashing``)."""
    z = mix64_array(np.asarray(ids, dtype=np.int64).view(np.uint64) ^ np.uint64(_mix(key)))
    return (z & np.uint64(ID_MASK)).astype(np.int64)


class _FreshIds:
    """Fresh block ids of one session: block n is ``salt_ids([n], key)`` (never shared)."""

    def __init__(self, key: int) -> None:
        self.key = _mix(key ^ 0x5EED_0F_F2E5)
        self.n = 0

    def take(self, k: int) -> np.ndarray:
        out = salt_ids(np.arange(self.n, self.n + k, dtype=np.int64), self.key)
        self.n += k
        return out


# -- source files ------------------------------------------------------------------------------


def read_records(path: str, probs: _Problems) -> Iterator[tuple[int, Any]]:
    """JSON records of ``path``: one per line (JSONL), the items of a JSON array, or one JSON
    object (a file holding one session). ``.gz`` files are decompressed. Yields (1-based record
    number: the line, or the array index + 1, value); a line that is not JSON is a problem."""
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
    except (OSError, EOFError) as e:
        probs.add(0, "file", f"cannot read: {getattr(e, 'strerror', None) or e}")
        return
    head = data.lstrip()[:1]
    if head in (b"[", b"{"):
        try:
            whole = orjson.loads(data)
        except orjson.JSONDecodeError:
            whole = None  # JSONL of objects
        if isinstance(whole, list):
            yield from enumerate(whole, 1)
            return
        if isinstance(whole, dict):
            yield 1, whole
            return
    for lineno, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            yield lineno, orjson.loads(line)
        except orjson.JSONDecodeError as e:
            probs.add(lineno, "json", f"invalid JSON: {e}")


_SNIFF_KEYS = ("requests", "turns", "round_index", "input_tokens_total")


def first_record(path: str) -> Any:
    """The first JSON record of ``path`` (for format detection), or None. Reads at most 1 MiB: a
    first record longer than that (a Weka session can be megabytes) is judged by the keys that
    appear in its first 64 KiB (the top-level keys come before the long lists)."""
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            head = f.read(1 << 20)
    except (OSError, EOFError):
        return None
    s = head.lstrip()
    if s[:1] not in (b"{", b"["):
        return None
    for text in (s.split(b"\n", 1)[0], s):
        try:
            v = orjson.loads(text)
        except orjson.JSONDecodeError:
            continue
        return (v[0] if v else None) if isinstance(v, list) else v
    return {k: None for k in _SNIFF_KEYS if b'"%s"' % k.encode() in s[:65536]}


def sniff(path: str) -> str | None:
    """The agentic format of a JSON/JSONL file from its first record's keys, or None:
    ``requests`` -> weka, ``turns`` -> copilot, ``round_index``/``input_tokens_total`` -> tracelab."""
    rec = first_record(path)
    if not isinstance(rec, dict):
        return None
    if "requests" in rec:
        return "weka"
    if "turns" in rec:
        return "copilot"
    if "round_index" in rec or "input_tokens_total" in rec:
        return "tracelab"
    return None


# -- value helpers for the readers ---------------------------------------------------------------


def get_int(
    obj: dict, key: str, rec: int, where: str, probs: _Problems, minimum: int = 0, required: bool = True
) -> int | None:
    """``obj[key]`` as an int >= ``minimum`` (a whole float is accepted), or None with a problem."""
    name = f"{where}.{key}" if where else key
    if key not in obj or obj[key] is None:
        if required:
            probs.add(rec, name, "missing")
        return None
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        probs.add(rec, name, f"expected a whole number, got {v!r}"[:120])
        return None
    if v < minimum:
        probs.add(rec, name, f"{int(v)} is not allowed: must be >= {minimum}")
        return None
    return int(v)


def get_float(obj: dict, key: str, rec: int, where: str, probs: _Problems, required: bool = True) -> float | None:
    """``obj[key]`` as a finite number >= 0, or None (with a problem when present and bad, or required)."""
    name = f"{where}.{key}" if where else key
    if key not in obj or obj[key] is None:
        if required:
            probs.add(rec, name, "missing")
        return None
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
        probs.add(rec, name, f"expected a finite number >= 0, got {v!r}"[:120])
        return None
    return float(v)


def parse_time_ns(v: Any, rec: int, name: str, probs: _Problems) -> int | None:
    """An ISO-8601 date-time (``Z`` or an offset; no zone = UTC) -> ns since the epoch."""
    if not isinstance(v, str):
        probs.add(rec, name, "missing" if v is None else f"expected an ISO-8601 date-time string, got {v!r}"[:120])
        return None
    try:
        d = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        probs.add(rec, name, f"not an ISO-8601 date-time: {v!r}"[:120])
        return None
    if d.tzinfo is None:
        d = d.replace(tzinfo=timezone.utc)
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    delta = d - epoch
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def _at(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


# -- the one mapping to canonical rows -------------------------------------------------------


def _call_ids(
    c, s: AgentSession, key: int, fresh: _FreshIds, prev_ids: np.ndarray | None, prev_len: int, B: int, probs: _Problems
) -> tuple[np.ndarray | None, bool]:
    """Call ``c``'s hash ids (its own, salted when local; or the previous call's reused full blocks
    then fresh ones) and whether its reused prefix was cut to the previous call's full blocks;
    (None, False) with the problem added when they cannot be."""
    n_blocks = -(-c.input_length // B)
    if c.hash_ids is not None:
        ids = np.asarray(c.hash_ids, dtype=np.int64)
        if ids.size != n_blocks:
            probs.add(
                c.record,
                _at(c.where, "hash_ids"),
                f"expected {n_blocks} hash ids (ceil(input_length {c.input_length} / block_size {B})), got {ids.size}",
            )
            return None, False
        return (salt_ids(ids, key) if s.local_ids else ids), False
    r = c.reused_tokens or 0
    if r > c.input_length:
        probs.add(
            c.record,
            _at(c.where, "reused"),
            f"reused prefix {r} tokens is longer than the prompt ({c.input_length} tokens)",
        )
        return None, False
    k_blocks = min(r // B, prev_len // B)
    shared = prev_ids[:k_blocks] if prev_ids is not None else np.empty(0, np.int64)
    return np.concatenate((shared, fresh.take(n_blocks - k_blocks))), r // B > prev_len // B


def sessions_to_raw(
    sessions: list[AgentSession], fmt: str, block_size: int, probs: _Problems, notes: list[str] | None = None
) -> _Raw | None:
    """Canonical raw rows of ``sessions`` (module docstring); None when there is no call.

    Problems found here (a reused prefix longer than the call's prompt, hash ids that do not
    match ``input_length``) name the call's record and field. ``notes`` are joined into the
    metadata key ``notes`` (what was adjusted, with counts)."""
    B = block_size
    out: list[tuple] = []  # (time_ns, record, input, output, ids, session, turn, wait, model, parent)
    cut = 0
    spawns = any(s.spawned_by is not None for s in sessions)
    for s in sessions:
        key = scope_key(s.scope or s.session_id)
        fresh = _FreshIds(scope_key(s.session_id))
        prev_ids: np.ndarray | None = None
        prev_len = 0
        for k, c in enumerate(s.calls):
            ids, was_cut = _call_ids(c, s, key, fresh, prev_ids, prev_len, B, probs)
            if ids is None:
                continue
            cut += was_cut
            parent: str | None
            if k > 0:
                parent = f"{s.session_id}#{k - 1}"
            else:
                parent = f"{s.spawned_by[0]}#{s.spawned_by[1]}" if s.spawned_by is not None else None
            out.append(
                (
                    c.time_ns,
                    c.record,
                    c.input_length,
                    c.output_length,
                    ids,
                    s.session_id,
                    k,
                    np.nan if c.wait_s is None else c.wait_s,
                    c.model,
                    parent,
                )
            )
            prev_ids, prev_len = ids, c.input_length
    if cut and notes is not None:
        notes.append(f"{cut} calls reused more tokens than the previous call's full blocks: cut to them")
    if not out:
        if not probs:
            probs.add(0, "file", "no LLM calls (empty trace)")
        return None
    out.sort(key=lambda r: r[0])  # time order (stable): sessions interleave as they ran
    ts, rows, il, ol, hvals, sid, turn, think, model, parents = (list(col) for col in zip(*out))
    hlen = [ids.size for ids in hvals]
    n = len(rows)
    ones = np.ones(n, dtype=bool)
    meta = {"format": fmt, "time_unit": "ns", "block_size": str(B), "hash_id_scope": "local"}
    if notes:
        meta["notes"] = "; ".join(notes)
    optional: dict[str, Any] = {"session_id": sid, "turn": turn, "think_time_s": np.asarray(think, dtype=np.float64)}
    if any(m is not None for m in model):
        optional["model"] = model
    if spawns:  # a spawned session waits on a call of another: gate by request (session, call) ids
        optional["request_id"] = [f"{a}#{k}" for a, k in zip(sid, turn)]
        optional["parent_request_id"] = parents
    return _Raw(
        np.asarray(rows, dtype=np.int64),
        np.asarray(ts, dtype=np.int64),
        ones,
        np.asarray(il, dtype=np.int64),
        ones.copy(),
        np.asarray(ol, dtype=np.int64),
        ones.copy(),
        np.asarray(hlen, dtype=np.int64),
        np.concatenate(hvals) if hvals else np.empty(0, np.int64),
        ones.copy(),
        optional,
        1,
        B,
        meta,
    )
