"""After a request is answered: its prompt's token ids -> hash ids -> the row, off the request path.

A finished request's row waits in a bounded queue (``maxsize``) for its token ids, which come
from the request itself (token-id prompts), from a local tokenizer (``--tokenizer``, run in a
thread) or from the upstream's ``POST /tokenize`` (vLLM's: for chat it applies the model's chat
template, so a chat prompt is hashed as the server caches it). A full queue never delays a
request: the row is written at once without hash ids (counted as ``queue_full``). A prompt
that cannot be tokenized gives a row without hash ids, counted by reason. The prompt text and
token ids are dropped as soon as the hash ids exist; only the row goes to the writer.

The per-token work (parsing the body, ~80 KB of JSON for a 14k-token prompt; the block digests;
parsing a ``/tokenize`` answer) runs in one worker process (``offload``, when given): done on the
proxy's event loop it took ~1.8 ms per W1 request, a stall that every stream relayed meanwhile
waited out. The loop keeps only the mapping of digests to compact ids (one dict lookup per
block), which must happen in one place. The key goes to the worker process at its start, in
memory; nothing is written.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import orjson

from replayer.capture.blocks import BlockHasher
from replayer.capture.metrics import CaptureMetrics
from replayer.capture.offload import OffloadWorker, WorkerGone, digests_of_tokenize_answer, facts_and_digests
from replayer.capture.rows import RequestFacts, fit_hash_ids

log = logging.getLogger(__name__)

WORKERS = 4  # rows being finished at once (tokenize calls to the upstream)


class Tokenization:
    """The queue and its workers. ``submit`` from the event loop; ``drain`` at the end."""

    def __init__(
        self,
        hasher: BlockHasher,
        emit,
        metrics: CaptureMetrics,
        *,
        maxsize: int = 4096,
        session: aiohttp.ClientSession | None = None,
        tokenize_url: str | None = None,
        tokenizer=None,
        image_hash=None,
        offload: OffloadWorker | None = None,
    ) -> None:
        self.hasher = hasher
        self.emit = emit  # row -> None (the writer's add)
        self.metrics = metrics
        self.queue: asyncio.Queue = asyncio.Queue(maxsize)
        self.session = session
        self.tokenize_url = tokenize_url
        self.tokenizer = tokenizer
        self.image_hash = image_hash
        self.offload = offload
        self.request_kw: dict = {}  # more keywords of the /tokenize request (the TLS server name)
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
        """Wait for every queued row to be written, then stop the workers and the worker process."""
        await self.queue.join()
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        if self.offload is not None:
            await self.offload.close()

    async def _off_loop(self, fn, *args):
        """``fn(None, ..., *args)`` in the worker process (its own hasher), or ``fn(hasher, ...,
        *args)`` here when there is none (or it broke)."""
        if self.offload is not None:
            try:
                return await self.offload.call(fn.__name__, *args)
            except WorkerGone:
                log.error("capture: the tokenization worker process died; hashing on the event loop from now on")
                self.offload = None
        here = (self.hasher, self.image_hash) if fn is facts_and_digests else (self.hasher,)
        return fn(*here, *args)

    async def _work(self) -> None:
        while True:
            row, body, session, auth = await self.queue.get()
            try:
                facts, digests, n = await self._off_loop(facts_and_digests, row["endpoint"], body, session)
                del body
                row.update(session_id=facts.session_id, model=facts.model, max_tokens=facts.max_tokens)
                if facts.endpoint == "/v1/chat/completions" and facts.parsed:
                    row.update(image_count=len(facts.images), image_hashes=facts.images or None)
                if digests is not None:
                    self._hash(row, digests, n, "request")
                else:
                    got, by, reason = await self._tokens(facts, auth)
                    if got is not None:
                        self._hash(row, got[0], got[1], by)
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

    async def _tokens(
        self, facts: RequestFacts, auth: str | None
    ) -> tuple[tuple[list[bytes], int] | None, str, str | None]:
        """((block digests, token count), where the tokens came from, failure reason)."""
        chat = facts.endpoint == "/v1/chat/completions"
        local = self.tokenizer is not None and facts.text is not None
        if local and not chat:
            return await self._local(facts.text)
        if facts.tokenize_body is not None and self.tokenize_url is not None:
            got = await self._upstream(facts.tokenize_body, auth)
            if got is not None:
                return got, "upstream", None
            if not local:
                return None, "upstream", "upstream_error"
        if local:
            return await self._local(facts.text)
        return None, "none", "no_prompt" if facts.tokenize_body is None else "upstream_error"

    async def _local(self, text: str | None) -> tuple[tuple[list[bytes], int] | None, str, str | None]:
        def encode() -> tuple[list[bytes], int]:
            ids = self.tokenizer.encode(text).ids
            return self.hasher.digests(ids), len(ids)  # (digests only: ids_for stays on the loop)

        try:
            got = await asyncio.get_running_loop().run_in_executor(None, encode)
        except Exception as e:  # the tokenizers library raises plain exceptions
            log.debug("capture: local tokenizer failed: %s", e)
            return None, "tokenizer", "tokenizer_error"
        return got, "tokenizer", None

    async def _upstream(self, body: dict, auth: str | None) -> tuple[list[bytes], int] | None:
        assert self.session is not None and self.tokenize_url is not None
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = auth
        try:
            async with self.session.post(
                self.tokenize_url, data=orjson.dumps(body), headers=headers, **self.request_kw
            ) as r:
                data = await r.read()
                if r.status != 200:
                    return None
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            return None
        return await self._off_loop(digests_of_tokenize_answer, data)

    def _hash(self, row: dict, digests: list[bytes], n_tokens: int, by: str) -> None:
        ids = self.hasher.ids_for(digests)
        row["tokenized_by"] = by
        row["hashed_tokens"] = n_tokens
        if row["input_length"] is None:
            row["input_length"] = n_tokens
            row["input_length_source"] = "tokens"
        if row["input_length"] >= 1:
            row["hash_ids"] = fit_hash_ids(ids, row["input_length"], self.hasher.block_size, self.hasher.fresh_id)
        self.metrics.distinct_blocks.set(self.hasher.distinct_blocks)

    def _finish(self, row: dict) -> None:
        self.emit(row)
        self.metrics.rows_written.inc()
