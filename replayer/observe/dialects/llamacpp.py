"""llama.cpp server's ``/metrics`` names (``llama-server --metrics``).

Source: ggml-org/llama.cpp ``tools/server/README.md`` (commit
25d5b0c53f9a146f3d7a99a18610d9d623b5041e), "GET /metrics", Available metrics:
``llamacpp:prompt_tokens_total`` and ``llamacpp:tokens_predicted_total`` (counters),
``llamacpp:requests_processing`` (running), ``llamacpp:requests_deferred`` (waiting),
``llamacpp:kv_cache_usage_ratio`` (a fraction; builds since late 2025 no longer export it,
then it is unknown), and the throughput gauges ``prompt_tokens_seconds`` /
``predicted_tokens_seconds`` (rates, not read).

Unknown for llama.cpp: request successes, prefix-cache queries and hits, preemptions, the
TTFT / ITL / E2E histograms, speculative decoding.
"""

from replayer.observe.dialects.base import Dialect

DIALECT = Dialect(
    name="llamacpp",
    source="ggml-org/llama.cpp tools/server/README.md@25d5b0c5",
    counters={
        "prompt_tokens": ("llamacpp:prompt_tokens_total",),
        "generation_tokens": ("llamacpp:tokens_predicted_total",),
    },
    gauges={
        "num_requests_running": ("llamacpp:requests_processing",),
        "num_requests_waiting": ("llamacpp:requests_deferred",),
        "kv_cache_usage_perc": ("llamacpp:kv_cache_usage_ratio",),
    },
)
