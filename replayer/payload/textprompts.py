"""Text prompts that the server re-tokenizes to exactly the trace's ``input_length``.

The chat API takes no token ids, so a chat replay (and ``--prompt-mode text``) sends text that the
server tokenizes again, through the model's chat template. Decoding arbitrary token ids and
encoding the text again is not a round trip (neighbouring tokens merge, normalizers change text),
and the template adds tokens of its own (role markers, BOS, the generation prompt). So:

* **Round-trip-safe vocabulary.** Per tokenizer (once per process) the ids whose text is a space
  then letters or digits (``Ġword``, ``▁word``, a word-level ``word``) and that encode back to
  themselves in the context the builder makes (after another such piece) are kept
  (:func:`safe_vocabulary`). A prompt's content is the hash-id blocks of ``replayer.payload.prompts``
  drawn from that vocabulary, each token written as its piece (``" word"``), so the content
  encodes to exactly its token ids and a block is the same tokens wherever it stands.
* **The template counted.** The content's length is the target less the template's overhead
  (``replayer.payload.chattemplate.ChatCounter``: the tokens it adds around the messages, or a
  completions prompt's BOS), found by a probe once per shape. The content is exact by
  construction (every safe piece checked on its own and in random sequences, once), so per
  prompt only its junctions with the template are checked: the prompt rendered around the
  content's first and last ``EDGE`` tokens is encoded as the server will (an encode of the whole
  prompt costs ~10x the text's decoding). When that count is off (and always for a multi-turn
  conversation, or without a safe vocabulary), the whole prompt is encoded and the content's
  length corrected until the count is exactly the target. Where no length gives the target (a
  tokenizer without a safe vocabulary, a prompt shorter than its template), the closest is sent
  and the run reports the residual per request, as for any prompt-token mismatch.

Rows sharing their first k hash ids share the first k blocks of content, so their prompts share
the template's prefix plus those k x ``block_size`` tokens at the server. The text is a pure
function of (tokenizer, template, seed, block size, hash ids, target, shape): the prefetch child
and the lead window make the same text.
"""

from __future__ import annotations

import logging
import re
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from replayer.payload.chattemplate import ChatCounter
from replayer.payload.prompts import PromptBuilder

__all__ = ["SafeVocabulary", "TextPromptBuilder", "safe_vocabulary"]

log = logging.getLogger(__name__)

#: fewer round-trip-safe ids than this: the prompt is decoded from the whole vocabulary (today's
#: text, approximately exact by the length correction alone)
MIN_SAFE_IDS = 256
#: encodes tried per prompt before the closest length is sent
MAX_TRIES = 6
#: tokens at each end of a content whose junctions with the template are checked per prompt
EDGE = 16
#: random sequences of this many safe tokens checked once per tokenizer (beside each token's own check)
CHECK_TOKENS = 4096
_WORD = re.compile(r"[A-Za-z0-9]+")
_counters: dict[str, ChatCounter] = {}
_safe: dict[str, SafeVocabulary | None] = {}
_warned: set[str] = set()
_warned_chat: set[str] = set()


@dataclass(frozen=True)
class SafeVocabulary:
    """``ids``: the sorted round-trip-safe ids; ``piece``: an object array, id -> its text."""

    ids: np.ndarray
    piece: np.ndarray


def counter_for(spec: str) -> ChatCounter:
    """The process's ChatCounter of a ``--tokenizer`` value (loaded once)."""
    c = _counters.get(spec)
    if c is None:
        c = _counters[spec] = ChatCounter(spec)
    return c


def safe_vocabulary(spec: str) -> SafeVocabulary | None:
    """The round-trip-safe ids of a tokenizer (module docstring), found once per process; None
    when there are fewer than ``MIN_SAFE_IDS``."""
    if spec in _safe:
        return _safe[spec]
    tok = counter_for(spec).tokenizer
    added = set(tok.get_added_tokens_decoder())
    ids = sorted(set(tok.get_vocab(with_added_tokens=False).values()) - added)
    texts = tok.decode_batch([[i] for i in ids], skip_special_tokens=False)
    cands = [(i, " " + t.lstrip(" ")) for i, t in zip(ids, texts) if _WORD.fullmatch(t.lstrip(" "))]
    encs = tok.encode_batch([p + p for _, p in cands], add_special_tokens=False) if cands else []
    # what precedes the two pieces (e.g. a Metaspace's leading "▁" of its own) must be the same
    # for every piece: the most common lead is the tokenizer's
    leads = Counter(tuple(e.ids[:-2]) for (i, _), e in zip(cands, encs) if e.ids[-2:] == [i, i])
    lead = leads.most_common(1)[0][0] if leads else ()
    keep = [(i, p) for (i, p), e in zip(cands, encs) if e.ids[-2:] == [i, i] and tuple(e.ids[:-2]) == lead]
    keep = _check_sequences(tok, keep, lead)
    out: SafeVocabulary | None = None
    if len(keep) >= MIN_SAFE_IDS:
        piece = np.empty(max(i for i, _ in keep) + 1, dtype=object)
        for i, p in keep:
            piece[i] = p
        out = SafeVocabulary(np.array([i for i, _ in keep], dtype=np.int64), piece)
    _safe[spec] = out
    return out


def _check_sequences(tok: Any, keep: list[tuple[int, str]], lead: tuple[int, ...]) -> list[tuple[int, str]]:
    """``keep`` less the pieces that do not encode to themselves beside others: three random
    sequences of ``CHECK_TOKENS`` pieces are encoded; at a mismatch the two pieces there are
    dropped and the check runs again (at most 64 times; then none is kept)."""
    rng = np.random.default_rng(0x35)
    for _ in range(64):
        if len(keep) < MIN_SAFE_IDS:
            return keep
        bad: set[int] = set()
        for _ in range(3):
            pick = rng.integers(0, len(keep), CHECK_TOKENS)
            ids = [keep[k][0] for k in pick]
            got = tok.encode("".join(keep[k][1] for k in pick), add_special_tokens=False).ids
            if got != [*lead, *ids]:
                body = got[len(lead) :]
                at = next((k for k, (x, y) in enumerate(zip(body, ids)) if x != y), min(len(body), len(ids)))
                bad.update(int(pick[k]) for k in (at - 1, at) if 0 <= k < len(pick))
        if not bad:
            return keep
        keep = [p for k, p in enumerate(keep) if k not in bad]
    return []


class TextPromptBuilder:
    """Text prompts of exactly ``input_length`` server tokens (module docstring).

    ``builder``: the run's prompt builder (its seed and block size; its vocabulary serves
    ``decode``); ``tokenizer_path``: ``--tokenizer``. ``exact``: a round-trip-safe vocabulary was
    found; ``counter.has_template``: the folder has a chat template. Raises FileNotFoundError for
    a missing tokenizer."""

    #: full blocks' texts kept (LRU)
    CACHE_BLOCKS = 4096

    def __init__(self, builder: PromptBuilder, tokenizer_path: str) -> None:
        self.builder = builder
        self.counter = counter_for(tokenizer_path)
        self.tokenizer = self.counter.tokenizer
        self.safe = safe_vocabulary(tokenizer_path)
        self.exact = self.safe is not None
        self.content_builder = (
            PromptBuilder(seed=builder.seed, block_size=builder.block_size, vocab=self.safe.ids, cache_bytes=1 << 20)
            if self.safe is not None
            else builder
        )
        self._overhead: dict[tuple[bool, int], int] = {}
        self._frames: dict[tuple[bool, int], tuple[int, int]] = {}
        self._blocks: OrderedDict[int, str] = OrderedDict()
        if tokenizer_path not in _warned:
            _warned.add(tokenizer_path)
            if self.safe is None:
                log.warning(
                    "--tokenizer %s: too few round-trip-safe tokens; text prompts are decoded from the whole "
                    "vocabulary and may differ from input_length at the server (the drift is reported)",
                    tokenizer_path,
                )

    # -- text of token ids -------------------------------------------------------------------
    def decode(self, ids: np.ndarray) -> str:
        """Text of arbitrary token ids (a query, a document) in one piece (not exact)."""
        text: str = self.tokenizer.decode(ids.tolist(), skip_special_tokens=False)
        return text

    def content(self, hash_ids: Sequence[int], m: int) -> str:
        """The first ``m`` tokens of the blocks of ``hash_ids`` (at most all of them) as text: each
        safe token's piece, full blocks from a cache; without a safe vocabulary, decoded."""
        bs = self.builder.block_size
        need = list(hash_ids[: -(-m // bs)])
        m = min(m, len(need) * bs)
        if m <= 0:
            return ""
        if self.safe is None:
            return self.decode(np.concatenate([self.content_builder.block_ids(int(h)) for h in need])[:m])
        parts = [self._block_text(int(h)) for h in need[:-1]]
        tail = m - (len(need) - 1) * bs
        if tail == bs:
            parts.append(self._block_text(int(need[-1])))
        else:
            parts.append("".join(self.safe.piece[self.content_builder.block_ids(int(need[-1]))[:tail]].tolist()))
        return "".join(parts)

    def _block_text(self, h: int) -> str:
        got = self._blocks.get(h)
        if got is not None:
            self._blocks.move_to_end(h)
            return got
        assert self.safe is not None
        text: str = "".join(self.safe.piece[self.content_builder.block_ids(h)].tolist())
        self._blocks[h] = text
        if len(self._blocks) > self.CACHE_BLOCKS:
            self._blocks.popitem(last=False)
        return text

    def _no_template(self) -> None:
        """Says once per tokenizer, at the first chat prompt, that its template is unknown."""
        spec = self.counter.spec
        if not self.counter.has_template and spec not in _warned_chat:
            _warned_chat.add(spec)
            log.warning(
                "--tokenizer %s: no chat template (tokenizer_config.json chat_template or chat_template.jinja); "
                "chat prompts count their text only, the server's template tokens come on top "
                "(reported as prompt-token drift)",
                spec,
            )

    # -- counting ----------------------------------------------------------------------------
    def count(self, text: str, chat: bool, images: int = 0, before: Sequence[dict[str, Any]] = ()) -> int:
        """The server's prompt tokens (text tokens with images) of ``text`` sent as a completions
        prompt, or as the last user message of a chat after the messages ``before``."""
        if not chat:
            return len(self.counter.completion_ids(text))
        self._no_template()
        return self.counter.text_tokens([*before, self.message(text, images)])

    @staticmethod
    def message(text: str, images: int = 0) -> dict[str, Any]:
        """The user message of ``text`` (and ``images`` image parts, as the template sees them)."""
        if not images:
            return {"role": "user", "content": text}
        return {"role": "user", "content": [{"type": "text", "text": text}] + [{"type": "image"}] * images}

    def overhead(self, chat: bool, images: int = 0) -> int:
        """Tokens the server counts beyond a prompt's content (the template's, a BOS), probed once
        per shape with a content of (at most) eight tokens."""
        key = (chat, images)
        o = self._overhead.get(key)
        if o is None:
            k = min(8, self.builder.block_size)
            o = self._overhead[key] = self.count(self.content([0], k), chat, images) - k
        return o

    def frame(self, chat: bool, images: int = 0) -> tuple[int, int]:
        """(head, tail): the server's tokens before and after a prompt's content (the template's
        prefix, its generation prompt; a BOS), found in the probe's encoding; (0, 0) when the
        content's ids are not found there (no round-trip-safe vocabulary)."""
        got = self._frames.get((chat, images))
        if got is not None:
            return got
        k = min(8, self.builder.block_size)
        text = self.content([0], k)
        want = self.content_builder.prompt_ids([0], k).tolist()
        if not chat:
            ids = self.counter.completion_ids(text)
        else:
            ids = self.counter.chat_ids([self.message(text, images)])
        head = next((i for i in range(len(ids)) if ids[i : i + k] == want), None)
        out = (0, 0) if head is None else (head, self.overhead(chat, images) - head)
        self._frames[(chat, images)] = out
        return out

    # -- prompts -----------------------------------------------------------------------------
    def prompt_text(self, hash_ids: Sequence[int], input_length: int, chat: bool = False, images: int = 0) -> str:
        """The prompt text (a completions prompt, or a chat's only user message) that the server
        counts as exactly ``input_length`` tokens, the closest one when none does. Raises
        ValueError when ``hash_ids`` cannot cover ``input_length`` tokens."""
        bs = self.builder.block_size
        n = len(hash_ids)
        if input_length < 1 or n * bs < input_length or (n - 1) * bs >= input_length:
            raise ValueError(
                f"{n} hash ids of {bs} tokens cannot make exactly "
                f"{input_length} tokens (need ceil({input_length}/{bs}) ids)"
            )
        return self.fit(hash_ids, input_length, chat, images)

    def fit(
        self,
        hash_ids: Sequence[int],
        target: int,
        chat: bool,
        images: int = 0,
        before: Sequence[dict[str, Any]] = (),
    ) -> str:
        """The content of ``hash_ids``'s blocks whose prompt (after ``before``, for a chat) counts
        ``target`` tokens: its length corrected until exact, else the closest tried."""
        cap = len(hash_ids) * self.builder.block_size
        base = self.overhead(chat, images) if not before else self.count("", chat, images, before)
        m = max(1, min(cap, target - base))
        if self.safe is not None and not before:
            text = self.content(hash_ids, m)
            if self.count(self._edges(hash_ids, m), chat, images) == base + min(m, 2 * EDGE):
                return text  # the content exact by construction, its junctions with the frame checked
        best: tuple[int, str] | None = None
        tried: set[int] = set()
        for _ in range(MAX_TRIES):
            tried.add(m)
            text = self.content(hash_ids, m)
            c = self.count(text, chat, images, before)
            if best is None or abs(c - target) < best[0]:
                best = (abs(c - target), text)
            if c == target:
                return text
            m = max(1, min(cap, m + target - c))
            if m in tried:
                break
        assert best is not None
        return best[1]

    def _edges(self, hash_ids: Sequence[int], m: int) -> str:
        """The text of the first and the last ``EDGE`` tokens of a content of ``m`` tokens (the
        whole content when it is shorter): the pieces that meet the template's head and tail."""
        if m <= 2 * EDGE:
            return self.content(hash_ids, m)
        assert self.safe is not None
        bs = self.builder.block_size
        first = self.content_builder.prompt_ids(hash_ids[: -(-EDGE // bs)], EDGE)
        blocks = list(hash_ids[(m - EDGE) // bs : -(-m // bs)])
        ids = np.concatenate([self.content_builder.block_ids(int(h)) for h in blocks])
        a = (m - EDGE) % bs
        last = ids[a : a + EDGE]
        return "".join(self.safe.piece[np.concatenate((first, last))].tolist())

    def answer(self, hash_ids: Sequence[int], length: int) -> str:
        """A stand-in answer of ``length`` tokens (the blocks of ``hash_ids``), as text."""
        return self.content(hash_ids, length)
