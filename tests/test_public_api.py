"""The public API (replayer.results): every documented name imports and reads a real results
folder; the flat layout's old module names are gone; the user docs name only the public API."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import replayer.results as api
from replayer.core import RequestResult
from replayer.record import Recorder

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTED = ("SCHEMA", "read_results", "read_samples", "read_summary", "result_files", "summarize", "summarize_files")


def _folder(tmp_path: Path) -> str:
    rec = Recorder(str(tmp_path), flush_rows=2)
    for i in range(5):
        rec.add(
            RequestResult(
                row=i,
                outcome="success",
                input_length=10,
                output_length=2,
                prompt_tokens=10,
                completion_tokens=2,
                due_ns=i,
                sent_ns=i,
                end_ns=i + 10**6,
                ttft_ms=1.0,
                e2e_ms=2.0,
            )
        )
    rec.close()
    return str(tmp_path)


def test_every_documented_name_imports_and_reads_a_results_folder(tmp_path):
    assert set(api.__all__) == set(DOCUMENTED)
    for name in DOCUMENTED:
        assert getattr(api, name) is not None
    folder = _folder(tmp_path)
    table = api.read_results(folder)
    assert table.num_rows == 5 and table.schema.equals(api.SCHEMA, check_metadata=False)
    assert api.result_files(folder) and api.summarize_files(api.result_files(folder))["completed"] == 5
    assert api.summarize(table)["completed"] == 5
    assert api.read_samples(folder) is None  # no scrape: none, not an empty table
    assert api.read_summary(folder) == {}  # (no summary.json: the run wrote none)
    with pytest.raises(AttributeError):
        api.no_such_name  # noqa: B018


def test_the_flat_layouts_old_module_names_are_gone():
    """Nothing was ever released under the flat layout: its names do not import (no hook)."""
    import importlib

    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("replayer.recorder")


def test_the_user_docs_name_only_the_public_api_for_reading_results():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    pattern = re.compile(r"\breplayer(?:\.\w+)+\.(read_results|read_samples|read_summary|summarize_files)\b")
    found = [
        (p.name, m.group(0))
        for p in docs
        for m in pattern.finditer(p.read_text())
        if not m.group(0).startswith("replayer.results.")
    ]
    assert not found, found
