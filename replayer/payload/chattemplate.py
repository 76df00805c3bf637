"""A tokenizer folder's chat template, rendered and counted as an OpenAI-compatible server does.

A chat request's ``prompt_tokens`` at the server are the tokens of the model's chat template
rendered over the messages (role markers, BOS, the generation prompt), not only the contents'.
:class:`ChatCounter` reproduces that without ``transformers``: the template comes from the folder's
``chat_template.jinja`` or ``tokenizer_config.json`` (``chat_template``: a string, or a list of
``{"name", "template"}`` of which ``default`` is taken), rendered with Jinja2 the way
``transformers.apply_chat_template`` does (a sandboxed environment with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, ``raise_exception``, ``strftime_now``, the
``tojson`` filter; ``messages``, ``add_generation_prompt=True`` and the special tokens of
``tokenizer_config.json`` as variables), then encoded without added special tokens, as vLLM's chat
endpoint does (the template holds the BOS it wants).

Message contents are given to the template as vLLM gives them: a template that iterates over a
message's content (the "openai" content format) gets every content as a list of parts
(``{"type": "text", "text": ...}``, an image as ``{"type": "image"}``); any other template gets the
text as a string. The server replaces each image's placeholder with the image's own tokens:
:meth:`ChatCounter.text_tokens` counts the text tokens of a request as the rendered prompt's
tokens less one placeholder token per image (as Qwen2-VL's ``<|image_pad|>``) for a template that
renders content parts; a "string" template renders no image, and the placeholders the server adds
for one are not counted (a residual the run reports).

Completions prompts (no template) are encoded with the tokenizer's added special tokens (a BOS
that its post-processor adds), as vLLM's completions endpoint does.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime
from typing import Any

from replayer.core.tokenizerfiles import BUILTIN_PREFIX, tokenizer_file

__all__ = ["ChatCounter", "load_template"]

#: a template that loops over a message's content takes a list of parts (vLLM's "openai" format)
_LOOPS_OVER_CONTENT = re.compile(r"for\s+\w+\s+in\s+[\w.]+(\[\s*['\"]content['\"]\s*\]|\.content)")


def _folder(spec: str) -> str | None:
    """The folder of a ``--tokenizer`` value (None for a shipped tokenizer: no template there)."""
    if spec.startswith(BUILTIN_PREFIX):
        return None
    return spec if os.path.isdir(spec) else os.path.dirname(os.path.abspath(spec))


def load_template(spec: str) -> tuple[str | None, dict[str, str]]:
    """(the chat template's source or None, the special tokens by name) of a ``--tokenizer``
    value's folder: ``chat_template.jinja`` first, then ``tokenizer_config.json``'s
    ``chat_template``. Raises ValueError naming the file when it is not valid JSON."""
    folder = _folder(spec)
    if folder is None:
        return None, {}
    config: dict[str, Any] = {}
    path = os.path.join(folder, "tokenizer_config.json")
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not a readable JSON object ({e})") from None
    specials: dict[str, str] = {}
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        v = config.get(name)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            specials[name] = v
    jinja = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as f:
            return f.read(), specials
    t = config.get("chat_template")
    if isinstance(t, list):
        named = {d.get("name"): d.get("template") for d in t if isinstance(d, dict)}
        t = named.get("default")
    return (t if isinstance(t, str) else None), specials


def _compile(source: str) -> Any:
    """The template compiled as ``transformers`` compiles chat templates."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


class ChatCounter:
    """Counts prompts as the server will: ``chat_ids(messages)`` renders the chat template (when
    the folder has one) and encodes the result; ``completion_ids(text)`` encodes with special
    tokens. ``template`` is None when the folder has none (``has_template`` False): chat messages
    are then counted as their contents' tokens only, and the server's own template is unknown.
    Raises FileNotFoundError for a missing tokenizer, ValueError for a broken config."""

    def __init__(self, spec: str) -> None:
        from tokenizers import Tokenizer

        file = tokenizer_file(spec)
        if not os.path.isfile(file):
            raise FileNotFoundError(f"--tokenizer {spec}: no tokenizer.json found")
        self.spec = spec
        self.tokenizer = Tokenizer.from_file(file)
        source, self.specials = load_template(spec)
        self.template = _compile(source) if source else None
        self.parts = bool(source and _LOOPS_OVER_CONTENT.search(source))  # vLLM's "openai" content format

    @property
    def has_template(self) -> bool:
        return self.template is not None

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The template over ``messages`` (``{"role", "content"}``; a content a string or a list
        of ``{"type": "text"|"image"|"image_url", ...}`` parts) with the generation prompt; without
        a template, the contents' texts joined. Raises jinja2's TemplateError."""
        msgs = [self._message(m) for m in messages]
        if self.template is None:
            return "".join(m["content"] if isinstance(m["content"], str) else _text_of(m["content"]) for m in msgs)
        out: str = self.template.render(messages=msgs, add_generation_prompt=True, tools=None, **self.specials)
        return out

    def _message(self, m: dict[str, Any]) -> dict[str, Any]:
        c = m.get("content")
        if isinstance(c, list):
            parts = [{"type": "image"} if p.get("type") in ("image", "image_url") else p for p in c]
            c = parts if self.parts else _text_of(parts)
        elif self.parts and isinstance(c, str):
            c = [{"type": "text", "text": c}]
        return {**m, "content": c}

    def chat_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """The token ids the server prefills for ``messages`` (template rendered, then encoded
        without added special tokens; image placeholders not expanded)."""
        ids: list[int] = self.tokenizer.encode(self.render(messages), add_special_tokens=False).ids
        return ids

    def completion_ids(self, text: str) -> list[int]:
        """The token ids of a completions text prompt (with the tokenizer's special tokens)."""
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=True).ids
        return ids

    def text_tokens(self, messages: list[dict[str, Any]]) -> int:
        """Text tokens of a chat prompt: the rendered prompt's tokens less one placeholder per
        image (the server's image tokens replace it)."""
        images = sum(
            1
            for m in messages
            if isinstance(m.get("content"), list)
            for p in m["content"]
            if p.get("type") in ("image", "image_url")
        )
        return len(self.chat_ids(messages)) - self.placeholders(images)

    def placeholders(self, images: int) -> int:
        """Placeholder tokens the rendered prompt holds for ``images`` images: one each when the
        template renders content parts, else none (a "string" template leaves images out; the
        server's own placeholders are unknown here)."""
        return images if self.parts else 0


def _text_of(parts: list[dict[str, Any]]) -> str:
    """The text parts of a content list joined by newlines (vLLM's "string" content format)."""
    return "\n".join(p["text"] for p in parts if p.get("type") == "text" and isinstance(p.get("text"), str))
