"""docs/reference/dashboard.md lists every panel of the committed Grafana dashboard with the PromQL
it runs; its table is generated from deploy/grafana/dashboards/replayer.json, so the page cannot
drift from the dashboard. ``REPLAYER_UPDATE_DOCS=1`` rewrites the generated part.

That every one of these expressions parses and returns data from a real Prometheus scraping a
real replay is already checked by tests/test_prometheus_e2e.py
(``test_dashboard_queries_return_data_from_a_live_replay`` runs ``dashboard.expressions`` of the
same JSON): not repeated here.
"""

from __future__ import annotations

import json
import os
import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "deploy" / "grafana"))
import dashboard  # noqa: E402

PAGE = ROOT / "docs" / "reference" / "dashboard.md"
BEGIN = (
    "<!-- BEGIN generated from deploy/grafana/dashboards/replayer.json by tests/test_docs_dashboard.py:"
    " do not edit; REPLAYER_UPDATE_DOCS=1 rewrites it -->"
)
END = "<!-- END generated -->"
#: Grafana's unit ids, as a reader says them
UNITS = {"s": "seconds", "reqps": "requests/s", "percentunit": "ratio, shown as %", "short": "number"}


def _cell(text: str) -> str:
    """A table cell: one line (a pipe inside a code span is kept: Python-Markdown's tables allow it)."""
    return " ".join(text.split())


def render(dash: dict) -> str:
    """The dashboard's panels as Markdown: a heading per row, a table of the row's panels, one line
    per query (the panel's title and unit on its first, then the query's legend and PromQL)."""
    out: list[str] = ["## Variables", "", "| variable | what it chooses | its values |", "| --- | --- | --- |"]
    for v in dash["templating"]["list"]:
        query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        out.append(f"| `${v['name']}` ({_cell(v['label'])}) | {_cell(v['description'])} | `{_cell(query)}` |")
    for a in dash["annotations"]["list"]:
        out += ["", "## Annotations", "", f"**{a['name']}**: `{_cell(a['expr'])}`, each drawn at its value's time"]
        out[-1] += f" (title `{a['titleFormat']}`, tags `{a['tagKeys']}`)."
    header = ["| panel | unit | series | PromQL |", "| --- | --- | --- | --- |"]
    for p in dash["panels"]:
        if p["type"] == "row":
            out += ["", f"## {p['title']}", "", *header]
            continue
        if not any(x.startswith("| panel") for x in out):  # a panel above the first row
            out += ["", *header]
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        first = f"| {_cell(p['title'])} | {UNITS.get(unit, unit) or '–'} |"
        for i, t in enumerate(p.get("targets", [])):
            legend = f"`{_cell(t['legendFormat'])}`" if t.get("legendFormat") else "–"
            out.append(f"{first if i == 0 else '| | |'} {legend} | `{_cell(t['expr'])}` |")
    return "\n".join(out).strip("\n") + "\n"


def _committed() -> dict:
    return json.loads(dashboard.OUT.read_text(encoding="utf-8"))


def test_the_dashboard_page_lists_every_panel_and_query():
    want = render(_committed())
    text = PAGE.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, f"{PAGE.name}: the markers of the generated part are missing"
    head, rest = text.split(BEGIN, 1)
    have, tail = rest.split(END, 1)
    if os.environ.get("REPLAYER_UPDATE_DOCS") == "1" and have.strip("\n") + "\n" != want:
        PAGE.write_text(f"{head}{BEGIN}\n\n{want}\n{END}{tail}", encoding="utf-8")
        have = "\n" + want + "\n"
    assert have.strip("\n") + "\n" == want, (
        f"{PAGE.relative_to(ROOT)} is stale: the dashboard changed; run "
        "REPLAYER_UPDATE_DOCS=1 .venv/bin/python -m pytest -q -n 0 tests/test_docs_dashboard.py"
    )


def test_the_rendering_keeps_every_panel_and_expression():
    """render() itself: every panel title and every PromQL of the dashboard are in its output, one
    table line per query, under the row they belong to."""
    dash = _committed()
    md = render(dash)
    exprs = dashboard.expressions(dash)
    assert len(exprs) >= 30
    lines = [
        x
        for x in md.split("## Annotations", 1)[1].splitlines()
        if x.startswith("| ") and not x.startswith(("| panel |", "| --- |"))
    ]
    assert len(lines) == len(exprs)
    for e in exprs:
        assert f"`{_cell(e)}`" in md, e
    for p in dash["panels"]:
        assert _cell(p["title"]) in md, p["title"]
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    assert [x.removeprefix("## ") for x in md.splitlines() if x.startswith("## ")] == [
        "Variables",
        "Annotations",
        *rows,
    ]
    # a panel sits under the heading of the row above it
    latency = md.split("## Latency\n", 1)[1].split("\n## ", 1)[0]
    assert (
        "| TTFT | seconds |" in latency
        and "histogram_quantile(0.99, sum by (run_id, le) (rate(replayer_ttft_seconds_bucket{" in latency
    )


def test_a_changed_dashboard_makes_the_page_stale():
    dash = _committed()
    changed = json.loads(json.dumps(dash))
    target = next(p for p in changed["panels"] if p.get("targets"))["targets"][0]
    target["expr"] = target["expr"].replace("[1m]", "[5m]")
    assert render(changed) != render(dash)
