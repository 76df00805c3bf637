"""After a request is answered: its prompt's token ids -> hash ids -> the row, off the request path.

A finished request's row waits in a bounded queue (``maxsize``) for its token ids, which come
from the request itself (token-id prompts), from a local tokenizer (``--tokenizer``, run in a
thread) or from the upstream's ``POST /tokenize`` (vLLM's: for chat it applies the model's chat
template, so a chat prompt is hashed as the server caches it). A full queue never delays a
request: the row is written at once without hash ids (counted as ``queue_full``). A prompt
that cannot be tokenized gives a row without hash ids, counted by reason. The prompt text and
token ids are dropped as soon as the hash ids exist; only the row goes to the writer.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import orjson

from .blocks import BlockHasher
from .metrics import CaptureMetrics
from .rows import RequestFacts, fit_hash_ids, request_facts

log = logging.getLogger(__name__)

WORKERS = 4  # tokenize calls to the upstream at once


class Tokenization:
    """The queue and its workers. ``submit`` from the event loop; ``drain`` at the end."""

    def __init__(self, hasher: BlockHasher, emit, metrics: CaptureMetrics, *, maxsize: int = 4096,
                 session: aiohttp.ClientSession | None = None, tokenize_url: str | None = None,
                 tokenizer=None, image_hash=None) -> None:
        self.hasher = hasher
        self.emit = emit  # row -> None (the writer's add)
        self.metrics = metrics
        self.queue: asyncio.Queue = asyncio.Queue(maxsize)
        self.session = session
        self.tokenize_url = tokenize_url
        self.tokenizer = tokenizer
        self.image_hash = image_hash
        self._workers: list[asyncio.Task] = []

    def start(self) -> None:
        self._workers = [asyncio.create_task(self._work()) for _ in range(WORKERS)]

    def submit(self, row: dict, body: bytes, session: str | None, auth: str | None) -> None:
        """Queue a finished request's row with its body (never blocks; when the queue is full the
        row is written at once, with what the response told: no hash ids, no body facts)."""
        try:
            self.queue.put_nowait((row, body, session, auth))
        except asyncio.QueueFull:
            self.metrics.tokenize_failures.labels("queue_full").inc()
            row["tokenized_by"] = "dropped"
            row["session_id"] = session
            self._finish(row)
            return
        self.metrics.backlog.set(self.queue.qsize())

    async def drain(self) -> None:
        """Wait for every queued row to be written, then stop the workers."""
        await self.queue.join()
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)

    async def _work(self) -> None:
        while True:
            row, body, session, auth = await self.queue.get()
            try:
                facts = request_facts(row["endpoint"], body, session, self.image_hash)
                del body
                row.update(session_id=facts.session_id, model=facts.model, max_tokens=facts.max_tokens)
                if facts.endpoint == "/v1/chat/completions" and facts.parsed:
                    row.update(image_count=len(facts.images), image_hashes=facts.images or None)
                tokens, by, reason = await self._tokens(facts, auth)
                if tokens is not None:
                    self._hash(row, tokens, by)
                else:
                    row["tokenized_by"] = "none" if reason == "no_prompt" else "failed"
                    if reason:
                        self.metrics.tokenize_failures.labels(reason).inc()
                self._finish(row)
            except Exception:  # a bug here must not stop the capture: the row goes out as it is
                log.exception("capture: could not finish a row")
                row["tokenized_by"] = "failed"
                self._finish(row)
            finally:
                self.queue.task_done()
                self.metrics.backlog.set(self.queue.qsize())

    async def _tokens(self, facts: RequestFacts, auth: str | None) -> tuple[list[int] | None, str, str | None]:
        """(token ids, where they came from, failure reason)."""
        if facts.token_ids is not None:
            return facts.token_ids, "request", None
        chat = facts.endpoint == "/v1/chat/completions"
        local = self.tokenizer is not None and facts.text is not None
        if local and not chat:
            return await self._local(facts.text)
        if facts.tokenize_body is not None and self.tokenize_url is not None:
            ids = await self._upstream(facts.tokenize_body, auth)
            if ids is not None:
                return ids, "upstream", None
            if not local:
                return None, "upstream", "upstream_error"
        if local:
            return await self._local(facts.text)
        return None, "none", "no_prompt" if facts.tokenize_body is None else "upstream_error"

    async def _local(self, text: str) -> tuple[list[int] | None, str, str | None]:
        try:
            enc = await asyncio.get_running_loop().run_in_executor(None, self.tokenizer.encode, text)
        except Exception as e:  # the tokenizers library raises plain exceptions
            log.debug("capture: local tokenizer failed: %s", e)
            return None, "tokenizer", "tokenizer_error"
        return list(enc.ids), "tokenizer", None

    async def _upstream(self, body: dict, auth: str | None) -> list[int] | None:
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = auth
        try:
            async with self.session.post(self.tokenize_url, data=orjson.dumps(body), headers=headers) as r:
                data = await r.read()
                if r.status != 200:
                    return None
            tokens = orjson.loads(data).get("tokens")
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, orjson.JSONDecodeError, AttributeError):
            return None
        if type(tokens) is not list or not tokens or not all(type(t) is int for t in tokens):
            return None
        return tokens

    def _hash(self, row: dict, tokens: list[int], by: str) -> None:
        ids = self.hasher.hash_ids(tokens)
        row["tokenized_by"] = by
        row["hashed_tokens"] = len(tokens)
        if row["input_length"] is None:
            row["input_length"] = len(tokens)
            row["input_length_source"] = "tokens"
        if row["input_length"] >= 1:
            row["hash_ids"] = fit_hash_ids(ids, row["input_length"], self.hasher.block_size, self.hasher.fresh_id)
        self.metrics.distinct_blocks.set(self.hasher.distinct_blocks)

    def _finish(self, row: dict) -> None:
        self.emit(row)
        self.metrics.rows_written.inc()
