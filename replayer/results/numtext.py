"""Numbers in the printed lines of the verdicts: plain (four significant digits, thousands
separated, never an exponent: ``+37,170 ms/h``, not ``+3.717e+04``) and counted nouns (``1 window``,
``2 windows``)."""

from __future__ import annotations

import math

__all__ = ["count", "plain"]

#: digits kept after the point at the most (a smaller number prints as 0)
MAX_DECIMALS = 6


def plain(v: float, *, signed: bool = False, digits: int = 4) -> str:
    """``v`` to ``digits`` significant digits (no trailing zeros after the point), thousands
    separated, without an exponent; with a sign (``+``/``-``) when ``signed``; ``nan``/``inf`` as
    Python spells them."""
    if not math.isfinite(v):
        return f"{v:+}" if signed else str(v)
    sign = "+" if signed else ""
    if v != 0:
        v = round(v, digits - 1 - math.floor(math.log10(abs(v))))  # (999.96 -> 1000.0: its own digits)
    decimals = 0 if v == 0 else min(MAX_DECIMALS, max(0, digits - 1 - math.floor(math.log10(abs(v)))))
    text = f"{v:{sign},.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` (thousands separated) and ``noun``, in the plural (``plural``, else ``noun + "s"``)
    unless ``n`` is 1."""
    return f"{n:,} {noun if n == 1 else (plural or noun + 's')}"
