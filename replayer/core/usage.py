"""The usage audit's rule: the server's reported usage against the trace's lengths, for a
successful generation request (pooling requests have their own audit, ``replayer.http.audit``).

- ``missing``: the server reported no prompt or no completion token count;
- a prompt mismatch: the prompt tokens it counted differ from ``input_length`` (an image request's
  prompt also holds its image tokens: its text tokens are compared, where the server split them);
- a completion mismatch: the completion tokens differ from ``output_length``.

One rule in two forms: ``of_request`` for one result as it arrives (the live metrics) and
``of_columns`` over a batch of results (the summary). tests/test_usage_rule.py holds them equal.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Mismatch(NamedTuple):
    """One request's verdict on its usage."""

    missing: bool
    prompt: bool
    completion: bool


def of_request(
    prompt_tokens: int | None,
    completion_tokens: int | None,
    input_length: int,
    output_length: int,
    *,
    images: int = 0,
    text_tokens: int | None = None,
) -> Mismatch:
    """The rule (module docstring) for one successful generation request."""
    counted = prompt_tokens if not images else text_tokens
    return Mismatch(
        missing=prompt_tokens is None or completion_tokens is None,
        prompt=prompt_tokens is not None and counted is not None and counted != input_length,
        completion=completion_tokens is not None and completion_tokens != output_length,
    )


class ColumnAudit(NamedTuple):
    """``of_columns``' per-request boolean arrays, and the prompt drift (server count - trace) of
    the requests whose prompt count is known."""

    missing: np.ndarray
    prompt: np.ndarray
    completion: np.ndarray
    drift: np.ndarray


def of_columns(
    prompt_tokens: np.ndarray,
    completion_tokens: np.ndarray,
    input_length: np.ndarray,
    output_length: np.ndarray,
    *,
    images: np.ndarray | None = None,
    text_tokens: np.ndarray | None = None,
) -> ColumnAudit:
    """The rule over float64 columns of successful generation requests (NaN: not reported)."""
    counted = prompt_tokens
    if images is not None and text_tokens is not None:
        counted = np.where(np.nan_to_num(images) > 0, text_tokens, prompt_tokens)
    known = ~np.isnan(prompt_tokens) & ~np.isnan(counted)
    has_c = ~np.isnan(completion_tokens)
    return ColumnAudit(
        missing=np.isnan(prompt_tokens) | ~has_c,
        prompt=known & (counted != input_length),
        completion=has_c & (completion_tokens != output_length),
        drift=(counted - input_length)[known],
    )
