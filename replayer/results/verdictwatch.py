"""The verdicts live: a step of the run's result fan-out (``on_result``) that keeps the fidelity
figures and the drift windows as results arrive, for the gauges and ``/status``.

Per result it does a few additions and list appends (the window's latencies); a window's
quantiles are computed when it closes (one window after its end, in due time: its stragglers are
in by then; a later one counts only in the summary), through ``Stat`` (the summary's nearest-rank
definition). The verdicts are judged when asked (a scrape, ``/status``), at most once per
``JUDGE_EVERY_S`` of due time: the drift verdict over the closed windows (``drift.judge_drift``)
and the fidelity verdict over the figures so far (``fidelity.judge_fidelity``, without the
inter-arrivals, which need every send: the summary has them). Judging at each close instead
made the loop stall a few ms twice a second in a short-window soak, and those stalls, growing
with the windows, showed up as drift in the very latencies judged. Memory: one row of numbers per
closed window, the open windows' values.

The gauges (``VerdictWatch`` registers one collector): ``replayer_fidelity_faithful`` (1
faithful, 0 not; no sample before it is judged), ``replayer_drift_drifting{metric}`` and
``replayer_drift_slope_percent_per_hour{metric}`` (once the drift verdict is not too short),
``replayer_drift_window_latency_seconds{metric,quantile}`` (the last closed window) and
``replayer_drift_windows`` (windows closed). At the end of the run ``final`` sets them from the
summary's verdicts (those of the results files).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from replayer.core.result import RequestResult
from replayer.core.stats import Stat
from replayer.results.drift import judge_drift
from replayer.results.driftwindows import LATENCIES, QUANTILES, SERVER
from replayer.results.fidelity import FidelityBounds, count_figures, judge_fidelity

#: the live verdicts are judged when asked (a scrape of the gauges, ``/status``), at most once per
#: this much due time: a judgement fits every metric's trend (~5 ms on 60 windows, a fraction of a
#: second on thousands), time the loop would otherwise spend measuring requests
JUDGE_EVERY_S = 10.0
#: the live trends' pairs of windows (the summary's: ``trend.MAX_PAIRS``)
LIVE_MAX_PAIRS = 20_000


class _Open:
    """An open window's values."""

    __slots__ = (
        "ttft",
        "tpot",
        "e2e",
        "itl",
        "server_ttft",
        "lag",
        "due",
        "sent",
        "completed",
        "failed",
        "met",
        "e2e_sum",
        "in_tokens",
        "out_tokens",
    )

    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.tpot: list[float] = []
        self.e2e: list[float] = []
        self.itl: list[float] = []
        self.server_ttft: list[float] = []
        self.lag: list[float] = []
        self.due = self.sent = self.completed = self.failed = self.met = 0
        self.e2e_sum = 0.0
        self.in_tokens = self.out_tokens = 0  # the trace's lengths of the requests due in it

    def add(self, res: RequestResult) -> None:
        """One result sent (its latencies only when it succeeded)."""
        self.due += 1
        self.sent += 1
        self.in_tokens += res.input_length
        self.out_tokens += res.output_length
        if res.dispatch_lag_ms is not None:
            self.lag.append(res.dispatch_lag_ms)
        if res.e2e_ms is not None:
            self.e2e_sum += res.e2e_ms
        if res.outcome == "success":
            self.completed += 1
            if res.ttft_ms is not None:
                self.ttft.append(res.ttft_ms)
            if res.tpot_ms is not None:
                self.tpot.append(res.tpot_ms)
            if res.e2e_ms is not None:
                self.e2e.append(res.e2e_ms)
            self.itl.extend(res.itl_ms)
            if res.server_time_to_first_token_ms is not None:
                self.server_ttft.append(res.server_time_to_first_token_ms)
            if res.slo_met:
                self.met += 1
        elif res.outcome == "failed":
            self.failed += 1


class VerdictWatch(Collector):
    """The live verdicts (module docstring). ``window_s``: the drift window (``--drift-window``)."""

    def __init__(
        self,
        registry: CollectorRegistry | None,
        *,
        window_s: float,
        bounds: FidelityBounds | None = None,
        max_concurrency: int | None = None,
        min_change_pct: float = 10.0,
        reference: str = "first",
    ) -> None:
        self.window_ns = max(1, int(window_s * 1e9))
        self.window_s = window_s
        self.bounds = bounds or FidelityBounds()
        self.max_concurrency = max_concurrency
        self.min_change_pct = min_change_pct
        self.reference = reference
        self.n = dict.fromkeys(
            ("rows", "sent", "unsent", "queue_waited", "queue_held", "session_waited", "judged", "prompt_off"), 0
        )
        self.n["output_off"] = 0
        self.lag = Stat()
        self._lags: list[float] = []
        self._origins: dict[int, int] = {}
        self._open: dict[tuple[int, int], _Open] = {}
        self._judged_at_ns: int | None = None  # due time of the last result at the last judgement
        self._last_due_ns = 0
        self._final = False  # the summary's verdicts are set (final): no live judgement after them
        self.rows: list[dict[str, Any]] = []  # closed windows, as drift.DriftFold.series has them
        self.fidelity: dict[str, Any] | None = None
        self.drift: dict[str, Any] | None = None
        if registry is not None:
            registry.register(self)

    # -- the fan-out step ---------------------------------------------------------------------------
    def on_result(self, res: RequestResult) -> None:
        if res.warmup:
            return
        n = self.n
        n["rows"] += 1
        if res.sent_ns is None:
            if res.outcome in ("not_started", "missed_while_down"):
                n["unsent"] += 1
            return
        n["sent"] += 1
        if res.dispatch_lag_ms is not None:
            self._lags.append(res.dispatch_lag_ms)
        qw = res.queue_wait_ms
        if qw:
            n["queue_waited"] += 1
            if qw > self.bounds.max_lag_ms:
                n["queue_held"] += 1
        if res.session_wait_ms:
            n["session_waited"] += 1
        if res.input_length > 0:
            n["judged"] += 1
            n["prompt_off"] += res.prompt_len_sent != res.input_length
            n["output_off"] += 0 < res.output_length != res.max_tokens
        self._window(res).add(res)

    def _window(self, res: RequestResult) -> _Open:
        """The open window of ``res`` (opened, and the windows it ends closed, when new)."""
        origin = self._origins.setdefault(res.loop, res.due_ns)
        if res.due_ns < origin:
            origin = self._origins[res.loop] = res.due_ns
        key = (res.loop, (res.due_ns - origin) // self.window_ns)
        w = self._open.get(key)
        if w is None:
            w = self._open[key] = _Open()
            self._close_before(res.due_ns)
        return w

    # -- windows ------------------------------------------------------------------------------------
    def _start_ns(self, key: tuple[int, int]) -> int:
        return self._origins.get(key[0], 0) + key[1] * self.window_ns

    def _close_before(self, due_ns: int) -> None:
        """Close the open windows that ended a whole window before ``due_ns``, then judge."""
        done = [k for k in self._open if self._start_ns(k) + 2 * self.window_ns <= due_ns]
        if not done:
            return
        for k in sorted(done, key=self._start_ns):
            self.rows.append(self._row(k, self._open.pop(k)))
        self._last_due_ns = max(self._last_due_ns, due_ns)

    def _row(self, key: tuple[int, int], w: _Open) -> dict[str, Any]:
        ws = self.window_s
        row: dict[str, Any] = {"loop": key[0], "position": key[1]}
        row["t_s"] = (self._start_ns(key) + self.window_ns / 2) / 1e9
        for m in (*LATENCIES, *SERVER):
            st = Stat()
            st.add(np.asarray(getattr(w, m), dtype=np.float64))
            for q in QUANTILES:
                row[f"{m}_p{q}_ms"] = st.percentile(q)
        ended = w.completed + w.failed
        row.update(
            error_rate=w.failed / ended if ended else None,
            goodput_rps=w.met / ws,
            achieved_rps=w.sent / ws,
            offered_rps=w.due / ws,
            offered_input_tps=w.in_tokens / ws,
            offered_output_tps=w.out_tokens / ws,
            in_flight=w.e2e_sum / 1e3 / ws,
            requests=w.sent,
        )
        lag = Stat()
        lag.add(np.asarray(w.lag, dtype=np.float64))
        row["dispatch_lag_p99_ms"] = lag.percentile(99)
        return row

    def _maybe_judge(self) -> None:
        """Judge when never judged, or ``JUDGE_EVERY_S`` of due time after the last judgement."""
        if (
            self.n["sent"]
            and not self._final
            and (self._judged_at_ns is None or self._last_due_ns - self._judged_at_ns >= JUDGE_EVERY_S * 1e9)
        ):
            self._judged_at_ns = self._last_due_ns
            self.judge()

    def judge(self) -> None:
        """Both verdicts over what has arrived so far."""
        self._judge_fidelity()
        if self.rows:
            self.drift = judge_drift(
                list(self.rows),
                window_s=self.window_s,
                min_change_pct=self.min_change_pct,
                reference=self.reference,
                max_lag_ms=self.bounds.max_lag_ms,
                max_pairs=LIVE_MAX_PAIRS,
            )

    def _judge_fidelity(self) -> None:
        if self._lags:
            self.lag.add(np.asarray(self._lags, dtype=np.float64))
            self._lags = []
        fig = count_figures(self.n, self.lag, self.n["judged"], None)
        self.fidelity = judge_fidelity(fig, self.bounds, max_concurrency=self.max_concurrency)

    def final(self, summary: dict[str, Any]) -> None:
        """The gauges and ``/status`` from the summary's verdicts (the results files')."""
        self.fidelity = summary.get("fidelity") or self.fidelity
        self.drift = summary.get("drift") or self.drift
        self._final = True

    # -- /status and the gauges -----------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """``/status``'s ``verdicts``: each verdict and its reasons (or drifting metrics) so far."""
        self._maybe_judge()
        out: dict[str, Any] = {}
        if self.fidelity is not None:
            out["fidelity"] = {"verdict": self.fidelity["verdict"], "reasons": self.fidelity.get("reasons", [])}
        if self.drift is not None:
            out["drift"] = {"verdict": self.drift["verdict"], "drifting": self.drift.get("drifting", [])}
        out["drift_windows"] = len(self.rows)
        return {"verdicts": out}

    def collect(self):
        self._maybe_judge()
        faithful = GaugeMetricFamily(
            "replayer_fidelity_faithful", "Fidelity verdict: 1 faithful, 0 not faithful (absent before judged)."
        )
        v = (self.fidelity or {}).get("verdict")
        if v in ("faithful", "not_faithful"):
            faithful.add_metric([], 1.0 if v == "faithful" else 0.0)
        yield faithful
        drifting = GaugeMetricFamily(
            "replayer_drift_drifting",
            "Drift verdict per metric: 1 drifting, 0 stable (absent before judged).",
            labels=["metric"],
        )
        slope = GaugeMetricFamily(
            "replayer_drift_slope_percent_per_hour",
            "Trend of each metric over the drift windows (Theil-Sen), percent of its level per hour.",
            labels=["metric"],
        )
        for name, m in ((self.drift or {}).get("metrics") or {}).items():
            drifting.add_metric([name], 1.0 if m["drifting"] else 0.0)
            if m.get("slope_percent_per_hour") is not None:
                slope.add_metric([name], m["slope_percent_per_hour"])
        yield drifting
        yield slope
        window = GaugeMetricFamily(
            "replayer_drift_window_latency_seconds",
            "Latency quantiles of the last closed drift window.",
            labels=["metric", "percentile"],  # ("quantile" is a summary's label)
        )
        if self.rows:
            last = self.rows[-1]
            for m in LATENCIES:
                for q in QUANTILES:
                    val = last.get(f"{m}_p{q}_ms")
                    if val is not None:
                        window.add_metric([m, f"p{q}"], val / 1e3)
        yield window
        yield GaugeMetricFamily("replayer_drift_windows", "Drift windows closed so far.", value=len(self.rows))

    def describe(self):
        return []


__all__ = ["VerdictWatch"]
