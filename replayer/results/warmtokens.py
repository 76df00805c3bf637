"""The warm-up boundary, cut by token (issue 47): a warm-up request sent before the boundary
(the first measured request's send) may stream most of its tokens after it; those tokens were
produced by the server inside the measured window, so the window's output throughput counts
them (those streamed after the window's end are outside it, as for any request). Kept per
warm-up request: its first and last token times and its output tokens; its tokens in the window
are the share of its first-to-last span that lies inside it (tokens taken as evenly spread over
that span)."""

from __future__ import annotations

import numpy as np

__all__ = ["WarmTokens"]


class WarmTokens:
    """The successful warm-up requests' (first token ns, last token ns, output tokens)."""

    def __init__(self) -> None:
        self.first = np.zeros(0)
        self.last = np.zeros(0)
        self.tokens = np.zeros(0)

    def add(self, first_ns: np.ndarray, last_ns: np.ndarray, tokens: np.ndarray) -> None:
        """Add requests (float arrays; NaN: unknown, left out)."""
        keep = ~(np.isnan(first_ns) | np.isnan(last_ns) | np.isnan(tokens))
        self.first = np.concatenate([self.first, first_ns[keep]])
        self.last = np.concatenate([self.last, last_ns[keep]])
        self.tokens = np.concatenate([self.tokens, tokens[keep]])

    def merge(self, other: WarmTokens) -> None:
        self.add(other.first, other.last, other.tokens)

    def within(self, start_ns: float, end_ns: float) -> int:
        """Output tokens the warm-up requests streamed inside the window ``start_ns``..``end_ns``
        (0 when it is not finite): each request's tokens times the share of its first-to-last
        token span inside the window (all of them when the span is a point inside it)."""
        if not (np.isfinite(start_ns) and np.isfinite(end_ns)) or not self.tokens.size:
            return 0
        span = self.last - self.first
        inside = np.clip(np.minimum(self.last, end_ns) - np.maximum(self.first, start_ns), 0.0, None)
        with np.errstate(divide="ignore", invalid="ignore"):
            point = ((self.first >= start_ns) & (self.first <= end_ns)).astype(float)
            share = np.where(span > 0, inside / span, point)
        return int(round(float((np.clip(share, 0.0, 1.0) * self.tokens).sum())))
