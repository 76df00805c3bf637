"""The headings ``replayer run --help`` and the CLI reference put the settings under.

Every ``RunConfig`` field belongs to exactly one group (a test holds it). ``SHORT`` names the
settings a first-time user needs; ``--help`` shows only those, ``--help-all`` and the reference
page (``docs/reference/cli.md``) show every one.
"""

from __future__ import annotations

GROUPS: dict[str, tuple[str, ...]] = {
    "Trace": (
        "trace",
        "format",
        "map",
        "time_unit",
        "validate_trace",
        "strict",
        "mix",
        "hash_id_scope",
        "max_trace_length",
    ),
    "Synthetic load (no trace)": (
        "request_rate",
        "burstiness",
        "num_prompts",
        "input_len",
        "output_len",
        "prefix_len",
        "range_ratio",
    ),
    "Target": (
        "target",
        "model",
        "engine",
        "endpoint",
        "api_key_env",
        "api_key_file",
        "vllm_extensions",
        "run_id",
        "server_timings",
        "warm_connections",
        "connect_timeout_s",
        "read_timeout_s",
        "request_timeout_s",
        "ready_timeout_s",
        "retry_max",
        "retry_backoff_s",
    ),
    "TLS (https:// targets)": ("ca_bundle", "client_cert", "client_key", "tls_server_name", "insecure"),
    "Several targets": ("target_policy", "session_header"),
    "Schedule": (
        "speedup",
        "max_concurrency",
        "max_requests",
        "duration_s",
        "loop",
        "loop_gap_s",
        "loop_salt",
        "idle_gap_cap_s",
        "session_policy",
        "start_at",
        "start_delay_s",
        "drain_timeout_s",
        "shard",
        "workers",
        "coordinator",
        "rejoin_max_late_s",
        "lead_s",
        "launcher",
        "delayed_ack",
    ),
    "Prompts": (
        "seed",
        "tokenizer",
        "prompt_mode",
        "block_size",
        "vocab_range",
        "image_size",
        "image_format",
        "image_token_rule",
        "image_cache_mb",
        "kv_block_size",
        "expected_cache_tokens",
        "usage_slack_tokens",
    ),
    "Verdict": (
        "goodput",
        "max_error_ratio",
        "warmup_requests",
        "warmup_seconds_s",
        # issue 45
        "fidelity_max_lag_ms",
        "fail_unfaithful",
        "drift_window_s",
        "drift_min_change_pct",
        "sim_ttft_drift_ms_per_min",
        "sim_itl_drift_ms_per_min",
    ),
    "Results": ("results", "resume", "resume_existing", "flush_rows", "flush_interval_s", "itl_format"),
    "Soak": (
        "roll_interval_s",
        "roll_rows",
        "retain_size",
        "retain_age_s",
        "control_token_env",
        "control_token_file",
    ),
    "Tracing (OpenTelemetry)": ("otlp_endpoint", "trace_sample_ratio", "trace_state"),
    "Observability": (
        "admin_host",
        "admin_port",
        "scrape_target_metrics",
        "scrape_interval_s",
        "metrics_linger_s",
        "metrics_push",
        "metrics_window_s",
        "quiet",
        "log_format",
        "log_level",
        "stall_log_interval_s",
    ),
}

#: the settings ``--help`` shows (the rest: ``--help-all``)
SHORT: frozenset[str] = frozenset(
    {
        "trace",
        "format",
        "map",
        "request_rate",
        "num_prompts",
        "input_len",
        "output_len",
        "target",
        "model",
        "read_timeout_s",
        "endpoint",
        "speedup",
        "max_concurrency",
        "max_requests",
        "duration_s",
        "loop",
        "workers",
        "tokenizer",
        "prompt_mode",
        "goodput",
        "max_error_ratio",
        "results",
        "resume",
        "roll_interval_s",
        "retain_size",
        "admin_port",
        "quiet",
    }
)


def group_of(name: str) -> str:
    """The heading setting ``name`` is listed under (KeyError for a setting in no group)."""
    for heading, names in GROUPS.items():
        if name in names:
            return heading
    raise KeyError(name)
