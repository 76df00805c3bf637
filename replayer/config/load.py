"""Loading the run configuration: the errors that list every problem, the CLI flag of a setting,
the run id, and the settings a resumed run takes from its checkpoint.

``replayer.config.model`` holds ``RunConfig`` (the settings and their checks) and ``load_config``,
and re-exports these.
"""

from __future__ import annotations

import json
import os
import re
import secrets

#: what ``run_id`` may hold: it goes into every request's ``X-Request-Id`` header
RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def new_run_id() -> str:
    """A new run id (12 random hex digits): unique across runs, so ids in a server's logs never
    collide between runs."""
    return secrets.token_hex(6)


class ConfigError(ValueError):
    """Invalid settings; ``problems`` lists one ``field: message`` per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in problems))


#: the settings of a synthetic load (``--request-rate``) beside the rate: its rows and arrivals
SYNTHETIC_LOAD = ("burstiness", "num_prompts", "input_len", "output_len", "prefix_len", "range_ratio")
#: of ``SAME_ON_RESUME``, those recorded for a synthetic load only (``kv_block_size`` is its hash
#: ids' block size when no ``block_size`` is given; for a trace it only shapes the expected hits)
SYNTHETIC_ONLY = (*SYNTHETIC_LOAD, "kv_block_size")

#: settings a resumed run must share with the run it continues: they decide which rows exist
#: and what each prompt is (a resume with another seed would mix two prompt sets in one folder;
#: a synthetic load is generated again from its recorded seed and settings)
SAME_ON_RESUME = (
    "seed",
    "shard",
    "block_size",
    "vocab_range",
    "tokenizer",
    "prompt_mode",
    "loop_salt",
    "loop",
    "max_requests",
    "endpoint",
    "format",
    "map",
    "time_unit",
    "mix",
    "hash_id_scope",
    "request_rate",
    *SYNTHETIC_ONLY,
)


def recorded_settings(results_dir: str, *, workers: bool = False) -> dict:
    """The trace, ``SAME_ON_RESUME`` settings and run id recorded in ``results_dir/checkpoint.json`` (or,
    for a ``--workers`` run's folder, ``worker-0/checkpoint.json``, without its shard), so that
    ``--resume DIR`` alone continues the run as it was. Empty when there is no readable
    checkpoint (the daemon then says so)."""
    for folder, own in ((results_dir, not workers), (os.path.join(results_dir, "worker-0"), False)):
        try:
            with open(os.path.join(folder, "checkpoint.json"), encoding="utf-8") as f:
                ckpt = json.load(f)
        except (OSError, ValueError):
            continue
        if not isinstance(ckpt, dict):
            return {}
        out = {k: v for k, v in (ckpt.get("settings") or {}).items() if k in SAME_ON_RESUME}
        out.update({k: ckpt[k] for k in ("seed", "shard", "trace", "run_id") if k in ckpt})
        if not own:
            out.pop("shard", None)
        return out
    return {}


def flag_name(field: str) -> str:
    """The CLI flag of a RunConfig field: ``read_timeout_s`` -> ``--read-timeout``."""
    return "--" + field.removesuffix("_s").replace("_", "-")
