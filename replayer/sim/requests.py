"""The simulator's request parsing and validation: a completions or chat body -> the prompt as
sent, its ids, its prompt token count and the generation options, or a vLLM-like 400 (its body:
``_error_response``).

A mixin of :class:`replayer.sim.server.SimServer` (``_Parsing``; chat images are decoded with its
``images``), kept apart from the routes and the generation path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from aiohttp import web

from replayer.payload.chattemplate import ChatCounter
from replayer.sim.images import ImageError, SimImages


class _BadRequest(Exception):
    """A request the sim refuses (HTTP 400), with a vLLM-like message."""


def _error_body(message: str, code: int = 400) -> dict[str, Any]:
    """vLLM's error body."""
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": code}}


def _error_response(message: str) -> web.Response:
    """An HTTP 400 with vLLM's error body."""
    return web.Response(status=400, body=orjson.dumps(_error_body(message)), content_type="application/json")


class _Parsing:
    """Completions and chat bodies -> (prompt as sent, ids, prompt_tokens, opts)."""

    images: SimImages
    counter: ChatCounter | None  # --tokenizer: prompts counted as vLLM counts them

    def _parse(self, body: Any) -> tuple[Any, np.ndarray, int, dict[str, Any]]:
        """Validate a completions body -> (prompt as sent, ids, prompt_tokens, opts).

        ``ids`` is an int64 array for token-id prompts, a hash-per-word array for text.
        Raises _BadRequest with a vLLM-like message.
        """
        if not isinstance(body, dict):
            raise _BadRequest("Request body must be a JSON object")
        if "prompt" not in body or body["prompt"] is None:
            raise _BadRequest("Field required: prompt")
        prompt = body["prompt"]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
            if len(prompt) != 1:
                raise _BadRequest(f"The sim supports one prompt per request; got a batch of {len(prompt)}")
            prompt = prompt[0]
        if isinstance(prompt, str) and self.counter is not None:
            ids = np.array(self.counter.completion_ids(prompt), dtype=np.int64)
            text = True
        elif isinstance(prompt, str):
            words = prompt.split()
            ids = np.fromiter((hash(w) for w in words), dtype=np.int64, count=len(words))
            text = True
        elif isinstance(prompt, list):
            try:
                # fromiter accepts bool/float silently; vLLM's pydantic would reject them,
                # but the replayer only sends ints, so we skip a per-item type check.
                ids = np.fromiter(prompt, dtype=np.int64, count=len(prompt))
            except (TypeError, ValueError, OverflowError):
                raise _BadRequest(
                    "prompt must be a string, a list of token ids (ints), or a list with one of those"
                ) from None
            text = False
        else:
            raise _BadRequest("prompt must be a string or a list of token ids")
        if len(ids) == 0:
            raise _BadRequest("Prompt cannot be empty")
        return prompt, ids, len(ids), self._opts(body, body.get("max_tokens"), text, False)

    def _parse_chat(self, body: Any) -> tuple[Any, np.ndarray, int, dict[str, Any]]:
        """Validate a chat body -> (messages as sent, word-hash ids, prompt_tokens, opts).

        prompt_tokens = whitespace words over all message contents (string or text parts), the
        sim adding no chat-template tokens; with a tokenizer (``counter``) the tokens of the
        template rendered over the messages, each image's placeholder token replaced by its
        image tokens (``_counted``). Raises _BadRequest.
        """
        if not isinstance(body, dict):
            raise _BadRequest("Request body must be a JSON object")
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise _BadRequest("messages must be a non-empty list")
        words: list[str] = []
        images: list = []
        for m in msgs:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise _BadRequest('each message must be an object with a string "role"')
            c = m.get("content")
            if isinstance(c, str):
                words += c.split()
            elif isinstance(c, list):
                for part in c:
                    if isinstance(part, dict) and part.get("type") == "image_url":
                        url = part.get("image_url")
                        try:
                            images.append(self.images.decode(url.get("url") if isinstance(url, dict) else url))
                        except ImageError as e:
                            raise _BadRequest(str(e)) from None
                        continue
                    if not (
                        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
                    ):
                        raise _BadRequest(
                            'the sim supports only {"type": "text", "text": ...} and '
                            '{"type": "image_url", ...} content parts'
                        )
                    words += part["text"].split()
            elif c is not None:
                raise _BadRequest("message content must be a string, a list of parts or null")
        if not words and not images:
            raise _BadRequest("Prompt cannot be empty")
        if self.counter is not None:
            ids = self._counted(msgs, len(images))
        else:
            ids = np.fromiter((hash(w) for w in words), dtype=np.int64, count=len(words))
        if images:  # the images' placeholder tokens follow the text (as the replayer sends them)
            ids = np.concatenate([ids, *(self.images.token_ids(im) for im in images)])
        mt = body.get("max_completion_tokens")  # vLLM: preferred over max_tokens
        o = self._opts(body, body.get("max_tokens") if mt is None else mt, True, True)
        o["images"] = images
        return msgs, ids, len(ids), o

    def _counted(self, msgs: list[Any], images: int) -> np.ndarray:
        """The text token ids of chat ``msgs`` as vLLM makes them: the chat template rendered
        (``replayer.payload.chattemplate``), encoded, one placeholder token per image left out (the
        image tokens are appended by the caller). Raises _BadRequest when the template fails."""
        assert self.counter is not None
        try:
            ids = self.counter.chat_ids(msgs)
        except Exception as e:  # jinja2's TemplateError, a template reading a missing field
            raise _BadRequest(f"chat template: {e}") from None
        drop = self.counter.placeholders(images)
        if drop:
            ids = ids[: len(ids) - drop]
        return np.array(ids, dtype=np.int64)

    @staticmethod
    def _opts(body: dict[str, Any], max_tokens: Any, text: bool, chat: bool) -> dict[str, Any]:
        """Generation options shared by completions and chat. Raises _BadRequest."""
        if max_tokens is None:
            max_tokens = 16
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise _BadRequest(f"max_tokens must be at least 1, got {max_tokens}.")
        so = body.get("stream_options") or {}
        if not isinstance(so, dict):
            raise _BadRequest("stream_options must be an object")
        return {
            "max_tokens": max_tokens,
            "stream": bool(body.get("stream", False)),
            "include_usage": bool(so.get("include_usage", False)),
            "continuous": bool(so.get("include_usage", False)) and bool(so.get("continuous_usage_stats", False)),
            "model": body.get("model"),
            "min_tokens": body.get("min_tokens"),
            "ignore_eos": body.get("ignore_eos"),
            "text": text,
            "chat": chat,
            "metrics": body.get("include_metrics") is True,  # PR #46768's request field
        }
