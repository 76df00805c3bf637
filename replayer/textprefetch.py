"""Decodes the text prompts of upcoming requests in a child process, ahead of preparation.

Text prompts (``--prompt-mode text``, the chat API, rows with images) are the prompt's token ids
decoded in one piece (``prompts.TextPromptBuilder``). A fast tokenizer takes ~1 us per token for
that (a Mooncake prompt of 14k tokens: ~10-20 ms; ~4x more with a WordPiece decoder). On the event
loop, inside the lead window, every decode delays the sends due meanwhile; a thread would hold the
GIL while it converts the ids. So when preparation reaches a schedule batch, a thread walks the
rows after the one being prepared (at most ``LOOKAHEAD_ROWS`` ahead) and has a spawned child
process decode each row that needs text, one at a time; the thread itself only waits. Preparation
takes a row's text when it comes to it (waiting if the child is on that row now), or decodes it
itself when the thread has not reached it (the first rows, a burst, a broken child): the same text
either way, since the child runs the same builder on the same seed, vocabulary, ids and tokenizer.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import BrokenExecutor, Future, ProcessPoolExecutor
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

#: rows of the schedule the thread may run ahead of preparation (texts held: at most this many)
LOOKAHEAD_ROWS = 256
#: the thread ends after this long without preparation moving (the next text row starts it again)
IDLE_EXIT_S = 10.0

#: ``wants(sb, k)``: (hash ids, input_length) of item ``k`` of schedule batch ``sb`` when
#: preparation will decode its prompt text, else None
Wants = Callable[[Any, int], "tuple[np.ndarray, int] | None"]

# -- in the child ----------------------------------------------------------------------------
_setup: tuple[str, int, np.ndarray] | None = None  # (tokenizer, block size, vocabulary)
_builders: dict[int, Any] = {}                      # prompt seed -> TextPromptBuilder


def _init(tokenizer: str, block_size: int, vocab: np.ndarray) -> None:
    global _setup
    _setup = (tokenizer, block_size, vocab)


def decode_prompt(seed: int, hash_ids: np.ndarray, input_length: int) -> str:
    """The prompt text of (seed, hash ids, input_length), as ``TextPromptBuilder.prompt_text``
    makes it in the parent (run in the child, set up by ``_init``)."""
    from .prompts import PromptBuilder, TextPromptBuilder

    assert _setup is not None, "decode_prompt runs in a child set up by _init"
    tb = _builders.get(seed)
    if tb is None:
        if len(_builders) >= 2:  # --loop-salt: a seed per loop; the last ones are the live ones
            _builders.pop(next(iter(_builders)))
        tokenizer, block_size, vocab = _setup
        tb = _builders[seed] = TextPromptBuilder(PromptBuilder(seed=seed, block_size=block_size, vocab=vocab),
                                                 tokenizer)
    text: str = tb.prompt_text(hash_ids.tolist(), input_length)
    return text


# -- in the replaying process ----------------------------------------------------------------
class TextPrefetch:
    """``at(sb, j, seed)``: preparation is at item ``j`` of schedule batch ``sb`` (prompt seed
    ``seed``); ``take(sb, j)``: item ``j``'s text if decoded ahead (or being decoded: waits for
    it), else None. ``decoded``: texts the child made; ``taken``: texts preparation used."""

    def __init__(self, tokenizer: str, block_size: int, vocab: np.ndarray, wants: Wants,
                 lookahead_rows: int = LOOKAHEAD_ROWS) -> None:
        self.tokenizer, self.block_size, self.vocab = tokenizer, block_size, vocab
        self.wants = wants
        self.lookahead = lookahead_rows
        self._cond = threading.Condition()
        self._sb: Any = None
        self._serial = 0   # bumped when preparation moves to another schedule batch
        self._pos = 0      # the item of it being prepared
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
        if fut is None:
            return None
        try:
            text: str = fut.result()
        except Exception:  # decoded again in preparation, where a real problem shows
            return None
        self.taken += 1
        return text

    def _run(self) -> None:
        serial, k = -1, 0
        while True:
            with self._cond:
                while True:
                    if self._serial != serial:  # preparation moved to another batch: follow it
                        serial, k = self._serial, self._pos + 1
                    k = max(k, self._pos + 1)
                    sb, seed = self._sb, self._seed
                    if k < len(sb) and k <= self._pos + self.lookahead:
                        break
                    if not self._cond.wait(IDLE_EXIT_S):  # nothing prepared for a while: end (at() restarts it)
                        self._stop()
                        return
            try:
                work = self.wants(sb, k)
            except Exception:  # preparation meets the same row and says what is wrong with it
                log.debug("text prefetch skipped item %s", k, exc_info=True)
                work = None
            if work is not None:
                fut: Future = Future()
                with self._cond:
                    if self._serial != serial:
                        continue
                    self._texts[k] = fut
                try:
                    fut.set_result(self._decode(seed, *work))
                    self.decoded += 1
                except BrokenExecutor as e:  # the child died (killed, out of memory): no more prefetching
                    fut.set_exception(e)
                    log.warning("text prefetch stopped (texts are decoded in preparation): %r", e)
                    with self._cond:
                        self._broken = True
                        self._stop()
                    return
                except Exception as e:  # this row's own problem (preparation raises it again)
                    fut.set_exception(e)
            k += 1

    def _stop(self) -> None:
        self._thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def _decode(self, seed: int, hash_ids: np.ndarray, input_length: int) -> str:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_init,
                                             initargs=(self.tokenizer, self.block_size, self.vocab))
        text: str = self._pool.submit(decode_prompt, seed, np.array(hash_ids), input_length).result()
        return text
