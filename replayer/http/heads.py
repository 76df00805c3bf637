"""The HTTP/1.1 head of each request of the hot-path client: the request line and the fixed
headers, built once per path, then a request's own headers (``PreparedRequest.headers``: its
``X-Request-Id``, session and trace headers) and its Content-Length."""

from __future__ import annotations

from urllib.parse import urlsplit

from replayer.core.request import PreparedRequest

__all__ = ["RequestHeads"]


class RequestHeads:
    """The heads of requests to ``base_url + endpoint`` (or ``base_url + req.path``), with the
    bearer token ``api_key`` (never logged)."""

    def __init__(self, base_url: str, endpoint: str, api_key: str | None) -> None:
        u = urlsplit(base_url.rstrip("/") + endpoint)
        self._host = u.netloc.rsplit("@", 1)[-1]
        self._base_path = urlsplit(base_url).path.rstrip("/")
        self._api_key = api_key
        self._default = self._fixed((u.path or "/") + (f"?{u.query}" if u.query else ""))
        self._by_path: dict[str, bytes] = {}

    def _fixed(self, path: str) -> bytes:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self._host}\r\nUser-Agent: replayer\r\n"
            "Content-Type: application/json\r\nAccept: text/event-stream, application/json\r\n"
        )
        if self._api_key:
            head += f"Authorization: Bearer {self._api_key}\r\n"
        return head.encode("latin-1")

    def _for(self, path: str | None) -> bytes:
        if path is None:
            return self._default
        head = self._by_path.get(path)
        if head is None:
            head = self._by_path[path] = self._fixed(self._base_path + path)
        return head

    def head(self, req: PreparedRequest) -> bytes:
        """``req``'s HTTP head (request line and headers, its own ``headers`` and Content-Length)."""
        return b"".join((self._for(req.path), req.headers, b"Content-Length: %d\r\n\r\n" % len(req.body)))

    def request(self, req: PreparedRequest) -> bytes:
        """The whole HTTP request: head and ``req.body``."""
        return b"".join((self.head(req), req.body))
