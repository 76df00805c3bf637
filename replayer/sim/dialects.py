"""The simulator speaking another engine's dialect (``replayer sim --engine``): that engine's
``/metrics`` names and path, its ``/v1/models`` owner, what it refuses and how its in-band
errors look, so each dialect is tested end to end without the engine.

vLLM's own page stays ``replayer.sim.metrics`` (a prometheus_client collector); for the others
``dialect_page`` writes the exposition text from the engine's table
(``replayer.observe.dialects``): each canonical value the simulator counts goes out under the
engine's preferred sample name, a ``_sum`` name as a histogram (``+Inf`` bucket, ``_sum``,
``_count`` = requests), a ``name{label="v"}`` spec with its label. A value the engine does not
export is not on its page (the reader then reports it unknown, never 0). Also the model check
every engine makes: a request naming a model it does not serve gets a 404.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from replayer.core.engines import engine_caps
from replayer.observe.dialects import dialect
from replayer.observe.dialects.base import SAMPLE_SPEC

__all__ = ["iteration_stats", "dialect_page", "model_not_found", "token_ids_refused", "stream_error", "metrics_paths"]


def _values(server: Any) -> dict[str, float]:
    """The simulator's counts under their canonical names."""
    m = server._metrics  # noqa: SLF001 - the simulator's own counters
    cache = server.prefix_cache
    out = {
        "prompt_tokens": float(m.prompt_tokens),
        "generation_tokens": float(m.generation_tokens),
        "request_success": float(m.success + m.success_stop),
        "prefix_cache_queries": float(m.prefix_queries),
        "prefix_cache_hits": float(m.prefix_hits),
        "num_requests_running": float(server.num_requests_running),
        "num_requests_waiting": float(server.num_requests_waiting),
        "kv_cache_usage_perc": cache.usage(),
        "kv_active_blocks": float(round(cache.usage() * cache.capacity)),
        "kv_total_blocks": float(cache.capacity),
    }
    if m.prefix_queries:
        out["server_prefix_cache_hit_rate"] = m.prefix_hits / m.prefix_queries
    return out


def _fmt(v: float) -> str:
    return repr(float(v))


def dialect_page(server: Any) -> str:
    """The Prometheus text of ``server`` (a ``SimServer``) in its engine's names."""
    d = dialect(server.config.engine)
    values = _values(server)
    requests = values["request_success"]
    labels = {"model_name": server.config.model}
    lines: list[str] = []
    for table, kind in ((d.counters, "counter"), (d.gauges, "gauge"), (d.parts, "gauge")):
        for canon, specs in table.items():
            if canon not in values:
                continue
            m = SAMPLE_SPEC.match(specs[0])
            assert m is not None
            name, extra = m.group(1), ({m.group(2): m.group(3)} if m.group(2) else {})
            lab = "{" + ",".join(f'{k}="{v}"' for k, v in {**labels, **extra}.items()) + "}"
            v = values[canon]
            if name.endswith("_sum"):
                fam = name[: -len("_sum")]
                lines += [
                    f"# TYPE {fam} histogram",
                    f'{fam}_bucket{lab[:-1]},le="+Inf"}} {_fmt(requests)}',
                    f"{fam}_sum{lab} {_fmt(v)}",
                    f"{fam}_count{lab} {_fmt(requests)}",
                ]
            else:
                fam = name[: -len("_total")] if kind == "counter" and name.endswith("_total") else name
                lines += [f"# TYPE {fam} {kind}", f"{name}{lab} {_fmt(v)}"]
    return "\n".join(lines) + "\n"


def metrics_paths(engine: str) -> tuple[str, str | None]:
    """(the path of the engine's Prometheus text, a ``/metrics`` that answers JSON instead or
    None): trtllm-serve's ``/metrics`` is its iteration statistics (a JSON list)."""
    path = engine_caps(engine).metrics_path
    return path, ("/metrics" if path != "/metrics" else None)


async def iteration_stats(request: web.Request) -> web.Response:
    """trtllm-serve's ``/metrics``: its iteration statistics, a JSON list (none kept here)."""
    return web.Response(body=b"[]", content_type="application/json")


def model_not_found(model: Any, served: str) -> web.Response | None:
    """vLLM's 404 for a request naming a model it does not serve (None: the model is served,
    or the request names none)."""
    if not isinstance(model, str) or not model or model == served:
        return None
    body = {
        "error": {
            "message": f"The model `{model}` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    return web.Response(status=404, body=orjson.dumps(body), content_type="application/json")


def token_ids_refused(engine: str) -> web.Response | None:
    """The answer of an engine whose ``/v1/completions`` takes text only to a token-id prompt
    (TGI: a 422 with its ``error``/``error_type`` body), or None."""
    if engine_caps(engine).token_ids:
        return None
    body = {"error": "Input validation error: `prompt` must be a string", "error_type": "validation"}
    return web.Response(status=422, body=orjson.dumps(body), content_type="application/json")


def stream_error(engine: str, body: dict[str, Any]) -> bytes:
    """An error inside a stream as the engine writes it: ``data: {...}`` then ``[DONE]``, or
    llama.cpp's SSE ``error:`` field (no ``data:``, no ``[DONE]``). (TGI never gets here: it
    refuses token ids before streaming, ``token_ids_refused``.)"""
    if engine == "llamacpp":
        return b"error: " + orjson.dumps(body.get("error", body)) + b"\n\n"
    return b"data: " + orjson.dumps(body) + b"\n\ndata: [DONE]\n\n"
