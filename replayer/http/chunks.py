"""OpenAI stream measurement (sans-I/O, hot path): the events of ``replayer.http.sse`` -> one request's
tokens, times and outcome.

``StreamAccumulator`` interprets the data of each event as an OpenAI ``/v1/completions`` or ``/v1/chat/completions``
streaming chunk (``choices[].text`` / ``choices[].delta.content``, ``finish_reason``, ``usage``,
``data: [DONE]``) or a whole non-streaming JSON body, and measures the request with the metric
definitions of ``shared/cases/client-faults.md`` ("Conventions used by the expected values"):

* an event's time is the arrival time of the read that completed it (one clock reading per
  read; B02, B04);
* TTFT: first choice event carrying >= 1 token; never 0 when unmeasured (B05, B18);
* E2E ("last"): last choice event carrying tokens or a ``finish_reason``; usage-only events,
  keep-alives and ``[DONE]`` never move it (B04, B08);
* N: ``usage.completion_tokens`` of the last non-null usage object (B11); without it N is
  unknown (None), and so are TPOT and ITL: a count of token-carrying events is only an
  estimate, kept apart as ``output_tokens_estimate``;
* TPOT = (last - first) / (N - 1), only for N >= 2 with TTFT measured (B25);
* ITL: token-weighted, a gap ending in an event with k tokens gives k samples of gap/k; gaps
  ending in zero-token events merge into the next token-carrying gap (B04, B07, B12); empty
  (unknown) unless the per-event counts add up to N;
* per-event token counts: the increases of the running ``usage.completion_tokens`` when every
  choice event carries usage (vLLM ``continuous_usage_stats``); otherwise 1 per event with
  non-empty text/content/reasoning, and if usage then reports more tokens than were counted
  and the last choice event (e.g. an empty-text ``finish_reason: "stop"`` chunk) came after the
  last counted one, that last event carries the missing ones (so sum(ITL) == E2E - TTFT);
* invalid UTF-8 in an event (B26) becomes U+FFFD before JSON parsing and is counted in
  ``invalid_utf8``; the request goes on (the rule of the decoder, applied to the bytes that
  ``SSEDecoder.simple_event`` and whole bodies hand over undecoded);
* a non-streaming body is one choice event at its arrival time; TPOT and ITL are not
  observable there (None / empty);
* an error object of any shape anywhere fails the request (B06, B13), and so does llama.cpp's
  in-band ``error: {...}`` line (``SSEDecoder.errors``, handed in by ``on_error_field``); a response with neither
  choices nor usage is a protocol failure (B13); a stream that ends without ``finish_reason``,
  ``[DONE]`` or usage is incomplete; token counts never come from request parameters.

Times are integer nanoseconds of the caller's monotonic clock; durations are float milliseconds.
"""

from __future__ import annotations

from typing import Any

import orjson

from replayer.core.errors import ErrorKind
from replayer.core.timestamps import itl_ms, tpot_ms
from replayer.http.errortext import ERROR_TEXT_LIMIT, error_message, snippet
from replayer.http.sse import FFFD, lossy_utf8
from replayer.http.tokencounts import token_events

__all__ = ["StreamAccumulator", "ERROR_TEXT_LIMIT"]

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError


class StreamAccumulator:
    """Interprets OpenAI completions / chat-completions responses and measures one request.

    Streaming: call ``on_event(data, t_ns)`` for each SSE event (``SSEEvent.data``), stamped with
    the arrival time of the read that completed it, then ``finish()`` at EOF. Non-streaming: call
    ``on_body(body, t_ns)`` once with the whole JSON body, then ``finish()``.

    Results (read after ``finish()``; the measurement attributes and ``itl_ms()``/``tpot_ms()`` are
    also valid at any earlier moment, for a request cut short):

    * ``success`` (bool), ``error_kind`` (``ErrorKind``: NONE, STREAM_ERROR, PROTOCOL or
      INCOMPLETE), ``error`` (str | None, at most 500 chars: the server's message, or what was
      wrong);
    * ``first_token_ns`` / ``last_token_ns`` (int ns | None): the TTFT and E2E event times;
    * ``prompt_tokens`` / ``completion_tokens`` / ``total_tokens`` (int | None) from the last
      non-null usage object; ``image_tokens`` (int | None) its
      ``prompt_tokens_details.image_tokens`` (SGLang) or ``.multimodal_tokens.image`` (vLLM 0.32,
      with ``--enable-prompt-tokens-details``; None when the server reported neither);
      ``usage_seen``; ``output_tokens`` (int | None: completion_tokens; None without usage);
      ``output_tokens_estimate`` (int: tokens counted per event, an estimate for a stream
      without usage); ``n_chunks`` (choice events); ``finish_reason``; ``done_seen``;
      ``invalid_utf8`` (invalid UTF-8 sequences replaced by U+FFFD in data handed in as bytes);
    * ``text`` (str | None): the generated text (completions ``text`` / chat ``content``), only
      when constructed with ``keep_text=True``.

    Token-carrying: a choice with non-empty ``text``, ``delta.content``, ``delta.reasoning_content``,
    ``delta.reasoning`` or ``delta.tool_calls`` (``message.*`` for a non-streaming body). When every
    choice event with text or a finish_reason carries a usage object (vLLM
    ``continuous_usage_stats``), per-event token counts
    are instead the increases of the running ``completion_tokens`` (an event whose count rose
    carries tokens even with empty text; one whose count did not rise carries none).
    """

    __slots__ = (
        "success",
        "error_kind",
        "error",
        "prompt_tokens",
        "image_tokens",
        "completion_tokens",
        "total_tokens",
        "usage_seen",
        "n_chunks",
        "finish_reason",
        "done_seen",
        "_times",
        "_flags",
        "_totals",
        "_stream_err",
        "_proto_err",
        "_body",
        "_other",
        "_texts",
        "_dirty",
        "_first",
        "_last",
        "_tok_t",
        "_tok_k",
        "_n_out",
        "invalid_utf8",
    )

    def __init__(self, keep_text: bool = False) -> None:
        self.success = False
        self.error_kind = ErrorKind.NONE
        self.error: str | None = None
        self.prompt_tokens: int | None = None
        self.image_tokens: int | None = None  # usage.prompt_tokens_details.image_tokens (None: not reported)
        self.completion_tokens: int | None = None
        self.total_tokens: int | None = None  # usage.total_tokens (all a rerank usage holds)
        self.usage_seen = False
        self.n_chunks = 0
        self.finish_reason: str | None = None
        self.done_seen = False
        # one entry per choice event: arrival ns, flags (1 = text tokens, 2 = finish_reason),
        # running completion_tokens of a usage object in the same event (-1 = none)
        self._times: list[int] = []
        self._flags: list[int] = []
        self._totals: list[int] = []
        self._stream_err = False
        self._proto_err = False
        self._body = False
        self._other: object = None  # first JSON object with no choices/usage/error
        self._texts: list[str] | None = [] if keep_text else None
        self._dirty = True
        self._first: int | None = None
        self._last: int | None = None
        self._tok_t: list[int] = []
        self._tok_k: list[int] = []
        self._n_out: int | None = None
        self.invalid_utf8 = 0  # invalid UTF-8 sequences replaced by U+FFFD (undecoded bytes handed in)

    # ---- input ---------------------------------------------------------------------------

    def on_event(self, data: str | bytes, t_ns: int) -> None:
        """One SSE event's data (``SSEEvent.data``, or its UTF-8 bytes from
        ``SSEDecoder.simple_event``) that completed at ``t_ns`` (int ns)."""
        try:
            obj = _loads(data)
        except _JSONDecodeError:  # rare: "[DONE]" once per stream, so try the JSON first
            if type(data) is bytes and (text := self._repaired(data)) is not None:
                self.on_event(text, t_ns)
                return
            s = data.strip()
            if s == "[DONE]" or s == b"[DONE]":
                self.done_seen = True
            elif s:  # (an empty data event is a keep-alive in effect)
                self._protocol("invalid JSON in SSE event: " + snippet(data))
            return
        if type(obj) is not dict:
            self._protocol("SSE event is not a JSON object: " + snippet(data))
            return
        self._take(obj, t_ns)

    def on_error_field(self, value: str) -> None:
        """The value of an SSE ``error`` field (``SSEDecoder.errors``: llama.cpp's server reports a
        failure mid-stream as ``error: {"code": 500, "message": ..., "type": "server_error"}``):
        the request failed (``STREAM_ERROR``) with the server's message."""
        try:
            err: object = _loads(value)
        except _JSONDecodeError:
            err = value
        self._stream_error({"error": err if err not in (None, "") else "SSE error field without a message"})

    def on_body(self, body: bytes, t_ns: int) -> None:
        """A whole non-streaming JSON response body (bytes) that arrived complete at ``t_ns``."""
        self._body = True
        if not body or not body.strip():
            self._protocol("empty response body")
            return
        try:
            obj = _loads(body)
        except _JSONDecodeError:
            obj = None
            text = self._repaired(body)
            if text is not None:
                try:
                    obj = _loads(text)
                except _JSONDecodeError:
                    pass
            if obj is None:
                self._protocol(snippet(body, ERROR_TEXT_LIMIT))
                return
        if type(obj) is not dict:
            self._protocol("response body is not a JSON object: " + snippet(body))
            return
        self._take(obj, t_ns)

    def _repaired(self, data: bytes) -> str | None:
        """``data`` decoded with invalid UTF-8 replaced by U+FFFD (counted in ``invalid_utf8``),
        or None when it is valid UTF-8 (then it failed as JSON for another reason)."""
        try:
            data.decode("utf-8")
            return None
        except UnicodeDecodeError:
            text = lossy_utf8(data)
            self.invalid_utf8 += text.count("\ufffd") - data.count(FFFD)
            return text

    def _take(self, obj: dict[str, Any], t: int) -> None:  # noqa: C901, PLR0912, PLR0915
        get = obj.get
        # Each field is read independently (B08): error, usage and choices may share one event.
        if get("error") is not None:
            self._stream_error(obj)
        total = -1
        usage = get("usage")
        if usage:
            if type(usage) is dict:
                self.usage_seen = True
                self._dirty = True
                ct = usage.get("completion_tokens")
                if type(ct) is int:
                    self.completion_tokens = total = ct
                pt = usage.get("prompt_tokens")
                if type(pt) is int:
                    self.prompt_tokens = pt
                    details = usage.get("prompt_tokens_details")
                    if type(details) is dict:
                        it = details.get("image_tokens")  # SGLang; vLLM: multimodal_tokens.image
                        if it is None and type(mm := details.get("multimodal_tokens")) is dict:
                            it = mm.get("image")
                        if type(it) is int:
                            self.image_tokens = it
                tt = usage.get("total_tokens")
                if type(tt) is int:
                    self.total_tokens = tt
            else:
                self._protocol("usage is not an object")
        choices = get("choices")
        if choices:
            if type(choices) is not list:
                self._protocol("choices is not a list")
                return
            flags = 0
            texts = self._texts
            for ch in choices:
                if type(ch) is not dict:
                    self._protocol("choice is not an object")
                    continue
                fr = ch.get("finish_reason")
                if fr is not None:
                    self.finish_reason = fr
                    flags |= 2
                txt = ch.get("text")
                if txt:
                    flags |= 1
                    if texts is not None:
                        texts.append(txt)
                    continue
                d = ch.get("delta") or ch.get("message")
                if d and type(d) is dict:
                    c = d.get("content")
                    if c:
                        flags |= 1
                        if texts is not None and type(c) is str:
                            texts.append(c)
                    elif d.get("reasoning_content") or d.get("reasoning") or d.get("tool_calls"):
                        flags |= 1
            self.n_chunks += 1
            self._times.append(t)
            self._flags.append(flags)
            self._totals.append(total)
            self._dirty = True
        elif get("object") == "error":  # vLLM's older ErrorResponse: {"object":"error","message":..}
            if get("error") is None:
                self._stream_error(obj)
        elif self._other is None and not usage and get("error") is None:
            self._other = obj

    @property
    def body_without_usage(self) -> bool:
        """A whole JSON body arrived that carried no choices, usage or error (a pooling response
        whose usage is missing)."""
        return self._body and self._other is not None and not self.usage_seen and not self._stream_err

    def _stream_error(self, obj: dict[str, Any]) -> None:
        err = obj.get("error")
        msg = error_message(obj if err is None else err)
        if not self._stream_err:  # keep the first server message: the root cause
            self._stream_err = True
            self.error = msg[:ERROR_TEXT_LIMIT]

    def _protocol(self, msg: str) -> None:
        if not self._proto_err:
            self._proto_err = True
            if self.error is None:
                self.error = msg[:ERROR_TEXT_LIMIT]

    # ---- derived measurements ------------------------------------------------------------

    def _derive(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        first, last, tok_t, tok_k = token_events(self._times, self._flags, self._totals, self.completion_tokens)
        self._first, self._last = first, last
        self._tok_t, self._tok_k = tok_t, tok_k
        self._n_out = self.completion_tokens

    @property
    def first_token_ns(self) -> int | None:
        """Arrival ns of the first choice event carrying >= 1 token (TTFT point); None if none."""
        self._derive()
        return self._first

    @property
    def last_token_ns(self) -> int | None:
        """Arrival ns of the last choice event carrying tokens or a finish_reason (E2E point)."""
        self._derive()
        return self._last

    @property
    def output_tokens(self) -> int | None:
        """N: usage ``completion_tokens`` if any usage gave it, else None (unknown: a stream
        without usage has no TPOT and no token-weighted ITL)."""
        self._derive()
        return self._n_out

    @property
    def output_tokens_estimate(self) -> int:
        """An estimate of N for a stream without usage: the tokens counted per event (1 per
        event with non-empty text/content/reasoning, or the rises of continuous usage). Never
        a server count; equal to N when continuous usage gave every event's count."""
        self._derive()
        return sum(self._tok_k)

    @property
    def text(self) -> str | None:
        """Generated text (completions text / chat content) if ``keep_text=True``, else None."""
        return None if self._texts is None else "".join(self._texts)

    @property
    def whole_body(self) -> bool:
        """A non-streaming (whole JSON) body: per-token timing is not observable."""
        return self._body

    def token_times(self) -> tuple[list[int], list[int]]:
        """(arrival ns, tokens) of each token-carrying event (``replayer.core.timestamps``)."""
        self._derive()
        return self._tok_t, self._tok_k

    def itl_ms(self) -> list[float]:
        """Token-weighted inter-token latencies in ms (``timestamps.itl_ms``): empty if N < 2 or
        fewer than two token-carrying events, for a non-streaming body, and whenever the per-event
        counts are not known: N unknown (no usage), or the events counted without continuous usage
        do not add up to N (some event carried several tokens, and which one is not known)."""
        self._derive()
        return itl_ms(self._tok_t, self._tok_k, None if self._body else self._n_out)

    def tpot_ms(self) -> float | None:
        """(last - first) / (N - 1) in ms; None unless N (from usage) >= 2 and the first token was
        measured. None for a non-streaming body (per-token timing is not observable there)."""
        self._derive()
        return tpot_ms(self._first, self._last, None if self._body else self._n_out)

    # ---- verdict -------------------------------------------------------------------------

    def finish(self) -> None:
        """The response ended (EOF or whole body). Decide ``success``/``error_kind``/``error``."""
        self._derive()
        if self._stream_err:
            kind = ErrorKind.STREAM_ERROR
        elif self._proto_err:
            kind = ErrorKind.PROTOCOL
        elif not (self.finish_reason is not None or self.done_seen or self.usage_seen or self._body):
            kind = ErrorKind.INCOMPLETE
            if self.error is None:
                self.error = "stream ended without finish_reason, [DONE] or usage"
        elif self.n_chunks == 0 and not self.usage_seen:
            kind = ErrorKind.PROTOCOL
            if self.error is None:
                other = self._other
                if isinstance(other, dict) and any(k in other for k in ("detail", "message", "msg")):
                    self.error = error_message(other)[:ERROR_TEXT_LIMIT]
                elif other is not None:
                    self.error = ("response has neither choices nor usage: " + orjson.dumps(other).decode())[
                        :ERROR_TEXT_LIMIT
                    ]
                else:
                    self.error = "response has neither choices nor usage"
        else:
            kind = ErrorKind.NONE
        self.error_kind = kind
        self.success = kind is ErrorKind.NONE
