"""Text Generation Inference's ``/metrics`` names (the router's, rendered by metrics-rs: its
counters carry no ``_total``).

Source: huggingface/text-generation-inference ``docs/source/reference/metrics.md`` (commit
53fdbe617d4f3cc358842ad96914393ad6b6e4ca), the table of what ``router/src`` records:
``tgi_request_success`` (counter), the per-request histograms ``tgi_request_input_length`` and
``tgi_request_generated_tokens`` (their ``_sum`` is the prompt / generated tokens),
``tgi_request_duration`` (E2E), ``tgi_request_queue_duration``,
``tgi_request_mean_time_per_token_duration`` (each request's mean inter-token time: its
``_sum / _count`` is a mean of per-request means, so the ITL is estimated),
``tgi_request_skipped_tokens`` (speculated tokens accepted per request), and the gauges
``tgi_batch_current_size`` (requests running) and ``tgi_queue_size`` (waiting).

Unknown for TGI: TTFT, prefix-cache queries and hits, KV usage, preemptions, drafts.
"""

from replayer.observe.dialects.base import Dialect

DIALECT = Dialect(
    name="tgi",
    source="huggingface/text-generation-inference docs/source/reference/metrics.md@53fdbe61",
    counters={
        "prompt_tokens": ("tgi_request_input_length_sum",),
        "generation_tokens": ("tgi_request_generated_tokens_sum",),
        "request_success": ("tgi_request_success", "tgi_request_success_total"),
        "spec_decode_num_accepted_tokens": ("tgi_request_skipped_tokens_sum",),
        "server_itl_seconds_sum": ("tgi_request_mean_time_per_token_duration_sum",),
        "server_itl_seconds_count": ("tgi_request_mean_time_per_token_duration_count",),
        "server_e2e_seconds_sum": ("tgi_request_duration_sum",),
        "server_e2e_seconds_count": ("tgi_request_duration_count",),
        "server_queue_seconds_sum": ("tgi_request_queue_duration_sum",),
        "server_queue_seconds_count": ("tgi_request_queue_duration_count",),
    },
    gauges={
        "num_requests_running": ("tgi_batch_current_size",),
        "num_requests_waiting": ("tgi_queue_size",),
    },
)
