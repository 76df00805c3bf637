"""Which run a series belongs to: the run id on every series, and ``replayer_run_info``.

Every sample the admin server exposes (and a push to a Pushgateway sends) carries the constant
label ``run_id``: one value per process, so it adds no series within a run, and a new run is new
series (two replays on one Prometheus, or a restarted replayer on the same admin port, never mix,
even inside one rate window). The shards of one run share it: ``--workers`` hands every worker
the parent's run id, and the shards of a fleet (``--coordinator``) are each given the same
``--run-id``; their ``instance`` labels tell them apart and ``sum by (run_id)`` adds them up.

``replayer_run_info{model, target, shard, trace}`` (value 1, one series per ``--target``) says
what the run replays; the dashboard's variables are read from it (``label_values``). ``target``
is the target's ``host:port`` (the URL's default port when it names none): the ``instance`` label
Prometheus gives the target's own ``/metrics`` scrape by default, so the target's series of a run
are ``{instance=~"$target"}``. The labels other than ``run_id`` are descriptive and bounded (one
value per run each), so they live on this one series rather than on every series.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.core import InfoMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

_DEFAULT_PORTS = {"http": 80, "https": 443}


def target_address(url: str) -> str:
    """``host:port`` of a target URL (the scheme's default port when it names none)."""
    parts = urlsplit(url if "//" in url else f"http://{url}")
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 80)
    return f"{host}:{port}"


class RunLabels(Collector):
    """What the admin server exposes: ``registry``'s samples, each with ``labels`` added (a
    sample's own label of the same name wins). Has ``collect`` only, which is all that
    ``generate_latest`` and ``push_to_gateway`` read."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]) -> None:
        self.registry = registry
        self.labels = dict(labels)

    def collect(self) -> Iterable[Metric]:
        extra = self.labels
        for fam in self.registry.collect():
            out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            out.samples = [s._replace(labels={**extra, **s.labels}) for s in fam.samples]
            yield out


class RunInfo(Collector):
    """``replayer_run_info``: one series per target, value 1 (module docstring)."""

    NAME = "replayer_run"
    DOC = "What the run replays: model, target (host:port, one series per target), shard and trace."

    def __init__(self, registry: CollectorRegistry, *, model: str, targets: list[str], shard: str, trace: str) -> None:
        self.rows = [{"model": model, "target": target_address(t), "shard": shard, "trace": trace} for t in targets]
        registry.register(self)

    def collect(self):
        fam = InfoMetricFamily(self.NAME, self.DOC, labels=[])
        for row in self.rows:
            fam.add_metric([], row)
        yield fam

    def describe(self):
        return []
