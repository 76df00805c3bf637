"""NVIDIA Dynamo's frontend ``/metrics`` names (``python -m dynamo.frontend``).

Source: ai-dynamo/dynamo ``lib/runtime/src/metrics/prometheus_names.rs`` (commit
04070c75b52f33346a2d5723eed93a0093e77bad), ``frontend_service`` under the prefix
``dynamo_frontend_``: ``requests_total`` (label ``status``: ``success``/``error``),
``inflight_requests`` (running) and ``queued_requests`` (waiting before the first response),
the histograms ``input_sequence_tokens`` and ``output_sequence_tokens`` (their ``_sum``: prompt
and generated tokens; ``output_tokens_total`` is preferred for the latter),
``cached_tokens`` (prefix-cache hits per request: its ``_sum`` is the hit tokens),
``time_to_first_token_seconds``, ``inter_token_latency_seconds``, ``request_duration_seconds``,
and the per-worker gauges ``worker_active_decode_blocks`` and ``model_total_kv_blocks``.

KV usage is estimated as active decode blocks / total KV blocks (the frontend's view of its
workers); prefix-cache queries are the prompt tokens (an alias). Preemptions, queue time and
speculative decoding are unknown at the frontend.
"""

from replayer.observe.dialects.base import Dialect

DIALECT = Dialect(
    name="dynamo",
    source="ai-dynamo/dynamo lib/runtime/src/metrics/prometheus_names.rs@04070c75",
    counters={
        "prompt_tokens": ("dynamo_frontend_input_sequence_tokens_sum",),
        "generation_tokens": ("dynamo_frontend_output_tokens_total", "dynamo_frontend_output_sequence_tokens_sum"),
        "request_success": ('dynamo_frontend_requests_total{status="success"}',),
        "prefix_cache_hits": ("dynamo_frontend_cached_tokens_sum",),
        "server_ttft_seconds_sum": ("dynamo_frontend_time_to_first_token_seconds_sum",),
        "server_ttft_seconds_count": ("dynamo_frontend_time_to_first_token_seconds_count",),
        "server_itl_seconds_sum": ("dynamo_frontend_inter_token_latency_seconds_sum",),
        "server_itl_seconds_count": ("dynamo_frontend_inter_token_latency_seconds_count",),
        "server_e2e_seconds_sum": ("dynamo_frontend_request_duration_seconds_sum",),
        "server_e2e_seconds_count": ("dynamo_frontend_request_duration_seconds_count",),
    },
    gauges={
        "num_requests_running": ("dynamo_frontend_inflight_requests",),
        "num_requests_waiting": ("dynamo_frontend_queued_requests",),
    },
    parts={
        "kv_active_blocks": ("dynamo_frontend_worker_active_decode_blocks",),
        "kv_total_blocks": ("dynamo_frontend_model_total_kv_blocks",),
    },
    aliases={"prefix_cache_queries": "prompt_tokens"},
    ratios={"kv_cache_usage_perc": ("kv_active_blocks", "kv_total_blocks")},
)
