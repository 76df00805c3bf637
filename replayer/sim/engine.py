"""The simulator's engine: request slots (``max_num_seqs``), the decode loop that steps every
running request, and the bytes of SSE token chunks.

``_Engine`` is a mixin of :class:`~replayer.sim.server.SimServer`: its state (``config``,
``_metrics``, ``_running``, ``_waiters``, ``_joining``, ``_decoding``, ``_wake``, ``_engine``)
is set by ``SimServer.__init__``. ``_Req`` is one request in prefill/decode.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from replayer.sim.config import SimConfig
    from replayer.sim.metrics import _Metrics

# The package's logger name, as before the split into modules.
log = logging.getLogger("replayer.sim")


def _frame(payload: bytes, chunked: bool) -> bytes:
    """HTTP/1.1 chunked-transfer framing for a direct transport write."""
    if chunked:
        return b"%x\r\n%b\r\n" % (len(payload), payload)
    return payload


_TOKEN_TEXT = " tok"
_DONE = b"data: [DONE]\n\n"


class _Req:
    """A request in prefill/decode; mutated only on the event loop."""

    __slots__ = (
        "max_tokens",
        "prompt_tokens",
        "generated",
        "transport",
        "chunk",
        "chunked",
        "continuous",
        "base",
        "done",
        "t_first",
        "aborted",
        "chat",
        "last",
        "timing",
        "details",
    )

    def __init__(self, max_tokens: int, prompt_tokens: int, chat: bool) -> None:
        self.chat = chat  # chat.completion(.chunk) format instead of text_completion
        self.max_tokens = max_tokens
        self.prompt_tokens = prompt_tokens
        self.generated = 0
        self.last = 1  # tokens of the last step (the next chunk's token count)
        self.transport: asyncio.Transport | None = None  # set for streams after token 1
        self.chunk = b""  # framed bytes of a non-final token event
        self.chunked = True
        self.continuous = False  # per-chunk usage
        self.base: dict[str, Any] = {}
        self.done: asyncio.Future[bool] | None = None
        self.t_first = 0.0
        self.aborted = False
        # per-request metrics asked for (vLLM --enable-per-request-metrics / include_metrics):
        # [queued, scheduled, first token] in time.perf_counter() seconds; None = not asked
        self.timing: list[float] | None = None
        self.details: dict[str, int] | None = None  # usage.prompt_tokens_details (image requests)


def _engine_ended(task: asyncio.Task[None]) -> None:
    """The decode loop only ends cancelled; one that raised is logged (the next request starts it again)."""
    if not task.cancelled() and task.exception() is not None:
        exc = task.exception()
        log.error("sim engine loop failed: %r", exc, exc_info=exc)


class _Engine:
    """Slots, decode loop and chunks of :class:`SimServer` (a mixin; see the module docstring)."""

    if TYPE_CHECKING:  # the server's, set by SimServer.__init__
        config: SimConfig
        _metrics: _Metrics
        _running: int
        _waiters: collections.deque[asyncio.Future[None]]
        _joining: list[_Req]
        _decoding: list[_Req]
        _wake: asyncio.Event | None
        _engine: asyncio.Task[None] | None
        born_s: float

    def _ensure_engine(self) -> None:
        if self._engine is None or self._engine.done():
            self._wake = asyncio.Event()
            self._engine = asyncio.get_running_loop().create_task(self._engine_loop())
            self._engine.add_done_callback(_engine_ended)

    # -- slots (max_num_seqs) -------------------------------------------------------------

    async def _admit(self) -> None:
        limit = self.config.max_num_seqs
        if limit and (self._running >= limit or self._waiters):
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut  # the releaser counts us in _running before resolving
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._release()
                else:
                    try:
                        self._waiters.remove(fut)
                    except ValueError:
                        pass
                raise
        else:
            self._running += 1

    def _release(self) -> None:
        self._running -= 1
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                self._running += 1
                fut.set_result(None)
                break

    # -- engine ---------------------------------------------------------------------------

    def _step_s(self) -> float:
        c = self.config
        step_ms = c.itl_base_ms + c.itl_per_running_us * self._running / 1000.0
        if c.itl_drift_ms_per_min:  # (--itl-drift-ms-per-min: degrading on purpose; negative: improving, to 0)
            step_ms = max(0.0, step_ms + c.itl_drift_ms_per_min * (time.perf_counter() - self.born_s) / 60.0)
        return step_ms / 1000.0

    async def _engine_loop(self) -> None:
        loop = asyncio.get_running_loop()
        wake = self._wake
        assert wake is not None
        deadline: float | None = None
        while True:
            if not self._decoding and not self._joining:
                wake.clear()
                await wake.wait()
                deadline = None
            step = self._step_s()
            now = loop.time()
            if deadline is None or deadline + step < now:  # idle or fell behind: re-anchor
                deadline = now + step
            else:
                deadline += step
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            try:
                self._step(loop.time(), step)
            except Exception:  # a bug must not stop every stream
                log.exception("sim engine step failed")

    def _step(self, now: float, step: float) -> None:
        if self._joining:
            half = step / 2
            keep = []
            for r in self._joining:
                if r.aborted:
                    continue
                if now - r.t_first >= half:
                    self._decoding.append(r)
                else:
                    keep.append(r)
            self._joining = keep
        survivors = []
        tokens = 0
        k = self.config.tokens_per_chunk
        for r in self._decoding:
            if r.aborted:
                continue
            t = r.transport
            if t is not None and t.is_closing():
                self._abort(r)
                continue
            n = min(k, r.max_tokens - r.generated)  # fewer only in the final step
            r.generated += n
            r.last = n
            tokens += n
            if r.generated >= r.max_tokens:
                # The handler writes the final chunk(s) and closes the response.
                assert r.done is not None  # set before the request joins
                if not r.done.done():
                    r.done.set_result(True)
                continue
            if t is not None:
                data = self._usage_chunk(r) if r.continuous else r.chunk
                try:
                    t.write(data)
                except Exception:  # transport died between the check and the write
                    self._abort(r)
                    continue
            survivors.append(r)
        self._decoding = survivors
        self._metrics.generation_tokens += tokens

    def _abort(self, r: _Req) -> None:
        r.aborted = True
        if r.done is not None and not r.done.done():
            r.done.set_result(False)

    def _join(self, r: _Req, t_first: float) -> None:
        r.t_first = t_first
        self._joining.append(r)
        self._ensure_engine()
        assert self._wake is not None
        self._wake.set()

    # -- chunks ---------------------------------------------------------------------------

    def _token_event(self, r: _Req, finish: str | None, n_done: int | None, k: int = 1) -> bytes:
        """One chunk carrying ``k`` tokens; ``n_done``: the running usage to add (None = none)."""
        obj = dict(r.base)
        text = _TOKEN_TEXT * k
        if r.chat:
            # vLLM dumps chat chunks with exclude_unset: stop_reason only on the last one.
            ch: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
            if finish is not None:
                ch["stop_reason"] = None
            obj["choices"] = [ch]
        else:
            obj["choices"] = [
                {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
            ]
        if n_done is not None:
            obj["usage"] = {
                "prompt_tokens": r.prompt_tokens,
                "completion_tokens": n_done,
                "total_tokens": r.prompt_tokens + n_done,
            }
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    def _role_event(self, r: _Req) -> bytes:
        """vLLM's first chat chunk (sent with the first token, as vLLM does)."""
        obj = dict(r.base)
        obj["choices"] = [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        ]
        if r.continuous:
            obj["usage"] = {"prompt_tokens": r.prompt_tokens, "completion_tokens": 0, "total_tokens": r.prompt_tokens}
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    def _usage_chunk(self, r: _Req) -> bytes:
        return _frame(self._token_event(r, None, r.generated, r.last), r.chunked)

    def _final_events(self, r: _Req, include_usage: bool) -> bytes:
        out = self._token_event(r, "length", r.max_tokens if r.continuous else None, r.last)
        if include_usage:
            obj = dict(r.base)
            obj["choices"] = []
            obj["usage"] = {
                "prompt_tokens": r.prompt_tokens,
                "completion_tokens": r.max_tokens,
                "total_tokens": r.prompt_tokens + r.max_tokens,
            }
            if r.details is not None:
                obj["usage"]["prompt_tokens_details"] = r.details
            if r.timing is not None:  # vLLM: on the final usage chunk only
                obj["metrics"] = timing_metrics(r)
            out += b"data: " + orjson.dumps(obj) + b"\n\n"
        return out + _DONE


def timing_metrics(r: _Req) -> dict[str, float | None]:
    """vLLM's per-request ``metrics`` object (PR #46768, ``build_per_request_timing_metrics``)
    for ``r``, its last token now: queue = scheduled - queued, TTFT = first token - scheduled
    (the queue not included), generation = last token - first token, in milliseconds."""
    queued, scheduled, first = r.timing  # type: ignore[misc]
    last = time.perf_counter()
    n = r.max_tokens
    gen_s = last - first
    return {
        "time_to_first_token_ms": (first - scheduled) * 1e3,
        "generation_time_ms": gen_s * 1e3,
        "queue_time_ms": (scheduled - queued) * 1e3,
        "mean_itl_ms": gen_s / (n - 1) * 1e3 if n > 1 else None,
        "tokens_per_second": n / (last - scheduled) if last > scheduled else None,
    }
