"""SGLang's ``/metrics`` names (``--enable-metrics``).

Source: sgl-project/sglang ``python/sglang/srt/metrics/collector.py`` (commit
00ae9c1590d2d0bb6c0bfff39e312c34ae3dd538): the tokenizer manager's counters
``sglang:prompt_tokens_total``, ``generation_tokens_total``, ``cached_tokens_total`` (prompt
tokens served from the radix cache), ``num_requests_total``; the histograms
``sglang:time_to_first_token_seconds``, ``inter_token_latency_seconds``,
``e2e_request_latency_seconds`` and the scheduler's ``queue_time_seconds``; the scheduler's
gauges ``sglang:num_running_reqs``, ``num_queue_reqs``, ``token_usage`` (KV pool in use, a
fraction), ``cache_hit_rate`` (a rate: read as a gauge, never summed), ``spec_accept_length`` and
``spec_accept_rate``; the counter ``sglang:num_retracted_requests_total`` (a retraction frees a
running request's KV and queues it again: vLLM's preemption).

SGLang counts no prefix-cache *queries*: every prompt token is matched against the radix tree,
so the queries are the prompt tokens (an alias; the docs call it estimated).
"""

from replayer.observe.dialects.base import Dialect

DIALECT = Dialect(
    name="sglang",
    source="sgl-project/sglang python/sglang/srt/metrics/collector.py@00ae9c15",
    counters={
        "prompt_tokens": ("sglang:prompt_tokens_total",),
        "generation_tokens": ("sglang:generation_tokens_total",),
        "request_success": ("sglang:num_requests_total",),
        "num_preemptions": ("sglang:num_retracted_requests_total",),
        "prefix_cache_hits": ("sglang:cached_tokens_total",),
        "server_ttft_seconds_sum": ("sglang:time_to_first_token_seconds_sum",),
        "server_ttft_seconds_count": ("sglang:time_to_first_token_seconds_count",),
        "server_itl_seconds_sum": (
            "sglang:inter_token_latency_seconds_sum",
            "sglang:time_per_output_token_seconds_sum",
        ),
        "server_itl_seconds_count": (
            "sglang:inter_token_latency_seconds_count",
            "sglang:time_per_output_token_seconds_count",
        ),
        "server_e2e_seconds_sum": ("sglang:e2e_request_latency_seconds_sum",),
        "server_e2e_seconds_count": ("sglang:e2e_request_latency_seconds_count",),
        "server_queue_seconds_sum": ("sglang:queue_time_seconds_sum",),
        "server_queue_seconds_count": ("sglang:queue_time_seconds_count",),
    },
    gauges={
        "num_requests_running": ("sglang:num_running_reqs",),
        "num_requests_waiting": ("sglang:num_queue_reqs",),
        "kv_cache_usage_perc": ("sglang:token_usage",),
        "server_prefix_cache_hit_rate": ("sglang:cache_hit_rate",),
        "server_spec_decode_acceptance_length": ("sglang:spec_accept_length",),
        "server_spec_decode_acceptance_rate": ("sglang:spec_accept_rate",),
    },
    aliases={"prefix_cache_queries": "prompt_tokens"},
)
