"""replayer: trace-replay load generator for LLM inference servers.

Importing the package does nothing beyond defining names (no loop, no registry, no I/O). The
stages live in subpackages (``core``, ``trace``, ``plan``, ``build``, ``http``, ``send``,
``record``, ``observe``, ``results``, ``config``, ``run``, ``cli``; ``capture`` and ``sim``
beside). What users import is ``replayer.results``: results, samples and summaries, a stable API.

The modules of the flat layout before (``replayer.recorder``, ``replayer.target_metrics``, ...)
still import, with a DeprecationWarning naming their new home.
"""

from __future__ import annotations

import sys
import types

# (nothing else at import time: the launcher's child process imports this package first, and
# importlib.abc alone would load pathlib, tempfile and shutil into it)

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
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec

_MOVED_NAMES = {("target_metrics", "read_samples"): "replayer.results"}


class _MovedModules:
    """Imports ``replayer.OLD`` as a module that forwards every name to the new home (warning)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> ModuleSpec | None:
        pkg, _, old = fullname.rpartition(".")
        if pkg != __name__ or old not in _MOVED:
            return None
        import importlib.machinery

        return importlib.machinery.ModuleSpec(fullname, self)  # type: ignore[arg-type]  # (a Loader by its methods: importlib.abc is not imported)

    def create_module(self, spec: ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        import importlib
        import warnings

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
