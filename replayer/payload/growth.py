"""Prefix growth without hash ids (traces whose hash ids were synthesised, e.g. Azure): a
session's turn is its conversation so far. A turn's prompt is the previous turn's prompt, then a
stand-in for the previous answer (its ``output_length`` tokens: the blocks of ids
``mix64(s + b)``, b = 0, 1, ..., with ``s = mix64(first hash id of the previous turn ^
ANSWER_SALT)``), then the first tokens of its own expansion, cut to ``input_length``; chat turns
send that history as alternating user/assistant messages (the answer's and the new message's
texts from ``textprompts``), the new message's length fitted so that the template over the whole
conversation counts ``input_length`` tokens. The histories live in an LRU bounded in tokens; a
turn whose history was evicted (or whose session began before a resume) is built from its own
hash ids.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import orjson

from replayer.core.endpoints import CHAT
from replayer.core.hashing import mix64
from replayer.core.request import PreparedRequest
from replayer.payload.body import PayloadBuilder
from replayer.payload.prompts import PromptBuilder
from replayer.payload.textprompts import TextPromptBuilder

ANSWER_SALT = 0xA5A5_0A5A_5A5A_A5A5
HISTORY_TOKENS = 32_000_000  # bound of the prefix-growth histories (int32 ids: 128 MB)


@dataclass
class _History:
    """A session's conversation so far."""

    ids: np.ndarray  # the previous turn's prompt (int32)
    answer_seed: int  # block id of the previous answer's stand-in
    output_length: int  # the previous answer's length
    messages: list[dict] = field(default_factory=list)  # chat: the previous turn's messages


class Conversations:
    """The sessions' conversations so far, in an LRU bounded at ``max_tokens`` prompt tokens."""

    def __init__(self, max_tokens: int = HISTORY_TOKENS) -> None:
        self.max_tokens = max_tokens
        self._histories: OrderedDict[object, _History] = OrderedDict()
        self._tokens = 0

    def build(
        self,
        req: PreparedRequest,
        payload: PayloadBuilder,
        hash_ids,
        skey: object,
        kind: str,
        builder: PromptBuilder,
        text: Callable[[], TextPromptBuilder],
        text_mode: bool,
    ) -> None:
        """Set ``req.body``: the turn of session ``skey`` as its conversation so far (module
        docstring), then remember it as the session's history. ``builder``: the pass's token-id
        prompts; ``text()``: its text prompts (raises without a tokenizer); ``text_mode``: text
        prompts on completions (``--prompt-mode text``)."""
        n_in = req.input_length
        own = builder.prompt_ids(hash_ids, n_in).astype(np.int32)
        h = self._histories.pop(skey, None)
        if h is not None:
            self._tokens -= h.ids.size
        answer = np.empty(0, np.int32)
        if h is not None:
            blocks = -(-h.output_length // builder.block_size)
            answer = np.concatenate([builder.block_ids(mix64(h.answer_seed + b)) for b in range(blocks)])[
                : h.output_length
            ].astype(np.int32)
            history = np.concatenate((h.ids, answer))
            new = own[: max(0, n_in - history.size)]
            ids = np.concatenate((history, new))[:n_in]
        else:
            new, ids = own, own
        if kind == CHAT:  # the template over the whole conversation counts input_length tokens
            tp = text()
            messages = list(h.messages) if h is not None else []
            if h is not None:
                seeds = [mix64(h.answer_seed + b) for b in range(-(-h.output_length // builder.block_size))]
                messages.append({"role": "assistant", "content": tp.answer(seeds, h.output_length)})
            messages.append({"role": "user", "content": tp.fit(hash_ids, n_in, True, 0, before=messages)})
            req.body = payload.messages_body(messages, req.output_length)
        else:
            messages = []
            if text_mode:
                req.body = payload.text_body(text().decode(ids), req.output_length, chat=False)
            else:
                req.body = payload.body(orjson.dumps(ids, option=orjson.OPT_SERIALIZE_NUMPY), req.output_length)
        first = int(hash_ids[0]) if len(hash_ids) else req.row
        self._histories[skey] = _History(
            ids=ids, answer_seed=mix64(first ^ ANSWER_SALT), output_length=req.output_length, messages=messages
        )
        self._tokens += ids.size
        while self._tokens > self.max_tokens and self._histories:
            _, old = self._histories.popitem(last=False)
            self._tokens -= old.ids.size
