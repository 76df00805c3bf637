"""What the regression gate (``replayer compare --gate``) judges: its metrics, each one's direction
and minimum effect, and the bootstrap's settings; the defaults and a gate file (YAML) that
overrides them.

A metric is a latency quantile (``ttft_p50``, ``e2el_p99``, ...: any of ``LATENCIES`` with any
percentile), whose change is relative (percent of the baseline's value), or a share of requests
(``error_rate``, ``goodput``), whose change is absolute (percentage points). ``min_effect`` is in
percent for both. A gate file::

    confidence: 0.95        # the interval's coverage (two-sided)
    resamples: 2000         # bootstrap resamples
    blocks: 40              # blocks of consecutive paired requests resampled together
    min_requests: 100       # fewer paired successful requests: not comparable (exit 2)
    seed: 0
    goodput: "ttft:500,e2el:20000"   # SLO bounds for goodput (vllm's --goodput; or {ttft: 500, e2el: 20000}); unset = the runs'
    require_faithful: true  # a run not faithful to its trace is not compared (exit 2)
    max_dispatch_lag_ms: 25 # faithful, for a summary without a fidelity verdict: lag p99 at most this
    max_client_lag_ms: 1000 # a run late only by its own client (lag p99 up to this) is judged, its tails not
    metrics:
      ttft_p99: {min_effect: 15}     # percent
      tpot_p50: off                  # not judged (also {enabled: false})
      e2el_p90: {min_effect: 10}     # a metric more (lower is better, as every latency)
      error_rate: {min_effect: 0.5}  # percentage points
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

#: latency metrics: name -> (results column, label). ITL is the gaps' own distribution.
LATENCIES: dict[str, tuple[str, str]] = {
    "ttft": ("ttft_ms", "TTFT"),
    "tpot": ("tpot_ms", "TPOT"),
    "itl": ("itl_ms", "ITL"),
    "e2el": ("e2e_ms", "E2E"),
    "ttft_from_due": ("ttft_from_due_ms", "TTFT from due"),
    "e2el_from_due": ("e2el_from_due_ms", "E2E from due"),
}
#: share metrics: name -> (label, direction)
SHARES: dict[str, tuple[str, str]] = {
    "error_rate": ("error rate", "lower"),
    "goodput": ("goodput (SLO attainment)", "higher"),
}
_QUANTILE = re.compile(r"^(?P<latency>[a-z0-9_]+?)_p(?P<q>\d{1,2}(?:\.\d+)?)$")


@dataclass(frozen=True)
class MetricSpec:
    """One judged metric. ``quantile`` (0-100) for a latency, None for a share; ``min_effect`` in
    percent (of the baseline for a latency, percentage points for a share)."""

    name: str
    label: str
    direction: str  # "lower" or "higher" is better
    min_effect: float
    quantile: float | None = None
    column: str | None = None  # the results column of a latency

    @property
    def relative(self) -> bool:
        """Whether the change is relative to the baseline (a latency) or absolute (a share)."""
        return self.quantile is not None


@dataclass(frozen=True)
class GateSpec:
    """The gate's settings: its metrics (in order) and the bootstrap's."""

    metrics: tuple[MetricSpec, ...]
    confidence: float = 0.95
    resamples: int = 2000
    blocks: int = 40
    min_requests: int = 100
    seed: int = 0
    goodput: str | None = None  # SLO bounds ("ttft:500,e2el:20000"); None = the runs' --goodput
    require_faithful: bool = True  # refuse runs that were not faithful to their trace (exit 2)
    max_dispatch_lag_ms: float = 25.0  # faithful, for a summary without a fidelity verdict: lag p99 at most this
    max_client_lag_ms: float = 1000.0  # late only by its client up to this (lag p99): judged, its tails not (gatestall)
    source: str = "the defaults"  # where it came from (said in the outputs)


def metric(name: str, min_effect: float | None = None, direction: str | None = None) -> MetricSpec:
    """The spec of the metric called ``name`` (``ttft_p99``, ``error_rate``...) with its default
    direction and minimum effect unless given. Raises ValueError for an unknown name."""
    if name in SHARES:
        label, default_dir = SHARES[name]
        default_min = DEFAULT_MIN_EFFECT.get(name, 1.0)
        spec = MetricSpec(name, label, default_dir, default_min)
    else:
        m = _QUANTILE.match(name)
        if not m or m["latency"] not in LATENCIES or not 0 < float(m["q"]) < 100:
            known = ", ".join([*(f"{k}_pNN" for k in LATENCIES), *SHARES])
            raise ValueError(f"unknown metric {name!r} (known: {known})")
        column, label = LATENCIES[m["latency"]]
        q = float(m["q"])
        default_min = DEFAULT_MIN_EFFECT.get(name, 10.0 if q <= 50 else 20.0)
        spec = MetricSpec(name, f"{label} p{m['q']}", "lower", default_min, q, column)
    if min_effect is not None:
        spec = replace(spec, min_effect=float(min_effect))
    if direction is not None:
        spec = replace(spec, direction=direction)
    return spec


#: the minimum effects (percent; percentage points for the shares) of the default metrics. The
#: token gaps' p99s (TPOT, ITL) are a run's stalls (a server's or the client's scheduling, the
#: host's other work) more than its speed: they move by tens of percent between two runs of one
#: server, hence their 50 % (bench/bench_gate.py measures the defaults' false alarms)
DEFAULT_MIN_EFFECT: dict[str, float] = {
    "ttft_p50": 10.0,
    "ttft_p99": 20.0,
    "tpot_p50": 10.0,
    "tpot_p99": 50.0,
    "itl_p50": 10.0,
    "itl_p99": 50.0,
    "e2el_p50": 10.0,
    "e2el_p99": 20.0,
    "error_rate": 1.0,
    "goodput": 5.0,
}
DEFAULT_METRICS = tuple(DEFAULT_MIN_EFFECT)


def default_spec() -> GateSpec:
    """The gate with its default metrics and settings."""
    return GateSpec(tuple(metric(n) for n in DEFAULT_METRICS))


def _number(where: str, v: Any, lo: float, hi: float | None = None, integer: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise ValueError(f"{where}: expected {'an integer' if integer else 'a number'}, got {v!r}")
    if v < lo or (hi is not None and v > hi):
        raise ValueError(f"{where}: {v} is out of range ({lo} to {hi if hi is not None else 'any'})")
    return float(v)


def _metric_entry(where: str, name: str, entry: Any) -> MetricSpec | None:
    """One ``metrics:`` entry: a mapping (``min_effect``, ``direction``, ``enabled``), or
    off/false (None: the metric is not judged)."""
    if entry is False or entry == "off":
        metric(name)  # (an unknown name is still an error)
        return None
    if entry is None or entry is True or entry == "on":
        return metric(name)
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected a mapping (min_effect, direction) or off, got {entry!r}")
    unknown = set(entry) - {"min_effect", "direction", "enabled"}
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: min_effect, direction, enabled)"
        )
    if entry.get("enabled", True) is False:
        metric(name)
        return None
    direction = entry.get("direction")
    if direction is not None and direction not in ("lower", "higher"):
        raise ValueError(f"{where}.direction: expected lower or higher, got {direction!r}")
    min_effect = entry.get("min_effect")
    if min_effect is not None:
        min_effect = _number(f"{where}.min_effect", min_effect, 0.0)
    return metric(name, min_effect, direction)


_SETTINGS = {
    "confidence",
    "resamples",
    "blocks",
    "min_requests",
    "seed",
    "goodput",
    "metrics",
    "require_faithful",
    "max_dispatch_lag_ms",
    "max_client_lag_ms",
}


def spec_from_dict(doc: Any, source: str) -> GateSpec:
    """A ``GateSpec`` from a gate file's parsed YAML (``source`` names it in errors): the default
    metrics, each overridden or switched off by ``metrics:``, more added by name. Raises
    ValueError naming the file and key of anything wrong."""
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ValueError(f"{source}: expected a mapping of settings, got {type(doc).__name__}")
    unknown = set(doc) - _SETTINGS
    if unknown:
        raise ValueError(
            f"{source}: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(_SETTINGS))})"
        )
    entries = doc.get("metrics") or {}
    if not isinstance(entries, dict):
        raise ValueError(f"{source}: metrics: expected a mapping of metric names, got {entries!r}")
    chosen: dict[str, MetricSpec | None] = {n: metric(n) for n in DEFAULT_METRICS}
    for name, entry in entries.items():
        try:
            chosen[str(name)] = _metric_entry(f"{source}: metrics.{name}", str(name), entry)
        except ValueError as e:
            raise ValueError(str(e) if str(e).startswith(source) else f"{source}: metrics.{name}: {e}") from None
    goodput = doc.get("goodput")
    if isinstance(goodput, dict):  # (the mapping form, as a --config file takes it: {ttft: 500, e2el: 20000})
        goodput = ",".join(f"{k}:{v}" for k, v in goodput.items())
    if goodput is not None and not isinstance(goodput, str):
        raise ValueError(
            f'{source}: goodput: expected bounds such as "ttft:500,e2el:20000" or {{ttft: 500, e2el: 20000}}, got {goodput!r}'
        )
    if goodput is not None:
        from replayer.results.verdict import parse_goodput

        try:
            parse_goodput(goodput)
        except ValueError as e:
            raise ValueError(f"{source}: goodput: {e}") from None
    d = GateSpec(())
    faithful = doc.get("require_faithful", d.require_faithful)
    if not isinstance(faithful, bool):
        raise ValueError(f"{source}: require_faithful: expected true or false, got {faithful!r}")
    return GateSpec(
        tuple(m for m in chosen.values() if m is not None),
        confidence=_number(f"{source}: confidence", doc.get("confidence", d.confidence), 0.5, 0.999),
        resamples=int(_number(f"{source}: resamples", doc.get("resamples", d.resamples), 100, 100000, True)),
        blocks=int(_number(f"{source}: blocks", doc.get("blocks", d.blocks), 5, 10000, True)),
        min_requests=int(_number(f"{source}: min_requests", doc.get("min_requests", d.min_requests), 10, None, True)),
        seed=int(_number(f"{source}: seed", doc.get("seed", d.seed), 0, None, True)),
        goodput=goodput,
        require_faithful=faithful,
        max_dispatch_lag_ms=_number(
            f"{source}: max_dispatch_lag_ms", doc.get("max_dispatch_lag_ms", d.max_dispatch_lag_ms), 0.0
        ),
        max_client_lag_ms=_number(
            f"{source}: max_client_lag_ms", doc.get("max_client_lag_ms", d.max_client_lag_ms), 0.0
        ),
        source=source,
    )


def load_gate_file(path: str) -> GateSpec:
    """The gate file at ``path`` (YAML). Raises ValueError naming the file for one that cannot be
    read or parsed, or holds an unknown or bad setting."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise ValueError(f"{path}: cannot read the gate file: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a gate file (not UTF-8 text: a binary file?)") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not YAML: {e}") from None
    return spec_from_dict(doc, path)
