"""What a run sends: the trace (or a mix of traces), a synthetic load instead of one, and how
prompts are built (``RunConfig``'s "Trace", "Synthetic load" and "Prompts" settings).

``RunConfig`` (``replayer.config.model``) inherits ``InputSettings`` with the other groups' settings;
the checks that relate settings of several groups stay there. Fields are in the order of
``replayer.config.groups.GROUPS`` under each heading.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, Field, field_validator, model_validator

__all__ = ["InputSettings"]


class InputSettings(BaseModel):
    """The "Trace", "Synthetic load (no trace)", "Prompts" settings of ``RunConfig``."""

    # -- Trace
    trace: str | None = Field(
        None,
        description="trace: canonical Parquet (file, folder or glob), Mooncake JSONL, "
        "Azure CSV, or generic JSONL/CSV with --map; none = a synthetic load (--request-rate)",
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
    strict: bool = Field(False, description="treat out-of-order timestamps in the trace as an error")
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
    # -- issue 47 (a user's third day) --
    max_trace_length: int = Field(
        10_000_000,
        ge=1,
        description="refuse trace rows whose input_length or output_length is above this many tokens "
        "(beyond any served model), naming file, row and field",
    )
    # -- Synthetic load (no trace)
    request_rate: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=True,  # (inf is a value; nan fails gt)
        description="a synthetic load instead of a trace (vllm bench serve's flag): requests per "
        "second, inf = all at once; its rows: --num-prompts, --input-len, --output-len, "
        "--prefix-len, --range-ratio, arrivals by --burstiness, seeded by --seed; none = replay TRACE",
    )
    burstiness: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=True,  # (inf is a value; nan fails gt)
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
    # -- Prompts
    seed: int = Field(0, ge=0, lt=2**64, description="prompt seed: same seed, same prompts")
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
    block_size: int | None = Field(
        None,
        ge=1,
        description="tokens per hash id; none = from the trace (512), for a synthetic load --kv-block-size",
    )
    vocab_range: str = Field("1000:30000", description="token ids LO:HI (HI exclusive) used for prompts")
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
    usage_slack_tokens: int = Field(
        0,
        ge=0,
        description="pooling usage audit: tokens per input the server "
        "may add (special tokens) before a response is flagged as inflated",
    )

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

    @model_validator(mode="before")
    @classmethod
    def _trace_of_mix(cls, values: object) -> object:
        if isinstance(values, dict) and not values.get("trace") and values.get("mix"):
            first = values["mix"][0]
            path = first.get("trace") if isinstance(first, dict) else str(first).split(",")[0]
            values = {**values, "trace": path}
        return values

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
