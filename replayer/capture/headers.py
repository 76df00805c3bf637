"""The headers a hop passes on: a request's and a response's headers without the hop-by-hop
ones (RFC 9110 7.6.1: ``Connection`` and the headers it names, ``Keep-Alive``, ``Proxy-*``,
``TE``, ``Trailer``, ``Transfer-Encoding``, ``Upgrade``) and those each hop sets for itself
(``Host``, ``Content-Length``), and the response head the capture proxy writes to its client."""

from __future__ import annotations

HOP_BY_HOP = frozenset(
    (
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    )
)
#: set again by each hop
PER_HOP = frozenset(("host", "content-length"))
#: headers aiohttp would add of its own to a forwarded request: left to the client's
SKIP_AUTO = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


def forward_headers(headers: list[tuple[str, str]], extra_drop: frozenset = frozenset()) -> list[tuple[str, str]]:
    """``headers`` without the hop-by-hop ones (and those the ``Connection`` header names)."""
    named = {t.strip().lower() for k, v in headers if k.lower() == "connection" for t in v.split(",")}
    drop = HOP_BY_HOP | named | extra_drop
    return [(k, v) for k, v in headers if k.lower() not in drop]


def response_head(
    status: int, reason: bytes, headers: list[tuple[str, str]], framing: str | None, keep_alive: bool, http10: bool
) -> bytes:
    """The client's response head: status line, ``headers``, the framing header (``framing``:
    ``Transfer-Encoding: chunked`` / ``Content-Length: N`` / None) and ``Connection`` when needed."""
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, reason or b"-")]
    lines += [f"{k}: {v}\r\n".encode("latin-1", "replace") for k, v in headers]
    if framing is not None:
        lines.append(framing.encode() + b"\r\n")
    if not keep_alive:
        lines.append(b"Connection: close\r\n")
    elif http10:
        lines.append(b"Connection: keep-alive\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)
