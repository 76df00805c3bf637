"""Resuming a run: where it starts again (the rows already recorded are skipped), the settings
it must share with the run it continues, and the checkpoint each flush writes for it.

A checkpoint (``checkpoint.json``, written by the recorder at every flush) holds the trace, the
``SAME_ON_RESUME`` settings, the run id, the next schedule position and the target-metric totals
so far (a run killed before its summary still hands them on)."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import numpy as np
import pyarrow.compute as pc

from replayer.config.model import SAME_ON_RESUME, SYNTHETIC_ONLY, RunConfig, flag_name
from replayer.observe.target_metrics import TargetScraper
from replayer.record.folder import drop_not_started, read_removed, read_results
from replayer.run.readiness import StartupError
from replayer.send.feed import Position

log = logging.getLogger("replayer")


def resume_plan(results_dir: str, cfg: RunConfig | None = None):
    """Where a resumed run starts: (first loop with an unrecorded row, skip function).

    Every (loop, row) already recorded as sent (any outcome but ``not_started``) in the results
    folder is skipped, and the ``not_started`` records are removed (those rows are sent now), so
    the union of the files holds each row once. Raises StartupError when the folder holds no
    checkpoint, or when ``cfg`` differs from the checkpoint in the trace or a ``SAME_ON_RESUME``
    setting (all differences listed; checkpoints written before these were recorded hold the
    trace, shard and seed only)."""
    ckpt_path = os.path.join(results_dir, "checkpoint.json")
    if not os.path.exists(ckpt_path):
        raise StartupError(f"--resume {results_dir}: no checkpoint.json (not a replayer results folder?)")
    with open(ckpt_path, encoding="utf-8") as f:
        ckpt = json.load(f)
    if cfg is not None:
        recorded = {**ckpt.get("settings", {}), **{k: ckpt[k] for k in ("shard", "seed") if k in ckpt}}
        now = resume_settings(cfg)
        diff = [
            f"{flag_name(k)} {recorded[k]!r} there, {now.get(k)!r} now"
            for k in SAME_ON_RESUME
            if k in recorded and recorded[k] != now.get(k)
        ]
        if "trace" in ckpt and _other_trace(ckpt["trace"], cfg.trace):
            there = ckpt["trace"] or "a synthetic load"
            diff.insert(
                0, f"trace {there} there, {os.path.abspath(cfg.trace) if cfg.trace else 'a synthetic load'} now"
            )
        if diff:
            raise StartupError(f"--resume {results_dir}: settings differ from the run it continues: " + "; ".join(diff))
    table = read_results(results_dir, columns=["loop", "row", "outcome"])
    done: dict[int, np.ndarray] = {}
    if table.num_rows:
        sent = table.filter(pc.not_equal(table.column("outcome"), "not_started"))
        loops = sent.column("loop").to_numpy()
        rows = sent.column("row").to_numpy()
        for lp in np.unique(loops):
            done[int(lp)] = np.unique(rows[loops == lp])
    removed = read_removed(results_dir)  # rows in results files retention removed were sent too
    for lp, rows in (removed.recorded_rows() if removed else {}).items():
        done[lp] = np.union1d(done.get(lp, np.zeros(0, np.int64)), rows)
    # results of the last loop(s) may have been lost with the process: restart one loop earlier
    start_loop = max(0, int(ckpt.get("loop", 0)) - 1)
    # rows a stopped run recorded as not started are sent now: their old records go
    dropped = drop_not_started(results_dir)

    def skip(loop: int, rows: np.ndarray) -> np.ndarray:
        d = done.get(loop)
        return np.isin(rows, d) if d is not None else np.zeros(rows.size, dtype=bool)

    log.info(
        "resuming %s at loop %d, row %d (its checkpoint): %d rows already recorded are skipped "
        "(%d not-started records replaced)",
        results_dir,
        int(ckpt.get("loop", 0)),
        int(ckpt.get("next_row", 0)),
        sum(v.size for v in done.values()),
        dropped,
    )
    return start_loop, skip


def _other_trace(there: str | None, now: str | None) -> bool:
    """Whether the trace recorded (None: a synthetic load) is not the one given now (the same
    file by its real path, or by its name when the folder moved)."""
    if there is None or now is None:
        return there is not now
    return os.path.realpath(there) != os.path.realpath(now) and os.path.basename(there) != os.path.basename(now)


def scraper_totals(scraper: TargetScraper) -> dict:
    """What a resumed run carries on (summary.json's and checkpoint.json's ``target_metrics``)."""
    return {
        "scrapes": scraper.scrapes,
        "scrape_errors": scraper.errors,
        "counter_resets": scraper.resets,
        "counter_series_resets": scraper.series_resets,
        "series_totals": scraper.series_totals(),
    }


def carry_target_totals(results_dir: str, scraper: TargetScraper) -> None:
    """Seed ``scraper`` with the target-metric totals of the runs already in ``results_dir``:
    from ``checkpoint.json`` (written at every flush, so a killed run's totals are there up to
    its last flush), else from ``summary.json`` (checkpoints of older versions hold none)."""
    tm = None
    for name in ("checkpoint.json", "summary.json"):
        try:
            with open(os.path.join(results_dir, name), encoding="utf-8") as f:
                tm = json.load(f).get("target_metrics")
        except (OSError, ValueError, AttributeError):
            continue
        if tm:
            break
    if not tm:
        return
    scraper.add_totals(
        tm.get("series_totals") or [],
        scrapes=tm.get("scrapes", 0),
        errors=tm.get("scrape_errors", 0),
        resets=tm.get("counter_resets", 0),
        series_resets=tm.get("counter_series_resets", 0),
    )


def resume_settings(cfg: RunConfig) -> dict:
    """The ``SAME_ON_RESUME`` settings as JSON values (a trace's run leaves the synthetic load's
    out: they do not apply to it, and ``--resume`` would take them as given)."""
    keys = [k for k in SAME_ON_RESUME if cfg.request_rate is not None or k not in SYNTHETIC_ONLY]
    return {k: json.loads(json.dumps(getattr(cfg, k), default=str)) for k in keys}


class Checkpoint:
    """Builds ``checkpoint.json``'s content (called by the recorder at each flush): the run's
    identity and settings, and the replay's position once ``position`` is given (before: the
    start of ``start_loop``)."""

    def __init__(self, cfg: RunConfig, run_id: str, start_loop: int, scraper: TargetScraper | None = None) -> None:
        self.cfg = cfg
        self.run_id = run_id
        self.start_loop = start_loop
        self.scraper = scraper
        self.position: Position | None = None  # the dispatcher's, once it exists

    def __call__(self) -> dict[str, Any]:
        cfg, pos = self.cfg, self.position
        ckpt = {
            "trace": os.path.abspath(cfg.trace) if cfg.trace is not None else None,
            "shard": cfg.shard,
            "seed": cfg.seed,
            "settings": resume_settings(cfg),
            "run_id": self.run_id,
            "loop": pos.loop if pos else self.start_loop,
            "next_row": pos.row if pos else 0,
            "next_index": pos.index if pos else 0,
            "wall_time": time.time(),
        }
        if self.scraper is not None:  # a run killed before its summary still hands its totals on
            ckpt["target_metrics"] = scraper_totals(self.scraper)
        return ckpt
