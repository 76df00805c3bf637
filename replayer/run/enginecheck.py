"""At start, after readiness: which engine serves the target (``--engine`` forces it), whether it
serves ``--model``, and whether it can take what the trace asks of it. Nothing is sent before.

``detect_engine`` tries, in order: the Prometheus text at ``/metrics`` (then
``/prometheus/metrics``, trtllm-serve's), whose sample-name prefixes name the engine;
``/v1/models``' ``owned_by``; SGLang's ``/server_info`` and TGI's ``/info``. The pure readers
are ``replayer.observe.dialects.detect``. An engine not recognised is said in the log and read
in vLLM's names (what most OpenAI-compatible servers copy), its request extensions kept as
vLLM's (``--no-vllm-extensions`` leaves them out).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import aiohttp

from replayer.core.engines import EngineCaps, engine_caps
from replayer.http.tls import TLSOptions
from replayer.observe.dialects.detect import engine_from_info, engine_from_metrics, engine_from_models
from replayer.run.readiness import StartupError

if TYPE_CHECKING:
    from replayer.config.model import RunConfig

log = logging.getLogger("replayer")

__all__ = ["detect_engine", "check_model", "check_capabilities", "engine_settings"]


async def _get(session: aiohttp.ClientSession, url: str, kw: dict, json: bool) -> object | None:
    """The body of a GET answered 200 (text, or parsed JSON), else None."""
    try:
        async with session.get(url, **kw) as r:
            if r.status != 200:
                return None
            if json:
                return await r.json(content_type=None)
            return await r.text()
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError):
        return None


async def detect_engine(
    base_url: str, api_key: str | None, tls: TLSOptions | None = None, forced: str | None = None
) -> tuple[str | None, str]:
    """``(engine, how it was known)``: ``forced`` as given (``--engine``), else detected; ``(None,
    why not)`` when nothing names one."""
    if forced:
        engine_caps(forced)  # (ValueError naming the engines)
        return forced, "--engine"
    base = base_url.rstrip("/")
    kw = dict((tls or TLSOptions()).request_kwargs(base.startswith("https://")))
    if api_key:
        kw["headers"] = {"Authorization": f"Bearer {api_key}"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
        for path in ("/metrics", "/prometheus/metrics"):
            text = await _get(s, base + path, kw, json=False)
            engine = engine_from_metrics(text) if isinstance(text, str) else None
            if engine:
                return engine, f"its {path} names"
        engine = engine_from_models(await _get(s, base + "/v1/models", kw, json=True))
        if engine:
            return engine, "its /v1/models owned_by"
        for path in ("/server_info", "/info"):
            engine = engine_from_info(path, await _get(s, base + path, kw, json=True))
            if engine:
                return engine, f"its {path}"
    return None, "no known /metrics names, /v1/models owner, /server_info or /info"


def check_model(model: str, listed: list[str | None], target: str) -> None:
    """StartupError (exit 2) when ``target`` lists models and ``model`` is not one of them, naming
    the ones it serves (an empty list is taken as "any": a server that lists none)."""
    served = [m for m in listed if m]
    if served and model not in served:
        raise StartupError(
            f"target {target} does not serve the model {model!r}; it serves: {', '.join(served)} "
            "(--model names one of them)"
        )


def check_capabilities(caps: EngineCaps, *, token_ids: bool, endpoint: str) -> None:
    """StartupError where the trace asks for what the engine cannot do: token-id prompts to an
    engine whose completions take text only. Logs what is only estimated (an engine that cannot
    force the output length)."""
    if token_ids and "completions" in endpoint and not caps.token_ids:
        raise StartupError(
            f"{caps.label} takes text prompts only (no token ids on /v1/completions): replay with "
            "--prompt-mode text and a --tokenizer for the model (docs/engines.md)"
        )
    if not caps.exact:
        log.warning(
            "%s has no ignore_eos/min_tokens: output lengths are at most the trace's "
            "(a reply may stop at EOS earlier); the summary's output tokens are what it sent",
            caps.label,
        )


async def engine_settings(
    cfg: RunConfig, targets: list[str], listed: list[list[str | None]], model: str, api_key: str | None
) -> RunConfig:
    """The run's settings once the targets answer: every target serves ``model`` (else
    StartupError), the engine (``--engine``, or detected on the first target) said in the log,
    what the trace asks checked against it; returns ``cfg`` with ``engine`` set (None: not
    recognised, read as vLLM)."""
    for url, models in zip(targets, listed, strict=True):
        check_model(model, models, url)
    engine, how = await detect_engine(targets[0], api_key, cfg.tls, cfg.engine)
    if engine is None:
        log.warning("target engine not recognised (%s): reading vLLM's metric names (--engine sets it)", how)
    else:
        log.info("target engine: %s (from %s)", engine_caps(engine).label, how)
    caps = engine_caps(engine or "vllm")
    token_ids = cfg.prompt_mode != "text" and cfg.endpoint.endswith("/completions") and "chat" not in cfg.endpoint
    check_capabilities(caps, token_ids=token_ids, endpoint=cfg.endpoint)
    return cfg.model_copy(update={"engine": engine})
