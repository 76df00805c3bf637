"""Server-sent-event decoding (sans-I/O, hot path): bytes of each read -> events.

Free of I/O so it can be tested byte by byte; ``replayer.http.chunks`` interprets the events' data as
OpenAI chunks and measures the request.

``SSEDecoder``
    Incremental decoder for ``text/event-stream`` following the WHATWG HTML Living Standard,
    section 9.2 "Server-sent events", subsection "Interpreting an event stream"
    (https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation):

    * a byte buffer carries over between reads; nothing is trimmed or dropped because of where a
      transport read happened to split the stream (client-faults B02);
    * a line ends at LF, CR or CRLF, including a CR that ends one read and an LF that begins the
      next (one line end, not two);
    * a single leading UTF-8 BOM of the stream is dropped; only complete lines are UTF-8 decoded,
      so a multi-byte character split across reads is decoded correctly (client-faults B26);
      invalid sequences become U+FFFD, as the spec's "UTF-8 decode" does (one per maximal invalid
      subpart), and are counted in ``invalid_utf8``: never fatal;
    * a line starting with ``:`` is a comment (keep-alive) and is ignored; otherwise the field name
      runs up to the first ``:`` and exactly one leading space of the value is removed (``data:x``
      and ``data: x`` are the same field, B09); a line without ``:`` is a field with an empty value;
    * ``data`` lines are joined with ``\\n``; ``event`` sets the type; ``id`` sets the last event ID
      unless it contains NUL; ``retry`` is used only if it is ASCII digits; other fields are ignored,
      but ``error``: llama.cpp's server (before it sent ``data: {"error": ...}``) reports a failure
      mid-stream as one ``error: {"code", "message", "type"}`` line, not an event, so the spec's
      decoder would drop the server's message. Its value is kept in ``errors`` (no event is
      dispatched for it: the stream's own events are unchanged);
    * a blank line dispatches the event, unless it has no ``data`` line at all (B10); an event still
      incomplete at EOF is discarded (``close()`` reports it).

    Each read is cut after its last line end; the complete lines are UTF-8 decoded in one call
    (a read holding a CR first has CRLF and CR normalised to LF). The common case, a text that is
    exactly ``data: P\\n\\n`` repeated with nothing pending, becomes events with one ``str.split``;
    anything else goes line by line. Nothing loops over bytes in Python.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SSEEvent", "SSEDecoder", "FFFD", "lossy_utf8"]

_BOM = b"\xef\xbb\xbf"
FFFD = "\ufffd".encode()  # a U+FFFD the server sent itself (not an invalid sequence)


def lossy_utf8(b: bytes) -> str:
    """UTF-8 decode with each maximal invalid subpart replaced by one U+FFFD (WHATWG "UTF-8
    decode"; Python's ``errors="replace"`` follows the same rule)."""
    return b.decode("utf-8", "replace")


@dataclass(slots=True)
class SSEEvent:
    """One dispatched server-sent event.

    ``data``: the event's ``data`` lines joined with ``"\\n"`` (no trailing newline).
    ``event``: the ``event`` field, ``""`` when absent (the spec's default type "message").
    ``id``: the last event ID at dispatch time (it persists across events, as in the spec);
    ``None`` if no ``id`` field has been seen on this decoder.
    ``retry``: the reconnection time in ms given by a valid ``retry`` field inside this event's
    block, else ``None``.
    """

    data: str
    event: str = ""
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    """Incremental ``text/event-stream`` decoder (WHATWG grammar; see the module docstring).

    Feed it the raw bytes of each transport read in order; it returns the events whose closing
    blank line arrived in that read. One decoder per response stream.

    Attributes (read-only): ``last_event_id`` (str | None) and ``retry`` (int ms | None, the last
    valid ``retry`` field) persist across events and across ``close()``, as an EventSource keeps
    them across reconnections; ``invalid_utf8`` (int) counts the invalid UTF-8 sequences decoded
    as U+FFFD (bytes handed out by ``simple_event`` are not decoded here: the accumulator counts
    those); ``errors`` (list[str]) the values of the stream's ``error`` fields, in order
    (llama.cpp's in-band error; see the module docstring), kept by ``close()``.
    """

    __slots__ = (
        "_rest",
        "_data",
        "_event",
        "_retry",
        "_pend",
        "_skip_lf",
        "_head",
        "last_event_id",
        "retry",
        "invalid_utf8",
        "errors",
    )

    def __init__(self) -> None:
        self.last_event_id: str | None = None
        self.retry: int | None = None
        self.invalid_utf8 = 0  # invalid UTF-8 sequences replaced by U+FFFD so far (kept by close())
        self.errors: list[str] = []  # values of ``error`` fields (llama.cpp's in-band error; kept by close())
        self._reset()

    def _reset(self) -> None:
        self._rest: list[bytes] = []  # pieces of the current partial line (no line end in them)
        self._data: list[str] = []  # data lines of the event being built
        self._event = ""  # event type of the event being built
        self._retry: int | None = None  # retry field of the event being built
        self._pend = False  # the event being built has a data/event/retry field
        self._skip_lf = False  # previous read ended with CR: drop one LF at the next
        self._head: bytes | None = b""  # bytes seen while a leading BOM is still possible

    def feed(self, chunk: bytes) -> list[SSEEvent]:  # noqa: C901, PLR0912
        """Consume one read's bytes; return the events completed by it (possibly empty), in order."""
        if not chunk:
            return []
        if type(chunk) is not bytes:
            chunk = bytes(chunk)
        if self._head is not None:  # start of stream: drop one UTF-8 BOM, even if split
            head = self._head + chunk
            if len(head) < 3 and _BOM.startswith(head):
                self._head = head
                return []
            self._head = None
            chunk = head[3:] if head.startswith(_BOM) else head
            if not chunk:
                return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == 10:
                chunk = chunk[1:]
                if not chunk:
                    return []
        rest = self._rest
        if 13 in chunk:  # (int membership is a memchr; b"\r" in chunk is several times slower)
            # General path: cut after the last CR or LF, then normalise CRLF and CR to LF.
            if rest:
                rest.append(chunk)
                chunk = b"".join(rest)
                rest.clear()
            i = max(chunk.rfind(b"\r"), chunk.rfind(b"\n")) + 1  # >= 1
            if i < len(chunk):
                rest.append(chunk[i:])
                chunk = chunk[:i]
            elif chunk[-1] == 13:  # ends with CR: an LF starting the next read belongs to it
                self._skip_lf = True
            text = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        elif chunk[-1] == 10:  # LF-only read ending at a line end (the common case)
            if rest:
                rest.append(chunk)
                text = b"".join(rest)
                rest.clear()
            else:
                text = chunk
        else:  # LF-only read: cut after its last LF, the rest waits for its line end
            i = chunk.rfind(b"\n") + 1
            if not i:
                rest.append(chunk)
                return []
            if rest:
                rest.append(chunk[:i])
                text = b"".join(rest)
                rest.clear()
            else:
                text = chunk[:i]
            rest.append(chunk[i:])
        # ``text``: complete lines only, each ending with LF.
        try:  # no character is cut at a line end (LF and CR never occur inside one)
            s = text.decode("utf-8")
        except UnicodeDecodeError:
            s = lossy_utf8(text)
            self.invalid_utf8 += s.count("\ufffd") - text.count(FFFD)
        # Fast path: nothing pending and the text is exactly "data: P1\n\ndata: P2\n\n..." with
        # no LF inside any P: each P is one event's data.
        if not self._pend and s[:6] == "data: " and s[-2:] == "\n\n":
            parts = s[6:-2].split("\n\ndata: ")
            for p in parts:
                if "\n" in p:
                    break
            else:
                lid = self.last_event_id
                return [SSEEvent(p, "", lid) for p in parts]
        out: list[SSEEvent] = []
        line = self._line
        for ln in s[:-1].split("\n"):
            line(ln, out)
        return out

    def simple_event(self, chunk: bytes) -> bytes | None:
        """Fast path for the most common read: exactly one ``data: P\\n\\n`` event (LF line
        ends, one data line, nothing pending, stream start already seen). Returns P as bytes —
        the data ``feed`` would return for it — or None when the read needs ``feed``."""
        if (
            self._head is None
            and not self._rest
            and not self._pend
            and not self._skip_lf
            and chunk[:6] == b"data: "
            and chunk[-2:] == b"\n\n"
            and chunk.count(10) == 2
            and 13 not in chunk
        ):
            return chunk[6:-2]
        return None

    def _line(self, ln: str, out: list[SSEEvent]) -> None:
        if not ln:  # blank line: dispatch
            if self._pend:
                data = self._data
                if data:
                    out.append(SSEEvent("\n".join(data), self._event, self.last_event_id, self._retry))
                    self._data = []
                self._event = ""
                self._retry = None
                self._pend = False
            return
        if ln[0] == ":":  # comment / keep-alive
            return
        name, colon, value = ln.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._pend = True
        elif name == "event":
            self._event = value
            self._pend = True
        elif name == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif name == "retry":
            if value.isascii() and value.isdigit():
                self._retry = self.retry = int(value)
                self._pend = True
        elif name == "error":  # (not a WHATWG field: llama.cpp's in-band error, kept, not dispatched)
            self.errors.append(value)

    def close(self) -> bool:
        """End of stream. Discard any incomplete event or partial line (the spec's rule) and reset
        the buffers for reuse. Return True if something was pending (bytes after the last line
        end, or an event with fields but no closing blank line), else False."""
        pending = bool(self._rest) or self._pend or bool(self._head)
        self._reset()
        return pending
