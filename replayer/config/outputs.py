"""Where a run's results go: the results folder, resuming, flushing, rolling and retention, and
the admin control token (``RunConfig``'s "Results" and "Soak" settings).

``RunConfig`` (``replayer.config.model``) inherits ``OutputSettings`` with the other groups' settings;
the checks that relate settings of several groups stay there. Fields are in the order of
``replayer.config.groups.GROUPS`` under each heading.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, Field

__all__ = ["OutputSettings"]


class OutputSettings(BaseModel):
    """The "Results", "Soak" settings of ``RunConfig``."""

    # -- Results
    results: str | None = Field(None, description="results folder; none = ./results/<timestamp>")
    resume: str | None = Field(
        None,
        description="continue the run recorded in this results folder "
        "(its trace and prompt settings unless given again: then they must agree; --speedup and "
        "--target as given), skipping every row already recorded; unset = a new run",
    )
    resume_existing: bool = Field(
        False,
        description="with --results DIR: continue the run recorded "
        "there when DIR holds its checkpoint (as --resume DIR), else start a "
        "new one in DIR (for containers that restart)",
    )
    flush_rows: int = Field(2000, ge=1, description="write a results row group every N results")
    flush_interval_s: float = Field(2.0, gt=0, description="or every this many seconds")
    itl_format: str = Field(
        "exact",
        description="per-request ITL in the results: exact (every gap) or sketch "
        "(compact, for long runs: each request's gaps rounded to buckets 0.5 percent wide, one "
        "value and one count per bucket; ITL statistics within 0.5 percent)",
    )
    # -- Soak
    roll_interval_s: float | None = Field(
        None, gt=0, description="start a new results file this often (soak); unset = no roll by time"
    )
    roll_rows: int | None = Field(
        None, ge=1, description="start a new results file every N results (soak); unset = no roll by count"
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
    control_token_env: str = Field(
        "REPLAYER_CONTROL_TOKEN",
        description="environment variable holding the bearer token for the admin control endpoints (unset = open)",
    )
    control_token_file: str | None = Field(
        None, description="file holding the control token (overrides the variable); unset = the variable"
    )

    @property
    def retain_bytes(self) -> int | None:
        """``retain_size`` in bytes (None: no size bound)."""
        from replayer.record.retention import parse_bytes

        return parse_bytes(self.retain_size) if self.retain_size is not None else None

    def control_token(self) -> str | None:
        """The admin control token from ``control_token_file`` or ``control_token_env`` (never logged)."""
        if self.control_token_file:
            with open(self.control_token_file, encoding="utf-8") as f:
                return f.read().strip() or None
        return os.environ.get(self.control_token_env) or None
