"""Engines' ``/metrics`` dialects: each engine's sample names read as replayer's canonical ones.

One module per engine (``vllm``, ``sglang``, ``tgi``, ``trtllm``, ``dynamo``, ``llamacpp``),
each a ``Dialect`` table citing the engine's source; ``base`` has the canonical names and how a
table is read; ``detect`` tells the engine from what it serves. ``dialect(name)`` gives a table.
"""

from __future__ import annotations

from replayer.observe.dialects import dynamo, llamacpp, sglang, tgi, trtllm, vllm
from replayer.observe.dialects.base import CANONICAL_COUNTERS, CANONICAL_GAUGES, Dialect

__all__ = ["DIALECTS", "CANONICAL_COUNTERS", "CANONICAL_GAUGES", "Dialect", "dialect"]

#: every dialect by engine name (``replayer.core.engines.ENGINES``)
DIALECTS: dict[str, Dialect] = {m.DIALECT.name: m.DIALECT for m in (vllm, sglang, tgi, trtllm, dynamo, llamacpp)}


def dialect(name: str | None) -> Dialect:
    """The dialect of engine ``name`` (vLLM's for None: an engine not known speaks the names
    most OpenAI-compatible servers copy)."""
    if name is None:
        return DIALECTS["vllm"]
    try:
        return DIALECTS[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}: one of {', '.join(DIALECTS)}") from None
