"""vLLM's ``/metrics`` names.

Source: vllm-project/vllm ``vllm/v1/metrics/loggers.py`` (commit a6f0308cfe806b7731ad4979c9bea6e470c35efd):
``vllm:prompt_tokens``/``generation_tokens``/``request_success`` counters,
``vllm:prefix_cache_queries``/``hits`` (tokens), ``vllm:kv_cache_usage_perc`` (a fraction),
``vllm:num_requests_running``/``waiting``, ``vllm:num_preemptions``, the ``vllm:spec_decode_*``
counters and the TTFT / inter-token / E2E / queue histograms. The V0 names
``vllm:gpu_prefix_cache_*``, ``vllm:gpu_cache_usage_perc`` and ``vllm:time_per_output_token_seconds``
are read when the V1 ones are absent (never both summed).
"""

from replayer.observe.dialects.base import Dialect

DIALECT = Dialect(
    name="vllm",
    source="vllm-project/vllm vllm/v1/metrics/loggers.py@a6f0308c",
    counters={
        "prompt_tokens": ("vllm:prompt_tokens_total",),
        "generation_tokens": ("vllm:generation_tokens_total",),
        "request_success": ("vllm:request_success_total",),
        "num_preemptions": ("vllm:num_preemptions_total",),
        "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        "mm_cache_queries": ("vllm:mm_cache_queries_total",),
        "mm_cache_hits": ("vllm:mm_cache_hits_total",),
        "spec_decode_num_drafts": ("vllm:spec_decode_num_drafts_total",),
        "spec_decode_num_draft_tokens": ("vllm:spec_decode_num_draft_tokens_total",),
        "spec_decode_num_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",),
        "spec_decode_num_accepted_tokens_per_pos": ("vllm:spec_decode_num_accepted_tokens_per_pos_total",),
        "server_ttft_seconds_sum": ("vllm:time_to_first_token_seconds_sum",),
        "server_ttft_seconds_count": ("vllm:time_to_first_token_seconds_count",),
        "server_itl_seconds_sum": ("vllm:inter_token_latency_seconds_sum", "vllm:time_per_output_token_seconds_sum"),
        "server_itl_seconds_count": (
            "vllm:inter_token_latency_seconds_count",
            "vllm:time_per_output_token_seconds_count",
        ),
        "server_e2e_seconds_sum": ("vllm:e2e_request_latency_seconds_sum",),
        "server_e2e_seconds_count": ("vllm:e2e_request_latency_seconds_count",),
        "server_queue_seconds_sum": ("vllm:request_queue_time_seconds_sum",),
        "server_queue_seconds_count": ("vllm:request_queue_time_seconds_count",),
    },
    gauges={
        "num_requests_running": ("vllm:num_requests_running",),
        "num_requests_waiting": ("vllm:num_requests_waiting",),
        "kv_cache_usage_perc": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "process_resident_memory_bytes": ("process_resident_memory_bytes",),
    },
)
