"""TensorRT-LLM's ``trtllm-serve`` Prometheus names (served at ``/prometheus/metrics``; its
``/metrics`` is a JSON list of iteration statistics).

Source: NVIDIA/TensorRT-LLM ``tensorrt_llm/metrics/collector.py`` (commit
050f80def8df236e326949c8bd9dee10fd896a83), ``MetricsCollector``: ``trtllm_request_success_total``,
``trtllm_prompt_tokens_total``, ``trtllm_generation_tokens_total``,
``trtllm_prompt_cached_tokens_total`` (prompt tokens reused from the KV cache),
``trtllm_kv_cache_hit_rate`` (a rate gauge) and ``trtllm_kv_cache_utilization`` (a fraction),
``trtllm_num_requests_running``/``waiting``, ``trtllm_spec_decode_num_draft_tokens_total``/
``num_accepted_tokens_total``, ``trtllm_spec_decode_acceptance_length``, and the histograms
``trtllm_time_to_first_token_seconds``, ``time_per_output_token_seconds``,
``e2e_request_latency_seconds``, ``request_queue_time_seconds``.

Prefix-cache queries are the prompt tokens (an alias, estimated); preemptions are unknown.
"""

from replayer.observe.dialects.base import Dialect

DIALECT = Dialect(
    name="trtllm",
    source="NVIDIA/TensorRT-LLM tensorrt_llm/metrics/collector.py@050f80de",
    counters={
        "prompt_tokens": ("trtllm_prompt_tokens_total",),
        "generation_tokens": ("trtllm_generation_tokens_total",),
        "request_success": ("trtllm_request_success_total",),
        "prefix_cache_hits": ("trtllm_prompt_cached_tokens_total", "trtllm_prompt_cache_hit_tokens_total"),
        "spec_decode_num_draft_tokens": ("trtllm_spec_decode_num_draft_tokens_total",),
        "spec_decode_num_accepted_tokens": ("trtllm_spec_decode_num_accepted_tokens_total",),
        "server_ttft_seconds_sum": ("trtllm_time_to_first_token_seconds_sum",),
        "server_ttft_seconds_count": ("trtllm_time_to_first_token_seconds_count",),
        "server_itl_seconds_sum": ("trtllm_time_per_output_token_seconds_sum",),
        "server_itl_seconds_count": ("trtllm_time_per_output_token_seconds_count",),
        "server_e2e_seconds_sum": ("trtllm_e2e_request_latency_seconds_sum",),
        "server_e2e_seconds_count": ("trtllm_e2e_request_latency_seconds_count",),
        "server_queue_seconds_sum": ("trtllm_request_queue_time_seconds_sum",),
        "server_queue_seconds_count": ("trtllm_request_queue_time_seconds_count",),
    },
    gauges={
        "num_requests_running": ("trtllm_num_requests_running",),
        "num_requests_waiting": ("trtllm_num_requests_waiting",),
        "kv_cache_usage_perc": ("trtllm_kv_cache_utilization",),
        "server_prefix_cache_hit_rate": ("trtllm_kv_cache_hit_rate",),
        "server_spec_decode_acceptance_length": ("trtllm_spec_decode_acceptance_length",),
    },
    aliases={"prefix_cache_queries": "prompt_tokens"},
)
