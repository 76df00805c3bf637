"""A request's session identity: the session gate's keys, its think time, the session header.

Sessions: with a ``parent_request_id`` column a row waits on its parent's request id; otherwise
a row with a ``session_id`` waits on its session (``replayer.plan.sessions``). Keys carry the loop
number, so a session of loop k+1 never waits on loop k. ``--session-header`` sends the session id
in a header routers read (presets for Dynamo and AIBrix).
"""

from __future__ import annotations

import math

from replayer.core.request import PreparedRequest
from replayer.plan.schedule import column_value

__all__ = ["SESSION_HEADER_PRESETS", "session_header_lines", "session_header_value", "session_keys"]


#: ``--session-header`` presets: the header names routers read a session id from. Dynamo
#: (docs "Identify Agent Sessions"): ``X-Dynamo-Session-ID``; AIBrix (gateway
#: ``HeaderSessionKey``): ``x-aibrix-session-key``, read only with the ``session-affinity``
#: routing strategy, so the preset also sends ``routing-strategy: session-affinity``.
SESSION_HEADER_PRESETS = {
    "dynamo": ("X-Dynamo-Session-ID",),
    "aibrix": ("x-aibrix-session-key", "routing-strategy: session-affinity"),
}


def session_header_lines(setting: str | None) -> bytes | None:
    """The header lines of ``--session-header`` as a bytes template with one ``%s`` (the value)."""
    if setting is None:
        return None
    name, *extra = SESSION_HEADER_PRESETS.get(setting.lower(), (setting,))
    return b"".join([name.encode("ascii") + b": %s\r\n", *(e.encode("ascii") + b"\r\n" for e in extra)])


def session_header_value(session: str, loop: int) -> bytes:
    """A session id as a header value: the id itself in loop 0, ``<id>.loop<k>`` in loop k (another
    pass is another conversation); bytes outside visible ASCII and ``%`` percent-encoded (UTF-8)."""
    from urllib.parse import quote

    v = session if loop == 0 else f"{session}.loop{loop}"
    return quote(v, safe="".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")).encode("ascii")


def session_keys(req: PreparedRequest, t: object, i: int, loop: int, session: str | None) -> None:
    """The session gate's keys of row ``i`` of batch ``t`` (pass ``loop``): with a
    ``parent_request_id`` column it waits on its parent's request id (``key``: its own), else on
    its session; a row that waits gets its ``think_time_s`` too."""
    parents = getattr(t, "parent_request_id", None)
    rid = column_value(t, "request_id", i)
    if parents is not None and (rid is not None or parents[i] is not None):
        parent = parents[i]
        req.key = (loop, "r", rid) if rid is not None else None
        req.dep = (loop, "r", parent) if parent is not None else None
    elif session is not None:  # (also a row of a mix whose own trace has no request chains)
        req.key = req.dep = (loop, "s", session)
    if req.dep is not None:
        think = column_value(t, "think_time_s", i)
        if think is not None and not math.isnan(think):
            req.think_ns = int(round(float(think) * 1e9))
