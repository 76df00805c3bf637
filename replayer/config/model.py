"""The run configuration: typed, frozen, validated before anything starts.

``RunConfig`` is the single source of settings and their defaults; the CLI only fills it.
``load_config`` reports every problem at once, each naming the field and the bound (pydantic
validation).
"""

from __future__ import annotations

import math
import os
from collections.abc import Set as AbstractSet

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from replayer.config.checks import FieldChecks
from replayer.config.load import (
    RUN_ID,
    SAME_ON_RESUME,
    SYNTHETIC_LOAD,
    SYNTHETIC_ONLY,
    ConfigError,
    flag_name,
    new_run_id,
    recorded_settings,
)
from replayer.http.tls import TLSOptions

__all__ = [
    "RUN_ID",
    "SAME_ON_RESUME",
    "SYNTHETIC_LOAD",
    "SYNTHETIC_ONLY",
    "ConfigError",
    "RunConfig",
    "flag_name",
    "load_config",
    "new_run_id",
    "recorded_settings",
]


#: the names of a synthetic load's spec fields in a run (``SynthSpec.check``'s messages)
_SYNTH_NAMES = {
    "rows": "num_prompts (--num-prompts)",
    "rate_per_s": "request_rate (--request-rate)",
    "input_dist": "input_len (--input-len, --range-ratio)",
    "output_dist": "output_len (--output-len, --range-ratio)",
    "system_prompt_tokens": "prefix_len (--prefix-len)",
    "block_size": "block_size (--block-size)",
}


class RunConfig(FieldChecks):
    """Settings of ``replayer run``; every field has the CLI flag ``--field-name``."""

    # (an infinite --request-rate or --burstiness is written as "Infinity" in the results' config, not null)
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")

    trace: str | None = Field(
        None,
        description="trace: canonical Parquet (file, folder or glob), Mooncake JSONL, "
        "Azure CSV, or generic JSONL/CSV with --map; none = a synthetic load (--request-rate)",
    )
    request_rate: float | None = Field(
        None,
        gt=0,
        description="a synthetic load instead of a trace (vllm bench serve's flag): requests per "
        "second, inf = all at once; its rows: --num-prompts, --input-len, --output-len, "
        "--prefix-len, --range-ratio, arrivals by --burstiness, seeded by --seed; none = replay TRACE",
    )
    burstiness: float = Field(
        1.0,
        gt=0,
        description="synthetic load: the gamma shape of the gaps between requests (vLLM's): 1 = "
        "Poisson, < 1 burstier, > 1 more regular (coefficient of variation 1/sqrt(B)), inf = "
        "exactly 1/--request-rate apart",
    )
    num_prompts: int = Field(1000, ge=1, description="synthetic load: requests in one pass")
    input_len: int = Field(
        1024, ge=1, description="synthetic load: prompt tokens of each request after the shared prefix"
    )
    output_len: int = Field(128, ge=1, description="synthetic load: output tokens of each request")
    prefix_len: int = Field(
        0,
        ge=0,
        description="synthetic load: leading prompt tokens shared by every request (vLLM's "
        "--random-prefix-len; hash ids, so a prefix cache sees them): its whole blocks (--block-size, "
        "default --kv-block-size) are shared, the tokens a server with that block size can hit",
    )
    range_ratio: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="synthetic load: each length drawn uniformly from [L*(1-r), L*(1+r)] "
        "(vLLM's --random-range-ratio; 0 = exactly --input-len and --output-len)",
    )
    format: str = Field(
        "auto",
        description="trace format: auto, parquet, mooncake, azure, jsonl, csv, weka, copilot, tracelab, servegen",
    )
    map: str | None = Field(
        None,
        description="column mapping for generic traces, e.g. timestamp=ts,input_length=n_in; unset = the canonical names",
    )
    time_unit: str | None = Field(
        None,
        description="timestamp unit of generic traces: s, ms, us, ns or datetime; unset = ms (Azure CSV: datetime)",
    )
    validate_trace: str = Field(
        "full",
        description="full: check every row before sending; lazy: check each "
        "batch as it is read (fast start on huge traces)",
    )
    mix: list[str] | None = Field(
        None,
        description="replay several traces on one clock, one tenant each: "
        "PATH[,tenant=NAME][,offset_s=S][,rate=R][,hash_id_scope=local|global] per "
        "trace (`replayer run A B` = a mix of A and B); tenant is a results column and "
        "a metric label; unset = one trace",
    )
    hash_id_scope: str | None = Field(
        None,
        description="local: the traces' hash ids mean something only inside "
        "their trace (salted per trace in a mix); global: ids are shared; none = "
        "what each trace declares (global when it declares nothing)",
    )
    idle_gap_cap_s: float | None = Field(
        None,
        gt=0,
        description="a gap between consecutive requests longer than "
        "this in replay time (after --speedup) shrinks to it; the summary "
        "reports gaps capped and time skipped; unset = no cap",
    )
    session_header: str | None = Field(
        None,
        description="send each request's session id in this header, for "
        "routers: a header name, or a preset: dynamo (X-Dynamo-Session-ID), "
        "aibrix (x-aibrix-session-key with routing-strategy: session-affinity); unset = no header",
    )
    target: list[str] | None = Field(
        None,
        description="base URL of the server (a trailing /v1 is dropped); "
        "repeat it for several targets (a session keeps the target of its first "
        "turn: --target-policy); none = start the embedded simulator",
    )
    target_policy: str = Field(
        "session-order",
        description="with several --target: session-order (sessions "
        "numbered by first appearance in the trace, round robin) or session-hash (a "
        "hash of the session id); rows without a session go by row number",
    )
    model: str | None = Field(None, description="request 'model' field; none = the first of GET /v1/models")
    endpoint: str = Field(
        "/v1/completions", description="API path requests are sent to (a trace's endpoint column overrides it per row)"
    )
    session_policy: str = Field(
        "wait",
        description="multi-turn sessions: wait (a turn goes at its trace "
        "time or at its predecessor's end plus think time, whichever is later), "
        "wait-no-think (ignore think time) or off (trace times only)",
    )
    goodput: list[str] | None = Field(
        None,
        description="SLO bounds in ms, keys ttft, tpot, e2el (vllm bench serve's --goodput), e.g. "
        "--goodput ttft:2000 tpot:50 (a mapping in a config file): a request meets it when it succeeded "
        "within every bound (request_goodput, slo_attainment); unset = no SLO",
    )
    usage_slack_tokens: int = Field(
        0,
        ge=0,
        description="pooling usage audit: tokens per input the server "
        "may add (special tokens) before a response is flagged as inflated",
    )
    speedup: float = Field(1.0, gt=0, description="replay this many times faster than the trace")
    max_requests: int | None = Field(
        None,
        ge=1,
        description="replay only the schedule's first N requests (shards and resumed runs together); unset = all",
    )
    max_concurrency: int | None = Field(
        None,
        ge=1,
        description="cap on requests in flight (vllm bench serve's): a due request waits for a slot, "
        "its wait in queue_wait_ms and in the latencies from due; unset = open loop",
    )
    warmup_requests: int = Field(
        0,
        ge=0,
        description="warm-up: the first N requests sent (per process) go on schedule, flagged warmup in the "
        "results and left out of the summary's statistics, throughputs and the verdict; 0 = none",
    )
    warmup_seconds_s: float = Field(
        0.0,
        ge=0,
        description="warm-up: requests sent (by their own send time) in the first S seconds of the run are "
        "warm-up (as --warmup-requests; with both, either makes a request warm-up); 0 = none",
    )
    loop: str = Field("1", description="passes over the trace: a number, or 'forever'")
    loop_gap_s: float = Field(0.0, ge=0, description="trace time between the end of one loop and the next")
    loop_salt: bool = Field(
        False,
        description="fresh prefixes in every loop (salted prompt seed) "
        "instead of the same prefixes (warm server cache)",
    )
    shard: str = Field("0/1", description="I/N: send only shard I of N (0-based; sessions stay whole)")
    workers: int = Field(1, ge=1, le=64, description="processes on this host, one shard each (merged summary)")
    start_at: float | None = Field(
        None,
        description="anchor the schedule at this Unix time (aligns shards; "
        "one more than 1 s past is not kept: the run starts now, out of step); unset = now",
    )
    coordinator: str | None = Field(
        None,
        description="URL of `replayer coordinate`: wait until every shard is ready, start together on "
        "the coordinator's clock (this host's offset measured), report live; a restarted shard rejoins "
        "in step (needs --shard I/N); unset = start on its own (--start-at or now)",
    )
    rejoin_max_late_s: float = Field(
        1.0,
        ge=0,
        description="a shard (re)joining its fleet after the start sends rows at most this late; "
        "rows due earlier are recorded missed_while_down, not sent",
    )
    duration_s: float | None = Field(
        None, gt=0, description="stop scheduling after this many seconds of replay; unset = all"
    )
    results: str | None = Field(None, description="results folder; none = ./results/<timestamp>")
    admin_host: str = Field("127.0.0.1", description="admin/metrics server address")
    admin_port: int = Field(9400, ge=0, le=65535, description="admin/metrics port (0 = a free port)")
    seed: int = Field(0, ge=0, lt=2**64, description="prompt seed: same seed, same prompts")
    block_size: int | None = Field(
        None,
        ge=1,
        description="tokens per hash id; none = from the trace (512), for a synthetic load --kv-block-size",
    )
    vocab_range: str = Field("1000:30000", description="token ids LO:HI (HI exclusive) used for prompts")
    tokenizer: str | None = Field(
        None,
        description="local tokenizer.json or folder (never downloaded), or builtin:gpt2 (shipped: "
        "GPT-2's BPE, MIT): use its non-special ids; unset = ids from --vocab-range",
    )
    prompt_mode: str = Field(
        "tokens",
        description="tokens: prompt as token ids (exact); text: blocks "
        "decoded with --tokenizer (the server re-tokenizes; drift is reported)",
    )
    image_size: str = Field("512x512", description="multimodal traces: WxH of every image whose row has no image_sizes")
    image_format: str = Field("png", description="synthetic images as png (lossless) or jpeg")
    image_token_rule: str = Field(
        "qwen2-vl",
        description="expected image tokens per image when the trace has "
        "no image_tokens: qwen2-vl (28-pixel patches merged 2x2, its min/max pixels), "
        "llava (576), fixed:N, or none; a server count that differs is counted "
        "(image_token_mismatches)",
    )
    image_cache_mb: int = Field(256, ge=1, description="memory bound of the cache of built images (base64 parts)")
    vllm_extensions: bool = Field(
        True, description="send the engine's exact-length fields (ignore_eos, min_tokens: docs/engines.md)"
    )
    # issue 49: the target's engine (its /metrics names, request fields, what it refuses)
    engine: str | None = Field(
        None,
        description="the target's engine: vllm, sglang, tgi, trtllm, dynamo or llamacpp (its /metrics "
        "names and request fields, docs/engines.md); unset = detected at start",
    )

    @field_validator("engine")
    @classmethod
    def _engine(cls, v: str | None) -> str | None:
        from replayer.core.engines import engine_caps

        if v is not None:
            engine_caps(v)  # (ValueError naming the engines)
        return v

    control_token_env: str = Field(
        "REPLAYER_CONTROL_TOKEN",
        description="environment variable holding the bearer token for the admin control endpoints (unset = open)",
    )
    control_token_file: str | None = Field(
        None, description="file holding the control token (overrides the variable); unset = the variable"
    )
    api_key_env: str = Field("REPLAYER_API_KEY", description="environment variable holding the API key")
    api_key_file: str | None = Field(
        None, description="file holding the API key (overrides the variable); unset = the variable"
    )
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
    warm_connections: int = Field(
        128,
        ge=0,
        le=4096,
        description="keep-alive connections opened before the first request, so the first burst pays no TCP "
        "(or TLS) handshakes",
    )
    retry_max: int = Field(
        0,
        ge=0,
        le=10,
        description="retries of a request answered 429 or 5xx, or whose connection failed before any response "
        "byte (connect, stale keep-alive connection), with backoff (0 = never; retries are counted)",
    )
    retry_backoff_s: float = Field(0.5, ge=0, description="wait before the first retry, doubled each time")
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
    drain_timeout_s: float = Field(30.0, ge=0, description="on stop, wait this long for in-flight requests")
    launcher: bool = Field(
        True,
        description="write each request from a launcher process at its due time "
        "(plain HTTP; the event loop keeps reading the streams)",
    )
    delayed_ack: bool = Field(
        False,
        description="let the kernel delay this client's TCP ACKs during a "
        "response stream (TCP_QUICKACK off; Linux, elsewhere a no-op with a warning): half the ACKs, ~3.5 us less CPU per "
        "SSE event; only for servers that set TCP_NODELAY (vLLM, SGLang, uvicorn and "
        "aiohttp servers do): with Nagle on, each token would wait up to 40 ms",
    )
    lead_s: float = Field(
        3.0,
        gt=0,
        le=60,
        description="build request bodies this far ahead of their due time (the first window before the run starts)",
    )
    start_delay_s: float = Field(0.1, ge=0, description="anchor the schedule this long after start-up")
    flush_rows: int = Field(2000, ge=1, description="write a results row group every N results")
    flush_interval_s: float = Field(2.0, gt=0, description="or every this many seconds")
    roll_rows: int | None = Field(
        None, ge=1, description="start a new results file every N results (soak); unset = no roll by count"
    )
    roll_interval_s: float | None = Field(
        None, gt=0, description="start a new results file this often (soak); unset = no roll by time"
    )
    retain_size: str | None = Field(
        None,
        description="retention: while the results folder holds more than "
        "this (e.g. 2GB, 500MB, 1.5GiB; K/M/G/T = 1000^n, Ki/Mi/Gi/Ti = 1024^n bytes), "
        "remove its oldest rolled results file (needs --roll-interval or --roll-rows; "
        "the counts and statistics of removed files stay in removed.json); unset = no size bound",
    )
    retain_age_s: float | None = Field(
        None,
        gt=0,
        description="retention: remove a rolled results file once its "
        "newest result is older than this (needs --roll-interval or --roll-rows); unset = no age bound",
    )
    itl_format: str = Field(
        "exact",
        description="per-request ITL in the results: exact (every gap) or sketch "
        "(compact, for long runs: each request's gaps rounded to buckets 0.5 percent wide, one "
        "value and one count per bucket; ITL statistics within 0.5 percent)",
    )
    resume: str | None = Field(
        None,
        description="continue the run recorded in this results folder "
        "(its trace and settings unless given again: then they must agree), "
        "skipping every row already recorded; unset = a new run",
    )
    resume_existing: bool = Field(
        False,
        description="with --results DIR: continue the run recorded "
        "there when DIR holds its checkpoint (as --resume DIR), else start a "
        "new one in DIR (for containers that restart)",
    )
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
    kv_block_size: int = Field(
        16,
        ge=1,
        description="the server's KV block in tokens, for the expected prefix-cache hits (vLLM GPU 16, vLLM CPU 128)",
    )
    expected_cache_tokens: int | None = Field(
        64_000_000,
        ge=1,
        description="LRU capacity in tokens of "
        "the expected prefix-cache model (bounds its memory on long "
        "runs; larger than any server's KV cache; none = infinite)",
    )
    max_error_ratio: float | None = Field(
        None,
        ge=0,
        le=1,
        description="exit 3 when more than this "
        "fraction of the requests that ended failed (failed / (completed "
        "+ failed)), e.g. 0.01 for CI; none = exit 3 if all failed",
    )
    # issue 45: the fidelity and drift verdicts (replayer.results.fidelity, replayer.results.drift)
    fidelity_max_lag_ms: float = Field(
        25.0,
        gt=0,
        description="fidelity verdict: a run whose dispatch lag p99 is above this many ms did not send the "
        "trace's arrivals (not faithful)",
    )
    fail_unfaithful: bool = Field(
        False,
        description="exit 6 when the fidelity verdict is not faithful (a run that fell behind, was capped by "
        "--max-concurrency or lost requests), for CI",
    )
    drift_window_s: float = Field(
        300.0,
        gt=0,
        description="drift verdict: seconds of trace position per window (each window's latency quantiles, "
        "rates and the target's signals; with --loop compared with the same window of the first loop)",
    )
    drift_min_change_pct: float = Field(
        10.0,
        ge=0,
        description="drift verdict: a metric drifts when its trend's interval excludes 0 and the change it "
        "implies over the run is at least this percent of its level",
    )
    sim_ttft_drift_ms_per_min: float = Field(
        0.0,
        ge=0,
        description="a test aid for the embedded simulator (no --target): its TTFT grows by this many ms per "
        "minute (replayer sim --ttft-drift-ms-per-min)",
    )
    sim_itl_drift_ms_per_min: float = Field(
        0.0,
        ge=0,
        description="a test aid for the embedded simulator (no --target): its token gaps grow by this many ms "
        "per minute (replayer sim --itl-drift-ms-per-min)",
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
    strict: bool = Field(False, description="treat out-of-order timestamps in the trace as an error")
    quiet: bool = Field(
        False,
        description="no live view or progress lines (the summary, the log and its stall line "
        "(--stall-log-interval) are still written)",
    )
    log_format: str = Field("text", description="log lines as text or json (one object per line)")
    log_level: str = Field("info", description="debug, info, warning or error")
    # -- issue 47 (a user's third day) --
    stall_log_interval_s: float = Field(
        30.0,
        ge=0,
        description="while requests are in flight and none ends, log a line this often naming the oldest "
        "one's age (--quiet too); 0 = never",
    )
    max_trace_length: int = Field(
        10_000_000,
        ge=1,
        description="refuse trace rows whose input_length or output_length is above this many tokens "
        "(beyond any served model), naming file, row and field",
    )

    @property
    def goodput_slos(self) -> dict[str, float]:
        """The ``--goodput`` bounds in ms ({} if none): ``replayer.core.slo.parse_goodput``."""
        from replayer.core.slo import parse_goodput

        return parse_goodput(self.goodput)

    @property
    def retain_bytes(self) -> int | None:
        """``retain_size`` in bytes (None: no size bound)."""
        from replayer.record.retention import parse_bytes

        return parse_bytes(self.retain_size) if self.retain_size is not None else None

    @field_validator("mix", mode="before")
    @classmethod
    def _mix(cls, v: list | None) -> list[str] | None:
        if v is None:
            return None
        from replayer.trace.mix import format_entry, parse_entry

        entries = [parse_entry(x) for x in v]
        for e in entries:
            if not os.path.exists(e.trace):
                raise ValueError(f"no such file or folder: {e.trace}")
        names = [e.tenant for e in entries]
        if len(set(names)) != len(names):
            raise ValueError(f"tenant names must differ (name them: PATH,tenant=NAME), got {', '.join(names)}")
        return [format_entry(e) for e in entries]

    @property
    def mix_entries(self) -> list:
        """The mix (``replayer.trace.mix.MixEntry`` per trace), or [] for one trace."""
        from replayer.trace.mix import parse_entry

        return [parse_entry(x) for x in self.mix or ()]

    @property
    def loops(self) -> int | None:
        """Number of passes over the trace (None = forever)."""
        return None if self.loop == "forever" else int(self.loop)

    @property
    def shard_index(self) -> tuple[int, int]:
        i, n = (int(x) for x in self.shard.split("/"))
        return i, n

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
            u = u.rstrip("/").removesuffix("/v1").rstrip("/")
            if u in out:
                raise ValueError(f"target {u} is given twice")
            out.append(u)
        return out

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

    @model_validator(mode="before")
    @classmethod
    def _trace_of_mix(cls, values: object) -> object:
        if isinstance(values, dict) and not values.get("trace") and values.get("mix"):
            first = values["mix"][0]
            path = first.get("trace") if isinstance(first, dict) else str(first).split(",")[0]
            values = {**values, "trace": path}
        return values

    @model_validator(mode="before")
    @classmethod
    def _resume_existing(cls, values: object) -> object:
        if (
            isinstance(values, dict)
            and values.get("resume_existing")
            and values.get("results")
            and not values.get("resume")
            and os.path.exists(os.path.join(values["results"], "checkpoint.json"))
        ):
            values = {**values, "resume": values["results"]}
        if isinstance(values, dict) and values.get("resume"):  # the run's own trace and settings,
            values = {
                **recorded_settings(values["resume"], workers=int(values.get("workers") or 1) > 1),
                **values,
            }  # unless given again (then the daemon checks they agree)
        return values

    @property
    def synthetic_block_size(self) -> int:
        """Tokens per hash id of a synthetic load: ``block_size``, else ``kv_block_size`` (the
        shared prefix is then whole server blocks)."""
        return self.block_size or self.kv_block_size

    def synthetic_spec(self):
        """The synthetic load's ``replayer.trace.synth.SynthSpec`` (None when a trace is replayed)."""
        if self.request_rate is None:
            return None
        from replayer.trace.synth import load_spec

        return load_spec(
            num_prompts=self.num_prompts,
            request_rate=self.request_rate,
            burstiness=self.burstiness,
            input_len=self.input_len,
            output_len=self.output_len,
            prefix_len=self.prefix_len,
            range_ratio=self.range_ratio,
            block_size=self.synthetic_block_size,
            seed=self.seed,
        )

    def synthetic_load(self) -> dict | None:
        """What summary.json records of a synthetic load (None for a trace): its settings (an
        infinite rate or burstiness as the string "inf"), the arrival process, the prefix tokens
        shared and the seed its rows come from."""
        spec = self.synthetic_spec()
        if spec is None:
            return None

        def num(x: float) -> float | str:
            return "inf" if x == float("inf") else x

        bs = self.synthetic_block_size
        return {
            "request_rate": num(spec.rate_per_s),
            "burstiness": num(self.burstiness),
            "arrival": spec.arrival,
            "num_prompts": self.num_prompts,
            "input_len": self.input_len,
            "output_len": self.output_len,
            "range_ratio": self.range_ratio,
            "prefix_len": self.prefix_len,
            "prefix_shared_tokens": self.prefix_len // bs * bs,
            "block_size": bs,
            "seed": self.seed,
        }

    @property
    def trace_label(self) -> str:
        """The trace's path, or ``synthetic`` for a synthetic load (logs, metric labels)."""
        return self.trace if self.trace is not None else "synthetic"

    def _load_problems(self) -> list[str]:
        """A trace or a synthetic load, not both, not neither; synthetic settings only with one."""
        if self.request_rate is not None and self.trace is not None:
            return [
                "request_rate: --request-rate makes a synthetic load, and a TRACE is given too: give one "
                "(a trace is replayed at its own times)"
            ]
        if self.request_rate is None and self.trace is None and self.resume:
            return [
                f"resume: {self.resume} holds no readable checkpoint.json (the trace and settings a resume "
                "takes from it): is it a results folder? Give the TRACE too to start a run there"
            ]
        if self.request_rate is None and self.trace is None:
            return ["trace: give a TRACE to replay, or --request-rate R for a synthetic load"]
        given = [flag_name(k) for k in SYNTHETIC_LOAD if k in self.model_fields_set]
        if self.request_rate is None and given:
            return [f"{', '.join(given)}: only for a synthetic load: give --request-rate R (and no TRACE)"]
        if self.request_rate is None:
            return []
        from replayer.trace.synth import MAX_CV, MIN_CV

        b = self.burstiness
        if not (math.isinf(b) or b == 1.0 or 1 / MAX_CV**2 <= b <= 1 / MIN_CV**2):
            return [
                f"burstiness: must be between {1 / MAX_CV**2:g} and {1 / MIN_CV**2:g}, or inf, got {b:g} "
                "(gaps of coefficient of variation 1/sqrt(B): a larger B is constant gaps in effect, inf)"
            ]
        try:
            self.synthetic_spec().check(names=_SYNTH_NAMES)
        except ValueError as e:
            return [str(e)]
        return []

    @model_validator(mode="after")
    def _modes(self) -> "RunConfig":
        problems = self._load_problems()
        if "chat/completions" in self.endpoint and self.prompt_mode != "text":
            problems.append(
                "endpoint: token-id prompts cannot go to a chat endpoint; use /v1/completions, "
                "or --prompt-mode text --tokenizer PATH (builtin:gpt2 ships with the replayer)"
            )
        elif self.endpoint.endswith(("/score", "/rerank")) and not self.tokenizer:
            problems.append(
                "endpoint: score and rerank take text: they need --tokenizer PATH (the "
                "documents are token blocks decoded with it)"
            )
        if self.prompt_mode == "text" and not self.tokenizer:
            problems.append(
                "prompt_mode: text mode needs --tokenizer PATH (a local tokenizer.json or folder, or "
                "builtin:gpt2, shipped with the replayer)"
            )
        if (self.retain_size is not None or self.retain_age_s is not None) and not (
            self.roll_rows or self.roll_interval_s
        ):
            problems.append(
                "retain_size/retain_age: retention removes rolled results files: give --roll-interval "
                "or --roll-rows too (without them results are rolled only at the end)"
            )
        if self.workers > 1 and self.shard != "0/1":
            problems.append(
                "workers: --workers N splits the trace into its own N shards; it cannot be "
                "combined with --shard (use one or the other)"
            )
        if self.coordinator is not None and (self.start_at is not None or self.workers > 1):
            problems.append(
                "coordinator: the fleet's coordinator sets the start; it cannot be combined with "
                "--start-at or --workers (give each process its --shard I/N instead)"
            )
        try:
            if self.ca_bundle or self.client_cert or self.client_key:
                self.tls.context()
        except ValueError as e:  # (a file that is not PEM, a key that does not fit, a key alone)
            problems.append(str(e))
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def tls(self) -> TLSOptions:
        """The TLS settings towards the targets (``replayer.http.tls``)."""
        return TLSOptions(self.ca_bundle, self.client_cert, self.client_key, self.tls_server_name, self.insecure)

    @field_validator("trace", "api_key_file", "control_token_file", "resume", "ca_bundle", "client_cert", "client_key")
    @classmethod
    def _exists(cls, v: str | None) -> str | None:
        if v is not None and not os.path.exists(v):
            raise ValueError(f"no such file or folder: {v}")
        return v

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, v: str | None) -> str | None:
        from replayer.core.tokenizerfiles import tokenizer_problem

        problem = tokenizer_problem(v) if v is not None else None
        if problem:
            raise ValueError(problem)
        return v

    @property
    def vocab_bounds(self) -> tuple[int, int]:
        lo, hi = (int(x) for x in self.vocab_range.split(":"))
        return lo, hi

    def control_token(self) -> str | None:
        """The admin control token from ``control_token_file`` or ``control_token_env`` (never logged)."""
        if self.control_token_file:
            with open(self.control_token_file, encoding="utf-8") as f:
                return f.read().strip() or None
        return os.environ.get(self.control_token_env) or None

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

    def named_secrets(self) -> dict[str, str | None]:
        """The secrets the logs redact, by where they come from (issue 47: a short one is warned about)."""
        return {
            f"the API key (--api-key-file or ${self.api_key_env})": self.api_key(),
            f"the control token (--control-token-file or ${self.control_token_env})": self.control_token(),
        }

    def api_key(self) -> str | None:
        """The API key from ``api_key_file`` or the ``api_key_env`` variable (never logged)."""
        if self.api_key_file:
            with open(self.api_key_file, encoding="utf-8") as f:
                return f.read().strip() or None
        return os.environ.get(self.api_key_env) or None


def load_config(
    values: dict, *, config_file: str | None = None, from_file: AbstractSet[str] = frozenset()
) -> RunConfig:
    """Validate ``values`` into a RunConfig, or raise ConfigError listing every problem, each
    naming the setting (and its flag, or ``config_file`` for the names in ``from_file``: the
    values that came from it) and the value given."""
    try:
        return RunConfig(**values)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            name = ".".join(str(x) for x in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            src = f" in {config_file}" if config_file and name in from_file else ""
            if name in RunConfig.model_fields and name != "trace":
                where = f"{name} ({flag_name(name)}{src})"
            else:
                where = f"{name or 'config'}{src}"
            got = f" (got {err['input']!r})" if err.get("type") != "missing" and name else ""
            problems.append(f"{where}: {msg}{got}")
        raise ConfigError(problems) from None
