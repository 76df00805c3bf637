"""Several targets (``--target URL`` repeated): which target each request goes to, and the sender
that sends it there.

The rule (``--target-policy``), a pure function of the row (``target_index``):

* a row with a ``session_id`` goes where its session goes. A session's target is chosen once,
  for its first turn, and every later turn follows it (so the prefix cache its first turn built
  is on the server its later turns reach):

  - ``session-order`` (default): sessions are numbered 0, 1, 2... by their first appearance in
    the whole time-sorted trace (every row, before ``--shard``/``--workers`` split it and before
    ``--resume`` skips rows), and session k goes to target k mod N: round robin over sessions,
    as even as the sessions are. The numbering reads every row of the trace, so it is the same
    in every shard, every worker, a resumed run and every loop;
  - ``session-hash``: target = a keyed 64-bit BLAKE2b hash of the session id mod N (a key other
    than the shard split's, so shard i is not tied to target i); needs no numbering, so a
    session keeps its target across traces that share session ids, less even on few sessions.
* a row without a session goes by its global row number (0-based, time-sorted trace) mod N.

Changing the number of targets (or their order) between a run and its resume moves sessions.

``TargetRoute`` applies the rule to trace batches in schedule order (``replayer.plan.schedule``);
``RoutingSender`` holds one sender (one client, own connection pool) per target and hands each
prepared request to the sender of its ``target``. A target that is down fails its own requests
(recorded per request as with one target); the others go on.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from replayer.core.request import PreparedRequest
    from replayer.http.client import Client
    from replayer.http.launcher import Launcher
    from replayer.send.sender import Refusal, Sender, Sending

POLICIES = ("session-order", "session-hash")
_HASH_KEY = b"replayer-target"


def session_hash(session_id: object) -> int:
    """The 64-bit hash ``session-hash`` takes mod N (keyed BLAKE2b of the id's text)."""
    digest = hashlib.blake2b(str(session_id).encode(), digest_size=8, key=_HASH_KEY).digest()
    return int.from_bytes(digest, "little")


def target_index(policy: str, n: int, row: int, session_id: object = None, session_number: int | None = None) -> int:
    """The target (0-based index of ``--target``) of global trace row ``row`` among ``n``:
    by session (``session_number``: its session's number by first appearance, for
    ``session-order``) or, without a session, by row (module docstring)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if policy not in POLICIES:
        raise ValueError(f"target policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if session_id is None:
        return row % n
    if policy == "session-hash":
        return session_hash(session_id) % n
    if session_number is None:
        raise ValueError("session-order needs the session's number")
    return session_number % n


class TargetRoute:
    """Applies ``target_index`` to every row of the trace batches, in schedule order (the
    ``session-order`` numbering grows with the sessions seen: one entry per distinct session)."""

    def __init__(self, policy: str, n: int) -> None:
        target_index(policy, n, 0)  # (checks the policy and n)
        self.policy, self.n = policy, n
        self.numbers: dict[object, int] = {}

    def apply(self, batch: object, rows: np.ndarray) -> np.ndarray:
        """Target index (int64) of each row of ``batch``; ``rows``: their global row numbers.
        Per distinct session of the batch, not per row: its sessions in order of first
        appearance (``pyarrow``'s ``unique``), then each row looks its session up."""
        import pyarrow as pa
        import pyarrow.compute as pc

        out = np.asarray(rows, dtype=np.int64) % self.n
        sessions = getattr(batch, "session_id", None)
        if sessions is None:
            return out
        if isinstance(sessions, pa.Array | pa.ChunkedArray):
            col = sessions
        else:
            try:
                col = pa.array(sessions, type=pa.string())
            except (pa.ArrowInvalid, pa.ArrowTypeError):  # (other values: their text, as the shard split)
                col = pa.array([None if x is None else str(x) for x in sessions], type=pa.string())
        if col.null_count == len(col):
            return out
        uniques = pc.drop_null(pc.unique(col))
        per_session = np.empty(len(uniques), dtype=np.int64)
        numbers = self.numbers
        for k, s in enumerate(uniques.to_pylist()):
            if self.policy == "session-order":
                num = numbers.get(s)
                if num is None:
                    num = numbers[s] = len(numbers)
                per_session[k] = target_index(self.policy, self.n, 0, s, num)
            else:
                per_session[k] = target_index(self.policy, self.n, 0, s)
        idx = pc.index_in(col, value_set=uniques)
        has = np.asarray(pc.is_valid(idx).to_numpy(zero_copy_only=False), dtype=bool)
        out[has] = per_session[np.asarray(pc.drop_null(idx).to_numpy(zero_copy_only=False), dtype=np.int64)]
        return out


class RoutingSender:
    """One sender per target; each request goes through the sender of its ``target`` (its URL,
    set from the route when it was prepared). ``ahead_ns`` is the senders' (all alike)."""

    def __init__(self, senders: "dict[str, Sender]") -> None:
        if not senders:
            raise ValueError("no target")
        self.senders = senders
        self.ahead_ns = min(s.ahead_ns for s in senders.values())

    def send(self, req: "PreparedRequest", due_ns: int) -> "Sending":
        return self.senders[req.target].send(req, due_ns)  # type: ignore[index]

    def send_queued(self, req: "PreparedRequest", due_ns: int, wait_ns: int) -> "Sending":
        return self.senders[req.target].send_queued(req, due_ns, wait_ns)  # type: ignore[index]

    def hand_over(self, req: "PreparedRequest", due_ns: int) -> "Sending | Refusal | None":
        return self.senders[req.target].hand_over(req, due_ns)  # type: ignore[index]

    def expect(self, n: int) -> None:
        # the split of the next n requests is not known here: each target gets connections for
        # all of them (connections ahead are cheap; a request that finds none opens one, late)
        for s in self.senders.values():
            s.expect(n)


def share_launcher(clients: list["Client"], launcher: "Launcher") -> None:
    """Let every client write through one launcher process (``Client.use_launcher``): its reports
    go to each client, and each takes only the writes it queued (unknown tokens are ignored)."""
    for c in clients:
        c.use_launcher(launcher)
    if len(clients) > 1:
        hooks = [c.on_launched for c in clients]

        def on_launched(token: int, sent: int, written: int, err: int) -> None:
            for hook in hooks:
                hook(token, sent, written, err)

        launcher.attach(on_launched)


def senders_for(clients: "dict[str, Client]", *, writes_ahead: bool, shard: int) -> "Sender":
    """The run's sender over its clients (one per target URL): each client's ``LauncherSender``
    when the launcher process writes requests ahead (``writes_ahead``), else its ``LoopSender``;
    with several targets, a ``RoutingSender`` over them."""
    from replayer.send.sender import LauncherSender, LoopSender

    one = LauncherSender if writes_ahead else LoopSender
    senders: dict[str, Sender] = {url: one(c, shard=shard) for url, c in clients.items()}
    if len(senders) == 1:
        return next(iter(senders.values()))
    return RoutingSender(senders)
