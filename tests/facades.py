"""Tests reach a package through its facade (``replayer/<package>/__init__.py``): a name the
facade exports is imported from the package, not from the module that defines it, so a test
keeps passing when a package moves its insides around; and a test imports no private
(underscore) module-level name of ``replayer`` except those in ``REACHES_INSIDE``, each with its
reason. ``tests/test_architecture.py`` holds the rule;
``.venv/bin/python tests/facades.py --fix`` rewrites the imports that break it (then
``ruff check --fix`` and ``ruff format`` sort and wrap them).
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: (test file, module, private name): the tests that reach inside a package, and why
REACHES_INSIDE = {
    # the report's summary table, tested as HTML; results/report.py is being reshaped elsewhere
    # (its split is planned): it gets a public name then
    ("tests/test_report.py", "replayer.results.report", "_summary_table"),
    # the --workers supervisor's pieces, tested one by one without starting workers; run/workers.py
    # is being reshaped into an assembly of its own (issue 44), which names them
    ("tests/test_workers.py", "replayer.run.workers", "_exit_code"),
    ("tests/test_workers.py", "replayer.run.workers", "_progress"),
    ("tests/test_workers.py", "replayer.run.workers", "_without_flag"),
    # the walk of one row follows the row's objects through the stages; the readers' raw columns,
    # private to the trace stage, are the first of them (what the Parquet reader returns)
    ("tests/test_walk.py", "replayer.trace.columns", "_Raw"),
}


def _facade(package: str) -> object | None:
    try:
        return importlib.import_module(f"replayer.{package}")
    except ImportError:
        return None


def _through_facade(module: str, name: str) -> bool:
    """``name`` of ``module`` (``replayer.<package>.<...>``) is the same object its package's
    facade exports under that name."""
    package = module.split(".")[1]
    facade = _facade(package)
    if facade is None or name not in getattr(facade, "__all__", ()):
        return False
    return getattr(facade, name) is getattr(importlib.import_module(module), name, None)


def _imports(tree: ast.AST) -> list[ast.ImportFrom]:
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.level == 0 and (n.module or "").startswith("replayer.")
    ]


def violations(paths: list[Path] | None = None) -> list[str]:
    """Every import in ``paths`` (the test files) that breaks the rule, as ``file:line: why``."""
    found = []
    for path in paths if paths is not None else sorted((ROOT / "tests").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        for node in _imports(ast.parse(path.read_text(), rel)):
            module = node.module or ""
            for alias in node.names:
                name = alias.name
                if name.startswith("_") and not name.startswith("__"):
                    if (rel, module, name) not in REACHES_INSIDE:
                        found.append(f"{rel}:{node.lineno}: {name} is private to {module}")
                elif module.count(".") >= 2 and _through_facade(module, name):
                    package = ".".join(module.split(".")[:2])
                    found.append(f"{rel}:{node.lineno}: import {name} from {package} (its facade), not {module}")
    return found


def fix(path: Path) -> bool:
    """Rewrite ``path``'s imports of facade names to go through the facade; True if it changed."""
    lines = path.read_text().splitlines(keepends=True)
    changed = False
    for node in sorted(_imports(ast.parse("".join(lines))), key=lambda n: n.lineno, reverse=True):
        module = node.module or ""
        if module.count(".") < 2:
            continue
        outer = [a for a in node.names if not a.name.startswith("_") and _through_facade(module, a.name)]
        if not outer:
            continue
        inner = [a for a in node.names if a not in outer]
        last = lines[node.end_lineno - 1]
        comment = last[node.end_col_offset :].rstrip("\n").strip()
        indent = " " * node.col_offset
        tail = f"  {comment}" if comment else ""

        def names(aliases: list[ast.alias]) -> str:
            return ", ".join(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in aliases)

        new = [f"{indent}from {'.'.join(module.split('.')[:2])} import {names(outer)}{tail}\n"]
        if inner:
            new.append(f"{indent}from {module} import {names(inner)}{tail}\n")
        lines[node.lineno - 1 : node.end_lineno] = new
        changed = True
    if changed:
        path.write_text("".join(lines))
    return changed


if __name__ == "__main__":
    if sys.argv[1:] != ["--fix"]:
        print("\n".join(violations()) or "no test reaches past a facade")
        sys.exit(0)
    for p in sorted((ROOT / "tests").rglob("*.py")):
        if fix(p):
            print(f"rewrote {p.relative_to(ROOT)}")
