"""How a run is watched: OpenTelemetry spans, the admin/metrics server, scraping the target,
Prometheus, logs (``RunConfig``'s "Tracing" and "Observability" settings).

``RunConfig`` (``replayer.config.model``) inherits ``ObservabilitySettings`` with the other groups' settings;
the checks that relate settings of several groups stay there. Fields are in the order of
``replayer.config.groups.GROUPS`` under each heading.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, Field, field_validator

__all__ = ["ObservabilitySettings"]


class ObservabilitySettings(BaseModel):
    """The "Tracing (OpenTelemetry)", "Observability" settings of ``RunConfig``."""

    # -- Tracing (OpenTelemetry)
    otlp_endpoint: str | None = Field(
        None,
        description="OpenTelemetry: export a CLIENT span per request (and a run span) over OTLP/HTTP to "
        "this collector URL (/v1/traces is added unless given) and send every request a W3C traceparent; "
        "none = the OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT variable, else off",
    )
    trace_sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="OpenTelemetry head sampling: the fraction of requests traced, chosen by request "
        "with --seed (the traceparent's sampled flag tells the server)",
    )
    trace_state: str | None = Field(
        None,
        description="OpenTelemetry: a W3C tracestate value sent with every request's traceparent; none = no tracestate",
    )
    # -- Observability
    admin_host: str = Field("127.0.0.1", description="admin/metrics server address")
    admin_port: int = Field(9400, ge=0, le=65535, description="admin/metrics port (0 = a free port)")
    scrape_target_metrics: bool = Field(
        True,
        description="scrape the target's /metrics during the run "
        "(saved to target_metrics.parquet, deltas in the summary)",
    )
    scrape_interval_s: float = Field(5.0, gt=0, description="target /metrics scrape interval")
    # issue 46: the end of a run seen by Prometheus, the live window's length
    metrics_linger_s: float | None = Field(
        None,
        ge=0,
        description="after the run, keep /metrics served up to this long for a last scrape (ends "
        "early once every scraper seen has scraped again; Ctrl-C ends it); none = 30 s (two 15 s "
        "scrape intervals) when a Prometheus scraped /metrics during the run, else 0",
    )
    metrics_push: str | None = Field(
        None,
        description="after the run, push the metrics once to this Pushgateway URL (grouped by "
        "job=replayer, run_id, instance); none = no push",
    )
    metrics_window_s: float = Field(
        60.0,
        gt=0,
        description="the sliding window of replayer_live_latency_seconds (exact quantiles of the "
        "last this-many seconds)",
    )
    quiet: bool = Field(
        False,
        description="only what needs attention: no live view, progress or INFO lines (warnings, the stall "
        "line too, and the summary show)",
    )
    log_format: str = Field("text", description="log lines as text or json (one object per line)")
    log_level: str = Field(
        "info", description="debug, info, warning or error (not given: warning with --quiet, else info)"
    )
    # -- issue 47 (a user's third day) --
    stall_log_interval_s: float = Field(
        30.0,
        ge=0,
        description="while requests are in flight and none ends, log a line this often naming the oldest "
        "one's age (--quiet too); 0 = never",
    )

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp_endpoint(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"{v!r} must be an http:// or https:// URL (OTLP/HTTP), e.g. http://127.0.0.1:4318")
        return v

    @field_validator("trace_state")
    @classmethod
    def _trace_state(cls, v: str | None) -> str | None:
        if v is not None and (not v.isascii() or not v.isprintable() or len(v) > 512):
            raise ValueError("must be printable ASCII of at most 512 characters (W3C tracestate), e.g. vendor=value")
        return v

    def otlp_traces_url(self) -> str | None:
        """Where spans go (None: tracing off): ``--otlp-endpoint`` or, as OpenTelemetry SDKs read
        them, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (the URL as given) or
        ``OTEL_EXPORTER_OTLP_ENDPOINT`` (a base URL: ``/v1/traces`` added)."""
        if self.otlp_endpoint:
            base = self.otlp_endpoint.rstrip("/")
            return base if base.endswith("/v1/traces") else base + "/v1/traces"
        traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        if traces:
            return traces
        env_base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        return env_base.rstrip("/") + "/v1/traces" if env_base else None

    @property
    def log_threshold(self) -> str:
        """The level the log is written at (issue 47): ``--log-level``, or ``warning`` under
        ``--quiet`` when no level was given (a quiet run writes only what needs attention)."""
        return "warning" if self.quiet and "log_level" not in self.model_fields_set else self.log_level
