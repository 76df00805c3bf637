"""The run configuration: typed, frozen, validated before anything starts.

``RunConfig`` is the single source of settings and their defaults; the CLI only fills it. Its
fields are declared by group, one module each (``inputs``, ``target``, ``pacing``, ``verdict``,
``outputs``, ``observability``: the headings of ``groups.GROUPS``); ``RunConfig`` inherits them and
keeps the checks that relate settings of several groups. ``load_config`` reports every problem
at once, each naming the field and the bound (pydantic validation).
"""

from __future__ import annotations

import math
import os
from collections.abc import Set as AbstractSet

from pydantic import ConfigDict, ValidationError, field_validator, model_validator

from replayer.config.checks import FieldChecks
from replayer.config.inputs import InputSettings
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
from replayer.config.observability import ObservabilitySettings
from replayer.config.outputs import OutputSettings
from replayer.config.pacing import PacingSettings
from replayer.config.target import TargetSettings
from replayer.config.verdict import SIM_ONLY, VerdictSettings

__all__ = [
    "RUN_ID",
    "SAME_ON_RESUME",
    "SIM_ONLY",
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


class RunConfig(
    FieldChecks,
    ObservabilitySettings,
    OutputSettings,
    VerdictSettings,
    PacingSettings,
    TargetSettings,
    InputSettings,
):
    """Settings of ``replayer run``; every field has the CLI flag ``--field-name``. (The groups are
    listed last first: pydantic orders the fields from the last base, so ``model_fields`` holds the
    inputs' first, the observability settings last.)"""

    # every number must be finite (an inf or nan setting is refused, naming it: a window of inf seconds
    # is no window), but --request-rate and --burstiness, whose inf is a documented value (their
    # fields allow it); theirs is written as "Infinity" in the results' config, not null
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, ser_json_inf_nan="strings")

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

    @field_validator("trace", "api_key_file", "control_token_file", "resume", "ca_bundle", "client_cert", "client_key")
    @classmethod
    def _exists(cls, v: str | None) -> str | None:
        if v is not None and not os.path.exists(v):
            raise ValueError(f"no such file or folder: {v}")
        return v

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

    def named_secrets(self) -> dict[str, str | None]:
        """The secrets the logs redact, by where they come from (issue 47: a short one is warned about)."""
        return {
            f"the API key (--api-key-file or ${self.api_key_env})": self.api_key(),
            f"the control token (--control-token-file or ${self.control_token_env})": self.control_token(),
        }

    def _verdict_problems(self) -> list[str]:
        """A ``--drift-reference`` loop past ``--loop``'s last (known at start: issue 45), and the
        embedded simulator's settings (``SIM_ONLY``) with ``--target``, which starts none."""
        problems = []
        ref, loops = self.drift_reference, self.loop
        if ref.isdigit() and loops.isdigit() and int(ref) >= int(loops):  # (loops are numbered from 0)
            span = "0" if loops == "1" else f"0 to {int(loops) - 1}"
            problems.append(
                f"drift_reference: --drift-reference {ref} is past the last loop (--loop {loops} runs "
                f"{'loop' if loops == '1' else 'loops'} {span}, numbered from 0): give {span}, first or previous"
            )
        sim_only = [k for k in SIM_ONLY if getattr(self, k)]
        if sim_only and self.target:
            one = len(sim_only) == 1
            problems.append(
                f"{', '.join(sim_only)}: {' and '.join(map(flag_name, sim_only))} "
                f"{'is a test aid' if one else 'are test aids'} of the embedded simulator, which a run with "
                f"--target does not start: drop {'it' if one else 'them'} or --target"
            )
        return problems

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
        problems += self._verdict_problems()
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
