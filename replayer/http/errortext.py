"""The text a failed request keeps: the server's message out of an error value of any shape, a
short piece of a body that could not be read, and the length every error text is cut to."""

from __future__ import annotations

import orjson

ERROR_TEXT_LIMIT = 500  # characters of error text kept per request


def error_message(x: object, depth: int = 0) -> str:
    """The human-readable text of an error value of any common shape (a string; a dict's
    ``message``, ``error``, ``detail`` or ``msg``, nested; else its JSON)."""
    if isinstance(x, str):
        return x
    if isinstance(x, dict) and depth < 8:
        for key in ("message", "error", "detail", "msg"):
            v = x.get(key)
            if v is not None:
                return error_message(v, depth + 1)
    try:
        return orjson.dumps(x).decode()
    except TypeError:
        return repr(x)


def snippet(b: bytes | str, n: int = 200) -> str:
    """The first ``n`` characters of ``b`` (bytes decoded, invalid UTF-8 replaced)."""
    s = b.decode("utf-8", "replace") if isinstance(b, (bytes, bytearray)) else b
    return s[:n]
