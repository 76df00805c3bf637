"""Which engine serves a target, told from what it answers (pure; the start-up probe that GETs
the pages is ``replayer.run.enginecheck``).

``engine_from_metrics(text)``: the engine whose sample-name prefix the Prometheus text holds the
most of (``vllm:``, ``sglang:``, ``tgi_``, ``trtllm_``, ``dynamo_frontend_``, ``llamacpp:``); a
page with any ``dynamo_frontend_`` sample is Dynamo's frontend (it may pass an engine's names
through). ``engine_from_models(body)``: from ``/v1/models`` entries' ``owned_by``.
``engine_from_info(path, body)``: from SGLang's ``/server_info`` or TGI's ``/info``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PREFIXES", "OWNERS", "engine_from_metrics", "engine_from_models", "engine_from_info"]

#: sample-name prefix -> engine
PREFIXES = {
    "vllm:": "vllm",
    "sglang:": "sglang",
    "tgi_": "tgi",
    "trtllm_": "trtllm",
    "dynamo_frontend_": "dynamo",
    "llamacpp:": "llamacpp",
}
#: ``/v1/models`` ``owned_by`` -> engine
OWNERS = {"vllm": "vllm", "sglang": "sglang", "tensorrt_llm": "trtllm", "nvidia": "dynamo", "llamacpp": "llamacpp"}


def engine_from_metrics(text: str) -> str | None:
    """The engine of a ``/metrics`` page, or None when no known prefix is there."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        for prefix, engine in PREFIXES.items():
            if line.startswith(prefix):
                counts[engine] = counts.get(engine, 0) + 1
                break
    if not counts:
        return None
    if "dynamo" in counts:
        return "dynamo"
    return max(counts, key=lambda e: counts[e])


def engine_from_models(body: Any) -> str | None:
    """The engine named by ``/v1/models``' ``owned_by`` (the first entry that names one)."""
    data = body.get("data") if isinstance(body, dict) else None
    for m in data if isinstance(data, list) else ():
        if isinstance(m, dict) and isinstance(m.get("owned_by"), str):
            engine = OWNERS.get(m["owned_by"].lower())
            if engine:
                return engine
    return None


def engine_from_info(path: str, body: Any) -> str | None:
    """SGLang answers ``/server_info`` (its server arguments, ``tp_size`` among them); TGI's
    ``/info`` names its router."""
    if not isinstance(body, dict):
        return None
    if path == "/server_info" and ("tp_size" in body or "model_path" in body):
        return "sglang"
    if path == "/info" and "text-generation" in str(body.get("router", "")):
        return "tgi"
    return None
