"""Checks of single settings of the run configuration (``RunConfig``'s field validators): each
value's own form and bounds. ``RunConfig`` (``replayer.config.model``) inherits them; the checks that
relate several settings, and the derived properties, stay there."""

from __future__ import annotations

from pydantic import BaseModel, ValidationInfo, field_validator

from replayer.config.load import RUN_ID

#: settings that take one word of a closed set (None, where a setting allows it, is not checked)
CHOICES: dict[str, tuple[str, ...]] = {
    "image_format": ("png", "jpeg"),
    "prompt_mode": ("tokens", "text"),
    "hash_id_scope": ("local", "global"),
    "session_policy": ("wait", "wait-no-think", "off"),
    "log_format": ("text", "json"),
    "validate_trace": ("full", "lazy"),
}


class FieldChecks(BaseModel):
    """Field validators for ``RunConfig`` (declared without fields: ``check_fields=False``)."""

    @field_validator(*CHOICES, check_fields=False)
    @classmethod
    def _one_of(cls, v: str | None, info: ValidationInfo) -> str | None:
        choices = CHOICES[info.field_name]  # type: ignore[index]
        if v is not None and v not in choices:
            raise ValueError(f"must be {', '.join(choices[:-1])} or {choices[-1]}")
        return v

    @field_validator("vocab_range", check_fields=False)
    @classmethod
    def _vocab(cls, v: str) -> str:
        try:
            lo, hi = (int(x) for x in v.split(":"))
        except ValueError:
            raise ValueError("must be LO:HI with integers, e.g. 1000:30000") from None
        if not 0 <= lo < hi:
            raise ValueError(f"must satisfy 0 <= LO < HI, got {lo}:{hi}")
        return v

    @field_validator("goodput", mode="before", check_fields=False)
    @classmethod
    def _goodput(cls, v: object) -> object:
        from replayer.core.slo import format_goodput, parse_goodput

        if v is None:
            return None
        if isinstance(v, dict):  # a config file's mapping: {ttft: 2000, tpot: 50}
            v = [f"{k}:{x}" for k, x in v.items()]
        if isinstance(v, str):  # a config file may give one string of pairs
            v = v.replace(",", " ").split()
        if not isinstance(v, list | tuple):
            raise ValueError(
                "must be KEY:VALUE pairs, e.g. ttft:2000 tpot:50 e2el:30000, or a mapping {ttft: 2000, tpot: 50}"
            )
        return format_goodput(parse_goodput([str(x) for x in v])) or None

    @field_validator("image_size", check_fields=False)
    @classmethod
    def _image_size(cls, v: str) -> str:
        from replayer.trace.images import parse_image_size

        wh, err = parse_image_size(v)
        if err or wh is None:
            raise ValueError(err or "must be WxH")
        return f"{wh[0]}x{wh[1]}"

    @field_validator("image_token_rule", check_fields=False)
    @classmethod
    def _image_token_rule(cls, v: str) -> str:
        from replayer.payload.image_tokens import parse_rule

        parse_rule(v)
        return v

    @field_validator("retain_size", check_fields=False)
    @classmethod
    def _retain_size(cls, v: str | int | None) -> str | None:
        if v is None:
            return None
        from replayer.record.retention import parse_bytes

        if parse_bytes(v) <= 0:
            raise ValueError("retain_size must be more than 0 bytes")
        return str(v)

    @field_validator("itl_format", check_fields=False)
    @classmethod
    def _itl_format(cls, v: str) -> str:
        from replayer.core.result import ITL_FORMATS

        if v not in ITL_FORMATS:
            raise ValueError(f"itl_format must be one of {', '.join(ITL_FORMATS)}")
        return v

    @field_validator("session_header", check_fields=False)
    @classmethod
    def _session_header(cls, v: str | None) -> str | None:
        if v is not None and (not v or any(c in v for c in ":\r\n \t")):
            raise ValueError(f"{v!r} is not a header name (or a preset: dynamo, aibrix)")
        return v

    @field_validator("loop", check_fields=False)
    @classmethod
    def _loop(cls, v: str) -> str:
        if v == "forever" or (v.isdigit() and int(v) >= 1):
            return v
        raise ValueError("must be a whole number >= 1 or 'forever'")

    @field_validator("shard", check_fields=False)
    @classmethod
    def _shard(cls, v: str) -> str:
        try:
            i, n = (int(x) for x in v.split("/"))
        except ValueError:
            raise ValueError("must be I/N, e.g. 0/4") from None
        if not (n >= 1 and 0 <= i < n):
            raise ValueError(f"must satisfy 0 <= I < N, got {v}")
        return v

    @field_validator("run_id", check_fields=False)
    @classmethod
    def _run_id(cls, v: str | None) -> str | None:
        if v is not None and not RUN_ID.fullmatch(v):
            raise ValueError("must be 1 to 64 letters, digits, '.', '_' or '-' (it goes into an HTTP header)")
        return v

    @field_validator("log_level", check_fields=False)
    @classmethod
    def _level(cls, v: str) -> str:
        if v.lower() not in ("debug", "info", "warning", "error"):
            raise ValueError("must be debug, info, warning or error")
        return v.lower()

    @field_validator("coordinator", "metrics_push", "otlp_endpoint", check_fields=False)
    @classmethod
    def _url_port(cls, v: str | None) -> str | None:
        from replayer.core.ports import url_port_problem

        problem = url_port_problem(v) if v is not None else None
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("endpoint", check_fields=False)
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("must start with '/', e.g. /v1/completions")
        return v
