"""The results record owns its columns: ``RequestResult``'s fields declare the Arrow schema and the
docs' column table, and each field's group says who may write it. Birth fields are copied from the
request when the record is made and never assigned after; a measured field is assigned only in the
packages its ``by`` names (an AST scan of every attribute assignment on a result in ``replayer/``)."""

from __future__ import annotations

import ast
import importlib.util
import io
from dataclasses import dataclass, fields
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replayer.core import RequestResult
from replayer.core.result import BIRTH, COLUMNS, EXTRA_COLUMNS, MEASURED, SCHEMA, column_type, to_table

ROOT = Path(__file__).resolve().parents[1]
FIELDS = {f.name: f for f in fields(RequestResult)}
#: where a result is made: its birth fields are the constructor's keywords there (the recorder's is
#: a throw-away record that warms pyarrow's writer up before the run)
BIRTHPLACES = {"replayer/core/request.py", "replayer/payload/prepare.py", "replayer/record/recorder.py"}


def _is_result(node: ast.expr, annotated: set[str]) -> bool:
    """A name that holds a ``RequestResult``: the house's ``res``, or a parameter annotated so."""
    return isinstance(node, ast.Name) and (node.id == "res" or node.id in annotated)


def _assignments(root: Path = ROOT) -> list[tuple[str, str, int, str]]:
    """(package, module path, line, field) of every attribute assignment on a result in
    ``root``/replayer."""
    found = []
    for path in sorted((root / "replayer").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(), rel)
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            args = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
            annotated = {
                a.arg for a in args if a.annotation is not None and "RequestResult" in ast.unparse(a.annotation)
            }
            for node in ast.walk(fn):
                targets = (
                    node.targets
                    if isinstance(node, ast.Assign)
                    else [node.target]
                    if isinstance(node, ast.AugAssign | ast.AnnAssign)
                    else []
                )
                for t in targets:
                    for a in ast.walk(t):
                        if (
                            isinstance(a, ast.Attribute)
                            and isinstance(a.ctx, ast.Store)
                            and _is_result(a.value, annotated)
                        ):
                            found.append((rel.split("/")[1], rel, a.lineno, a.attr))
    return sorted(set(found))


def test_the_schema_is_the_fields_then_the_extra_columns():
    assert COLUMNS == (*FIELDS, *EXTRA_COLUMNS)
    assert SCHEMA.names == list(COLUMNS)
    for name, f in FIELDS.items():
        assert SCHEMA.field(name).type == f.metadata["arrow"]
        assert f.metadata["group"] in (BIRTH, MEASURED), name
        assert f.metadata["doc"].strip(), f"{name} says nothing of what it holds"
        assert (f.metadata["group"] == BIRTH) == (f.metadata["by"] == ()), name
    # a record written and read back keeps every column with its declared type
    buf = io.BytesIO()
    pq.write_table(to_table([RequestResult(row=3, ttft_ms=1.5, itl_ms=[1.0, 2.0])]), buf)
    back = pq.read_table(pa.BufferReader(buf.getvalue()))
    assert back.schema.remove_metadata().equals(SCHEMA)
    assert back.column("ttft_ms").to_pylist() == [1.5]


def test_birth_fields_are_never_assigned_and_measured_ones_only_by_their_packages():
    seen = _assignments()
    packages = {pkg for pkg, *_ in seen}
    # the scan sees the client, the senders, the SLO judge and the run's warm-up marker
    assert {"http", "send", "core", "run"} <= packages, packages
    wrong = []
    for pkg, rel, line, name in seen:
        f = FIELDS.get(name)
        if f is None:
            wrong.append(f"{rel}:{line}: {name} is not a field of RequestResult")
        elif f.metadata["group"] == BIRTH:
            wrong.append(f"{rel}:{line}: {name} is a birth field (copied from the request): set it in new_result")
        elif pkg not in f.metadata["by"]:
            wrong.append(f"{rel}:{line}: {name} is measured by {f.metadata['by']}, not {pkg}")
    assert not wrong, "\n".join(wrong)


def test_results_are_made_only_where_their_birth_fields_come_from():
    makers = set()
    for path in (ROOT / "replayer").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "RequestResult":
                makers.add(path.relative_to(ROOT).as_posix())
    assert makers == BIRTHPLACES


def test_the_scan_catches_an_assignment_outside_the_owners(tmp_path):
    """The rule can fail: a module of another package that writes a measured field is named."""
    bad = tmp_path / "replayer" / "record" / "_scan_probe.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("def f(res):\n    res.ttft_ms = 1.0\n\n\ndef g(x: RequestResult):\n    x.row = 2\n")
    seen = _assignments(tmp_path)
    assert ("record", "replayer/record/_scan_probe.py", 2, "ttft_ms") in seen
    assert ("record", "replayer/record/_scan_probe.py", 6, "row") in seen


def test_the_docs_table_lists_every_column_from_the_fields():
    spec = importlib.util.spec_from_file_location("columns_hook", ROOT / "docs" / "hooks" / "columns.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    table = hook.columns_table()
    rows = table.splitlines()[2:]
    assert [r.split("`")[1] for r in rows] == list(COLUMNS)
    assert "| `queue_wait_ms` | float64 | measured |" in table
    page = (ROOT / "docs" / "reference" / "results.md").read_text()
    assert hook.MARKER in page


def test_a_field_made_without_its_column_is_named_at_import():
    """(a field added the old way, ``x: int = 0``, would have no Arrow type: the import says which)"""

    @dataclass
    class Plain:
        plain: int = 0

    with pytest.raises(TypeError, match=r"RequestResult\.plain declares no column: make it with _birth"):
        column_type(fields(Plain)[0])
