"""The report's OpenTelemetry part (``replayer report --spans FILE``): where each request's time
went, from replayer's spans joined with the server's (``replayer.results.spanjoin``), as a figure
spec, an HTML section and a CSV."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd

from replayer.results.reportparts import number
from replayer.results.spanjoin import PARTS, SpanSplit


def span_specs(split: SpanSplit) -> list[dict]:
    """Figure specs (as ``figure_specs``) of the spans' split: each TTFT part's mean per
    send-time bin (the requests joined with their server span)."""
    t = split.over_time()
    if not len(t["x"]):
        return []
    x = np.asarray(t["x"], dtype=np.float64)
    series = []
    for part in PARTS[:4]:
        y = np.asarray([np.nan if v is None else v for v in t[part]], dtype=np.float64)
        series.append({"name": part.removesuffix("_s"), "mode": "lines+markers", "line_shape": "hv", "x": x, "y": y})
    return [
        {
            "title": "Where the TTFT went (spans joined with the server's): mean per send-time bin",
            "x_title": "send time (s since the first request)",
            "y_title": "seconds",
            "x_type": "linear",
            "y_type": "linear",
            "series": series,
        }
    ]


def spans_section(split: SpanSplit) -> str:
    """The split's distributions and the requests without a server span, as HTML."""
    dist = split.distributions()
    head = "<tr><th>part</th><th>count</th><th>mean</th><th>p50</th><th>p90</th><th>p99</th><th>max</th></tr>"
    cells = "".join(
        f"<tr><td>{html.escape(part)}</td>"
        + "".join(f"<td>{number(d[k])}</td>" for k in ("count", "mean", "p50", "p90", "p99", "max"))
        + "</tr>"
        for part, d in dist.items()
    )
    missing = split.missing
    listed = ", ".join(html.escape(str(m["x_request_id"] or m["row"])) for m in missing[:50])
    more = f" (and {len(missing) - 50:,} more)" if len(missing) > 50 else ""
    return (
        "<section class='spans'><h2>Where the time went (OpenTelemetry spans)</h2>"
        f"<p>{len(split.rows):,} requests traced; {len(split.rows) - len(missing):,} joined with their server span; "
        f"{len(missing):,} without one{': ' + listed + more if missing else ''}.</p>"
        "<p>TTFT = network and front end (client TTFT − server TTFT) + queue + the server's other steps + "
        "prefill; decode and the E2E's network tail follow. Seconds.</p>"
        f"<table class='summary'>{head}{cells}</table></section>"
    )


def write_split_csv(split: SpanSplit, path: str) -> None:
    """The split per request as CSV (one row per traced request; empty cells: unknown)."""
    pd.DataFrame(split.rows).to_csv(path, index=False)
