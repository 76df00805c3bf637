"""Where a run sends: the target servers, their engine, API key, timeouts and retries, TLS, and
how sessions are spread over several targets (``RunConfig``'s "Target", "TLS" and "Several
targets" settings).

``RunConfig`` (``replayer.config.model``) inherits ``TargetSettings`` with the other groups' settings;
the checks that relate settings of several groups stay there. Fields are in the order of
``replayer.config.groups.GROUPS`` under each heading.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, Field, field_validator

from replayer.core.ports import url_port_problem
from replayer.http.tls import TLSOptions

__all__ = ["TargetSettings"]


class TargetSettings(BaseModel):
    """The "Target", "TLS (https:// targets)", "Several targets" settings of ``RunConfig``."""

    # -- Target
    target: list[str] | None = Field(
        None,
        description="base URL of the server (a trailing /v1 is dropped); "
        "repeat it for several targets (a session keeps the target of its first "
        "turn: --target-policy); none = start the embedded simulator",
    )
    model: str | None = Field(None, description="request 'model' field; none = the first of GET /v1/models")
    # issue 49: the target's engine (its /metrics names, request fields, what it refuses)
    engine: str | None = Field(
        None,
        description="the target's engine: vllm, sglang, tgi, trtllm, dynamo or llamacpp (its /metrics "
        "names and request fields, docs/engines.md); unset = detected at start",
    )
    endpoint: str = Field(
        "/v1/completions", description="API path requests are sent to (a trace's endpoint column overrides it per row)"
    )
    api_key_env: str = Field("REPLAYER_API_KEY", description="environment variable holding the API key")
    api_key_file: str | None = Field(
        None, description="file holding the API key (overrides the variable); unset = the variable"
    )
    vllm_extensions: bool = Field(
        True, description="send the engine's exact-length fields (ignore_eos, min_tokens: docs/engines.md)"
    )
    run_id: str | None = Field(
        None,
        description="the run's id: every request carries the header X-Request-Id: "
        "RUN_ID-LOOP-ROW (recorded as x_request_id), to join the results with the "
        "server's logs; none = a new random id (a resumed run keeps its run's)",
    )
    server_timings: bool = Field(
        False,
        description="ask the server for its per-request timings (vLLM "
        "--enable-per-request-metrics: the 'metrics' object; the request field "
        "include_metrics is sent) and record them (server_*_ms, client_overhead_ms)",
    )
    warm_connections: int = Field(
        128,
        ge=0,
        le=4096,
        description="keep-alive connections opened before the first request, so the first burst pays no TCP "
        "(or TLS) handshakes",
    )
    connect_timeout_s: float = Field(
        30.0, gt=0, description="connect timeout: the TCP connect and, for https://, the TLS handshake"
    )
    read_timeout_s: float = Field(
        600.0,
        ge=0,
        description="idle timeout: fail a request silent this long "
        "after its send or between two reads (first_byte_timeout, idle_timeout; 0 = none)",
    )
    request_timeout_s: float | None = Field(
        None,
        gt=0,
        description="total timeout: fail a request "
        "whose response is not complete this long after its send "
        "(total_timeout; none = no total timeout)",
    )
    ready_timeout_s: float = Field(60.0, ge=0, description="wait this long for the target to answer at start")
    retry_max: int = Field(
        0,
        ge=0,
        le=10,
        description="retries of a request answered 429 or 5xx, or whose connection failed before any response "
        "byte (connect, stale keep-alive connection), with backoff (0 = never; retries are counted)",
    )
    retry_backoff_s: float = Field(0.5, ge=0, description="wait before the first retry, doubled each time")
    # -- TLS (https:// targets)
    ca_bundle: str | None = Field(
        None, description="PEM file of the CA certificates to trust for an https:// target (none = the system's)"
    )
    client_cert: str | None = Field(
        None,
        description="PEM client certificate for mutual TLS (its key in it, or in --client-key); none = no client certificate",
    )
    client_key: str | None = Field(
        None, description="PEM private key of --client-cert; none = in the --client-cert file"
    )
    tls_server_name: str | None = Field(
        None,
        description="name sent as SNI and checked against the certificate, when the target URL's host is "
        "an IP address or a tunnel (none = the URL's host)",
    )
    insecure: bool = Field(
        False, description="do not verify the target's TLS certificate (a warning at start and in the summary)"
    )
    # -- Several targets
    target_policy: str = Field(
        "session-order",
        description="with several --target: session-order (sessions "
        "numbered by first appearance in the trace, round robin) or session-hash (a "
        "hash of the session id); rows without a session go by row number",
    )
    session_header: str | None = Field(
        None,
        description="send each request's session id in this header, for "
        "routers: a header name, or a preset: dynamo (X-Dynamo-Session-ID), "
        "aibrix (x-aibrix-session-key with routing-strategy: session-affinity); unset = no header",
    )

    @field_validator("engine")
    @classmethod
    def _engine(cls, v: str | None) -> str | None:
        from replayer.core.engines import engine_caps

        if v is not None:
            engine_caps(v)  # (ValueError naming the engines)
        return v

    @field_validator("target", mode="before")
    @classmethod
    def _target(cls, v: object) -> list[str] | None:
        """The servers' base URLs (one string is one target); one given with the API's ``/v1`` (as
        OpenAI clients take it) is the same server: the ``/v1`` is dropped, since every path sent
        starts with it. A URL given twice is refused (it would take two shares of the sessions)."""
        if v is None:
            return None
        urls = [v] if isinstance(v, str) else v
        if not isinstance(urls, list | tuple) or not urls:
            raise ValueError("must be a URL or a list of URLs")
        out = []
        for u in urls:
            if not isinstance(u, str) or not u.startswith(("http://", "https://")):
                raise ValueError(f"{u!r} must be an http:// or https:// URL, e.g. http://127.0.0.1:8000")
            if problem := url_port_problem(u):
                raise ValueError(problem)
            u = u.rstrip("/").removesuffix("/v1").rstrip("/")
            if u in out:
                raise ValueError(f"target {u} is given twice")
            out.append(u)
        return out

    @field_validator("target_policy")
    @classmethod
    def _target_policy(cls, v: str) -> str:
        from replayer.send.routing import POLICIES

        if v not in POLICIES:
            raise ValueError(f"must be one of {', '.join(POLICIES)}")
        return v

    @property
    def targets(self) -> list[str]:
        """The ``--target`` URLs ([] = the embedded simulator)."""
        return list(self.target or ())

    @property
    def tls(self) -> TLSOptions:
        """The TLS settings towards the targets (``replayer.http.tls``)."""
        return TLSOptions(self.ca_bundle, self.client_cert, self.client_key, self.tls_server_name, self.insecure)

    def api_key(self) -> str | None:
        """The API key from ``api_key_file`` or the ``api_key_env`` variable (never logged)."""
        if self.api_key_file:
            with open(self.api_key_file, encoding="utf-8") as f:
                return f.read().strip() or None
        return os.environ.get(self.api_key_env) or None
