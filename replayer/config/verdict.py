"""How a run is judged: SLO bounds (goodput), the error ratio that fails a run, warm-up, and the
fidelity and drift verdicts (``RunConfig``'s "Verdict" settings).

``RunConfig`` (``replayer.config.model``) inherits ``VerdictSettings`` with the other groups' settings;
the checks that relate settings of several groups stay there. Fields are in the order of
``replayer.config.groups.GROUPS`` under each heading.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

__all__ = ["SIM_ONLY", "VerdictSettings"]

#: the settings of the embedded simulator, which a run with ``--target`` does not start: refused
#: with it (``RunConfig``), and not passed to a sweep's points or ``--workers``' processes (the
#: parent starts the simulator and gives them its URL as their ``--target``)
SIM_ONLY = ("sim_ttft_drift_ms_per_min", "sim_itl_drift_ms_per_min")


class VerdictSettings(BaseModel):
    """The "Verdict" settings of ``RunConfig``."""

    # -- Verdict
    goodput: list[str] | None = Field(
        None,
        description="SLO bounds in ms, keys ttft, tpot, e2el (vllm bench serve's --goodput), e.g. "
        "--goodput ttft:2000 tpot:50 (a mapping in a config file): a request meets it when it succeeded "
        "within every bound (request_goodput, slo_attainment); unset = no SLO",
    )
    max_error_ratio: float | None = Field(
        None,
        ge=0,
        le=1,
        description="exit 3 when more than this "
        "fraction of the requests that ended failed (failed / (completed "
        "+ failed)), e.g. 0.01 for CI; none = exit 3 if all failed",
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
    drift_reference: str = Field(
        "first",
        pattern=r"^(first|previous|[0-9]+)$",
        description="drift verdict with --loop: each window is compared with the window at the same trace "
        "position in the first loop (first), in the loop before its own (previous: a rolling reference) "
        "or in the loop of this index (0 = the first)",
    )
    # (a negative drift is a server getting faster, the "improving" path; refused with --target: SIM_ONLY)
    sim_ttft_drift_ms_per_min: float = Field(
        0.0,
        description="a test aid for the embedded simulator (refused with --target): its TTFT grows by this many "
        "ms per minute, or shrinks when negative (replayer sim --ttft-drift-ms-per-min)",
    )
    sim_itl_drift_ms_per_min: float = Field(
        0.0,
        description="a test aid for the embedded simulator (refused with --target): its token gaps grow by this "
        "many ms per minute, or shrink when negative (replayer sim --itl-drift-ms-per-min)",
    )

    @property
    def goodput_slos(self) -> dict[str, float]:
        """The ``--goodput`` bounds in ms ({} if none): ``replayer.core.slo.parse_goodput``."""
        from replayer.core.slo import parse_goodput

        return parse_goodput(self.goodput)
