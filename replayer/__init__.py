"""replayer: trace-replay load generator for LLM inference servers.

Importing the package does nothing beyond defining names (no loop, no registry, no I/O). The
stages live in subpackages (``core``, ``trace``, ``plan``, ``build``, ``http``, ``send``,
``record``, ``observe``, ``results``, ``config``, ``run``, ``cli``; ``capture`` and ``sim``
beside). What users import is ``replayer.results``: results, samples and summaries, a stable API.

The modules of the flat layout before (``replayer.recorder``, ``replayer.target_metrics``, ...)
still import, with a DeprecationWarning naming their new home.
"""

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

__version__ = "0.1.0"

#: old module (``replayer.NAME``) -> its home now (``replayer.NEW``)
_MOVED = dict(
    pair.split("=")
    for pair in (
        "admin=observe.admin audit=http.audit background=core.background chunks=http.chunks "
        "client=http.client clients=run.clients clock=core.clock compare=results.compare "
        "config=config.model configchecks=config.checks configload=config.load connection=http.connection "
        "console=observe.console daemon=run.daemon dispatcher=send.dispatcher errors=core.errors "
        "feed=send.feed gcpacer=run.gcpacer groupmetrics=observe.groupmetrics hashing=core.hashing "
        "image_tokens=build.image_tokens imageprefetch=build.imageprefetch imagerows=build.imagerows "
        "images=build.images imagestats=results.imagestats launcher=http.launcher "
        "launchproc=http.launchproc logs=observe.logs looplag=observe.looplag "
        "loopprompts=build.loopprompts measure=http.measure merge=results.merge "
        "metricparts=observe.metricparts metrics=observe.metrics payload=build.payload "
        "planner=plan.planner pool=http.pool prefix_cache=build.prefix_cache prepare=build.prepare "
        "prompts=build.prompts readiness=run.readiness recorder=record.recorder report=results.report "
        "reportdata=results.reportdata result=core.result resume=run.resume retention=record.retention "
        "rolling=record.rolling routing=send.routing runinputs=run.runinputs runspans=record.runspans "
        "runstate=run.runstate runsummary=run.runsummary schedule=plan.schedule "
        "selfwatch=observe.selfwatch sender=send.sender servertimings=http.servertimings "
        "sessionkeys=build.sessionkeys sessions=plan.sessions simproc=run.simproc sse=http.sse "
        "stats=core.stats summary=results.summary summarytext=results.summarytext sweep=run.sweep "
        "sweepreport=results.sweepreport synth=trace.synth target_metrics=observe.target_metrics "
        "target_samples=observe.target_samples target_series=observe.target_series "
        "targets=results.targets tenants=results.tenants textprefetch=build.textprefetch "
        "timestamps=core.timestamps tracecli=cli.trace traceinspect=results.traceinspect "
        "tracetools=trace.tools verdict=results.verdict workers=run.workers "
    ).split()
)
#: names an old module was documented with that live elsewhere now
_MOVED_NAMES = {("target_metrics", "read_samples"): "replayer.results"}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``replayer.OLD`` as a module that forwards every name to the new home (warning)."""

    def find_spec(
        self, fullname: str, path: object = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        pkg, _, old = fullname.rpartition(".")
        if pkg != __name__ or old not in _MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        old = module.__name__.rpartition(".")[2]
        new = f"{__name__}.{_MOVED[old]}"
        warnings.warn(
            f"{module.__name__} moved to {new}; read results through replayer.results", DeprecationWarning, stacklevel=2
        )
        target = importlib.import_module(new)

        def __getattr__(name: str) -> object:
            home = _MOVED_NAMES.get((old, name))
            return getattr(importlib.import_module(home) if home else target, name)

        module.__getattr__ = __getattr__  # type: ignore[method-assign]
        module.__doc__ = f"Deprecated: {new}."


sys.meta_path.append(_MovedModules())
