"""The house's rules, kept by a machine: the tree grouped by pipeline stage, imports only
downward and no import circle anywhere (import-linter's contracts in pyproject.toml, type-only
imports included), no type-checking exemption left, and the functions over the complexity and
length limits only ever fewer."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "replayer"
STAGES = {"core", "trace", "plan", "payload", "http", "send", "record", "observe", "results", "config", "run", "cli"}
#: functions marked over the complexity or length limits (noqa C901 / PLR0912 / PLR0915): lower
#: it when one is simplified; never raise it
COMPLEX_FUNCTIONS_MAX = 27


def test_the_tree_is_grouped_by_stage():
    loose = sorted(p.name for p in PKG.iterdir() if p.suffix == ".py")
    assert loose == ["__init__.py", "__main__.py"]
    packages = {p.name for p in PKG.iterdir() if (p / "__init__.py").exists()}
    assert packages == STAGES | {"capture", "sim", "fleet"}


def test_the_layer_contract_holds_and_no_import_circle_exists():
    # (pyproject.toml: the layers contract, and acyclic_siblings over every package of replayer,
    # type-only imports included)
    p = subprocess.run([str(Path(sys.executable).parent / "lint-imports")], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:]
    assert "2 kept, 0 broken" in p.stdout


def test_no_module_is_exempt_from_type_checking():
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert not any(o.get("ignore_errors") for o in mypy.get("overrides", []))
    strict = next(o for o in mypy["overrides"] if o.get("disallow_untyped_defs"))
    assert {"replayer.core.*", "replayer.plan.*", "replayer.http.*", "replayer.send.*"} <= set(strict["module"])


def test_the_functions_over_the_complexity_limits_only_get_fewer():
    marked = [
        (p.relative_to(ROOT), n)
        for p in PKG.rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"noqa:.*\b(C901|PLR0912|PLR0915)\b", line)
    ]
    assert len(marked) <= COMPLEX_FUNCTIONS_MAX, marked


def test_tests_reach_other_packages_through_their_facades(tmp_path):
    """A name a package's facade exports is imported from the package; a private name of
    replayer only by the tests ``facades.REACHES_INSIDE`` names, each with its reason
    (``python tests/facades.py --fix`` rewrites what breaks it)."""
    from facades import violations

    bad = violations()
    assert not bad, "\n".join(bad)
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "from replayer.core.result import RequestResult\nfrom replayer.run.workers import _exit_code\n"
        "from replayer.core.stats import RELATIVE_ACCURACY\n"
    )
    assert [v.split(": ", 1)[1] for v in violations([probe])] == [
        "import RequestResult from replayer.core (its facade), not replayer.core.result",
        "_exit_code is private to replayer.run.workers",
    ]
