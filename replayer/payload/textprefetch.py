"""Decodes the text prompts of upcoming requests in a child process, ahead of preparation.

Text prompts (``--prompt-mode text``, the chat API, rows with images) are fitted to the server's
token count (``textprompts.TextPromptBuilder``): built, then encoded through the chat template and
corrected. A fast tokenizer takes ~1 us per token for that (a Mooncake prompt of 14k tokens:
~10-20 ms). On the event
loop, inside the lead window, every decode delays the sends due meanwhile; a thread would hold the
GIL while it converts the ids. So when preparation reaches a schedule batch, a thread walks the
rows after the one being prepared (at most ``LOOKAHEAD_ROWS`` ahead) and has a spawned child
process decode the rows that need text, in batches; the thread itself only waits. Preparation
takes a row's text when it comes to it, or decodes it itself when the child has not finished it
(the first rows, a burst, a child starved of CPU, a broken child: never waiting for it): the same text
either way, since the child runs the same builder on the same seed, vocabulary, ids and tokenizer.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import BrokenExecutor, Future, ProcessPoolExecutor
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

#: rows of the schedule the thread may run ahead of preparation (texts held: at most this many)
LOOKAHEAD_ROWS = 256
#: most rows decoded by one call to the child
MAX_BATCH = 16
#: the thread ends after this long without preparation moving (the next text row starts it again)
IDLE_EXIT_S = 10.0

#: ``wants(sb, k)``: (hash ids, input_length, chat, images) of item ``k`` of schedule batch ``sb``
#: when preparation will make its prompt text, else None
Wants = Callable[[Any, int], "tuple[np.ndarray, int, bool, int] | None"]

# -- in the child ----------------------------------------------------------------------------
_setup: tuple[str, int, np.ndarray] | None = None  # (tokenizer, block size, vocabulary)
_builders: dict[int, Any] = {}  # prompt seed -> TextPromptBuilder


def _init(tokenizer: str, block_size: int, vocab: np.ndarray) -> None:
    global _setup
    _setup = (tokenizer, block_size, vocab)


def decode_prompts(seed: int, rows: list[tuple[np.ndarray, int, bool, int]]) -> list[str | Exception]:
    """The prompt texts of rows (hash ids, input_length, chat, images) under prompt seed ``seed``, as
    ``TextPromptBuilder.prompt_text`` makes them in the parent; a row's error is its item (run in
    the child, set up by ``_init``)."""
    from replayer.payload.prompts import PromptBuilder
    from replayer.payload.textprompts import TextPromptBuilder

    assert _setup is not None, "decode_prompts runs in a child set up by _init"
    tb = _builders.get(seed)
    if tb is None:
        if len(_builders) >= 2:  # --loop-salt: a seed per loop; the last ones are the live ones
            _builders.pop(next(iter(_builders)))
        tokenizer, block_size, vocab = _setup
        tb = _builders[seed] = TextPromptBuilder(
            PromptBuilder(seed=seed, block_size=block_size, vocab=vocab), tokenizer
        )
    out: list[str | Exception] = []
    for hash_ids, input_length, chat, images in rows:
        try:
            out.append(tb.prompt_text(hash_ids.tolist(), input_length, chat, images))
        except Exception as e:
            out.append(e)
    return out


# -- in the replaying process ----------------------------------------------------------------
class TextPrefetch:
    """``at(sb, j, seed)``: preparation is at item ``j`` of schedule batch ``sb`` (prompt seed
    ``seed``); ``take(sb, j)``: item ``j``'s text if decoded ahead, else None (also while the child
    is still on it). ``decoded``: texts the child made; ``taken``: texts preparation used."""

    def __init__(
        self, tokenizer: str, block_size: int, vocab: np.ndarray, wants: Wants, lookahead_rows: int = LOOKAHEAD_ROWS
    ) -> None:
        self.tokenizer, self.block_size, self.vocab = tokenizer, block_size, vocab
        self.wants = wants
        self.lookahead = lookahead_rows
        self._cond = threading.Condition()
        self._sb: Any = None
        self._serial = 0  # bumped when preparation moves to another schedule batch
        self._pos = 0  # the item of it being prepared
        self._seed = 0
        self._texts: OrderedDict[int, Future] = OrderedDict()  # item -> its text (this batch's)
        self._thread: threading.Thread | None = None
        self._pool: ProcessPoolExecutor | None = None
        self._broken = False
        self.decoded = 0
        self.taken = 0

    def at(self, sb: Any, j: int, seed: int) -> None:
        with self._cond:
            if self._sb is not sb:
                self._sb, self._serial = sb, self._serial + 1
                self._texts.clear()
            self._pos, self._seed = j, seed
            self._cond.notify()
            if self._thread is None and not self._broken:
                self._thread = threading.Thread(target=self._run, name="replayer-text-prefetch", daemon=True)
                self._thread.start()

    def take(self, sb: Any, j: int) -> str | None:
        with self._cond:
            if sb is not self._sb:
                return None
            texts = self._texts
            while texts and next(iter(texts)) < j:  # rows prepared without it (or never text rows)
                texts.popitem(last=False)
            fut = texts.pop(j, None)
        if fut is None or not fut.done():  # not there yet: decoding it now beats waiting for a child
            return None  # that shares the cores (the loop would block meanwhile)
        try:
            text: str = fut.result()
        except Exception:  # decoded again in preparation, where a real problem shows
            return None
        self.taken += 1
        return text

    def warm(self, sb: Any, n: int, seed: int, timeout_s: float) -> int:
        """Before the run starts: decode the text rows among the first ``n`` items of ``sb`` (the
        child started) and wait for them, at most ``timeout_s``; returns how many are ready."""
        want = [k for k in range(min(n, len(sb))) if self.wants(sb, k) is not None]
        self.at(sb, -1, seed)  # (the thread starts at item 0)
        deadline = time.monotonic() + timeout_s
        while True:
            with self._cond:
                ready = sum(1 for k in want if k in self._texts and self._texts[k].done())
                if ready == len(want) or self._broken:
                    return ready
            if time.monotonic() > deadline:
                return ready
            time.sleep(0.005)

    def _run(self) -> None:  # noqa: C901, PLR0912
        serial, k = -1, 0
        while True:
            with self._cond:
                while True:
                    if self._serial != serial:  # preparation moved to another batch: follow it
                        serial, k = self._serial, self._pos + 1
                    k = max(k, self._pos + 1)
                    sb, seed, pos = self._sb, self._seed, self._pos
                    if k < len(sb) and k <= pos + self.lookahead:
                        break
                    if not self._cond.wait(IDLE_EXIT_S):  # nothing prepared for a while: end (at() restarts it)
                        self._stop()
                        return
            # the rows up to a batch: one child call per batch (each call costs the parent a few
            # GIL hand-overs, each up to the 5 ms switch interval while the loop is busy); small
            # while preparation is close behind, so the next row it needs comes back soon
            size = max(1, min(MAX_BATCH, (k - pos) // 4))
            batch: list[tuple[int, tuple[np.ndarray, int, bool, int]]] = []
            while len(batch) < size and k < len(sb) and k <= pos + self.lookahead:
                try:
                    work = self.wants(sb, k)
                except Exception:  # preparation meets the same row and says what is wrong with it
                    log.debug("text prefetch skipped item %s", k, exc_info=True)
                    work = None
                if work is not None:
                    batch.append((k, work))
                k += 1
            if not batch:
                continue
            futs: list[Future] = [Future() for _ in batch]
            with self._cond:
                if self._serial != serial:
                    continue
                for (item, _), fut in zip(batch, futs):
                    self._texts[item] = fut
            try:
                texts = self._decode(seed, [w for _, w in batch])
            except BrokenExecutor as e:  # the child died (killed, out of memory): no more prefetching
                for fut in futs:
                    fut.set_exception(e)
                log.warning("text prefetch stopped (texts are decoded in preparation): %r", e)
                with self._cond:
                    self._broken = True
                    self._stop()
                return
            for fut, text in zip(futs, texts):
                if isinstance(text, Exception):  # this row's own problem (preparation raises it again)
                    fut.set_exception(text)
                else:
                    fut.set_result(text)
                    self.decoded += 1

    def _stop(self) -> None:
        self._thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def _decode(self, seed: int, rows: list[tuple[np.ndarray, int, bool, int]]) -> list[str | Exception]:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init,
                initargs=(self.tokenizer, self.block_size, self.vocab),
            )
        rows = [(np.array(h), n, chat, images) for h, n, chat, images in rows]
        texts: list[str | Exception] = self._pool.submit(decode_prompts, seed, rows).result()
        return texts
