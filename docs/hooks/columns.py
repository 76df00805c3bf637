"""MkDocs hook: the results reference's column table, generated from ``RequestResult``.

Each field of ``replayer.core.result.RequestResult`` declares its Arrow type, its group (copied
from the request at birth, or measured) and what it holds; ``EXTRA_COLUMNS`` adds the columns
written beside the fields. The marker ``<!-- results-columns -->`` in
``docs/reference/results.md`` becomes one table row per column, in the files' column order, so
the page lists exactly the columns a results file has: a new column is documented where it is
declared, and the page cannot go stale.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pyarrow as pa

from replayer.core.result import EXTRA_COLUMNS, RequestResult

MARKER = "<!-- results-columns -->"
PAGE = "reference/results.md"


_NAMES = {"double": "float64", "float": "float32"}  # (pyarrow prints the C names)


def _type(t: pa.DataType) -> str:
    if pa.types.is_list(t):
        return f"list of {_type(t.value_type)}"
    return _NAMES.get(str(t), str(t))


def columns_table() -> str:
    """The Markdown table of every results column: name, Arrow type, group, what it holds."""
    rows = ["| column | type | group | what it holds |", "| --- | --- | --- | --- |"]
    for f in fields(RequestResult):
        m = f.metadata
        rows.append(f"| `{f.name}` | {_type(m['arrow'])} | {m['group']} | {m['doc']} |")
    for name, (t, doc) in EXTRA_COLUMNS.items():
        rows.append(f"| `{name}` | {_type(t)} | measured | {doc} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise SystemExit(f"docs columns hook: {PAGE} lost its {MARKER} marker")
    return markdown.replace(MARKER, columns_table())
