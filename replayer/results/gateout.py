"""``replayer compare BASELINE CANDIDATE --gate``: read both runs (``replayer.results.gateread``),
judge the candidate (``replayer.results.gate``) and write what a person and a CI system read: the
printed table, ``--markdown FILE`` (a CI job summary), ``--junit FILE`` (one test case per metric:
a regressed metric is a failure, a metric not judged is skipped) and ``--json``. Every output is
written whatever the verdict, "not compared" included (a CI step that appends the summary or
uploads the JUnit finds this run's, never a stale one), and each carries the gate's warnings.

Exit codes: 0 the gate held, ``EXIT_REGRESSED`` a metric regressed, 2 the runs cannot be compared
(different traces, slices or schedules, too few requests, a run that was not faithful to its trace,
a folder that is not a run or a damaged one, a bad gate file: the message says which), and
``EXIT_WRITE_FAILED`` (5) when the gate held but an output asked for could not be written.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from replayer.results.gate import MetricResult, NotComparable, block_count, judge, overall
from replayer.results.gateread import (
    bounds_text,
    read_inputs,
    unfaithful as unfaithful,  # (bench/bench_gate.py imports it from here)
)
from replayer.results.gatespec import GateSpec, default_spec, load_gate_file
from replayer.results.outfile import EXIT_WRITE_FAILED, OutputError, write_text

#: ``replayer compare --gate``'s exit code when the candidate regressed
EXIT_REGRESSED = 7
_MARK = {"regressed": "✗", "improved": "✓", "held": "=", "not judged": "·"}


def _value(r: MetricResult, v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:,.2f} ms" if r.spec.relative else f"{100 * v:.2f}%"


def _unit(r: MetricResult) -> str:
    return "%" if r.spec.relative else " pp"


def _change(r: MetricResult) -> str:
    return "n/a" if r.change is None else f"{r.change:+.1f}{_unit(r)}"


def _ci(r: MetricResult) -> str:
    return "n/a" if r.low is None else f"[{r.low:+.1f}, {r.high:+.1f}]{_unit(r)}"


def _bound(r: MetricResult) -> str:
    s = r.spec
    sign = "+" if s.direction == "lower" else "-"
    return f"{sign}{s.min_effect:g}{_unit(r)}"


def rows_of(results: list[MetricResult]) -> list[tuple[str, ...]]:
    """The table's rows: metric, baseline, candidate, change, interval, regressed beyond, verdict."""
    return [
        (
            r.spec.label,
            _value(r, r.baseline),
            _value(r, r.candidate),
            _change(r),
            _ci(r),
            _bound(r),
            r.verdict + (f" ({r.reason})" if r.reason else ""),
        )
        for r in results
    ]


HEAD = ("metric", "baseline", "candidate", "change", "interval", "fails past", "verdict")


def format_table(results: list[MetricResult]) -> str:
    table = [HEAD, *rows_of(results)]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEAD) - 1)]
    lines = []
    for n, row in enumerate(table):
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join([*cells, row[-1]]))
        if n == 0:
            lines.append("  ".join("-" * w for w in [*widths, len("verdict")]))
    return "\n".join(lines)


@dataclass
class Outcome:
    """What the gate found: its verdict (``held``, ``regressed`` or ``not_compared``, then with
    ``reason``), the metrics' results, the paired requests, the settings, the goodput bounds
    both runs were judged by and where from, and the warnings every output carries."""

    verdict: str
    gate: GateSpec | None = None
    results: list[MetricResult] = field(default_factory=list)
    n: int = 0
    reason: str = ""
    slos: dict[str, float] = field(default_factory=dict)
    slos_from: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return {"held": 0, "regressed": EXIT_REGRESSED}.get(self.verdict, 2)


def _intro(n: int, gate: GateSpec) -> str:
    return (
        f"{n} requests paired by trace position; {100 * gate.confidence:g}% intervals from a block "
        f"bootstrap ({gate.resamples} resamples of {block_count(n, gate)} blocks, seed {gate.seed}); settings: {gate.source}"
    )


def _goodput_line(o: Outcome) -> str:
    if not o.slos:
        return "goodput: no SLO bounds, not judged"
    return f"goodput judged by {bounds_text(o.slos)} (ms) in both runs, from {o.slos_from}"


def markdown(o: Outcome, base: str, cand: str) -> str:
    """The gate as a Markdown section (a CI job summary)."""
    title = {"regressed": "❌ regressed", "held": "✅ held"}.get(o.verdict, "⚠️ not compared")
    lines = [f"## replayer gate: {title}", ""]
    if o.verdict == "not_compared":
        lines += [f"Baseline `{base}`, candidate `{cand}`: **not compared** (exit code 2): {o.reason}.", ""]
    lines += [f"> ⚠️ **warning:** {w}" for w in o.warnings]
    if o.verdict == "not_compared" or o.gate is None:
        return "\n".join(lines).rstrip() + "\n"
    lines += [
        *([""] if o.warnings else []),
        f"Baseline `{base}`, candidate `{cand}`. {_intro(o.n, o.gate)}; {_goodput_line(o)}. A metric regresses "
        "when its whole interval is past its minimum effect in the bad direction.",
        "",
        "| " + " | ".join(HEAD) + " |",
        "| " + " | ".join(["---"] + ["---:"] * (len(HEAD) - 2) + ["---"]) + " |",
    ]
    for r, row in zip(o.results, rows_of(o.results)):
        lines.append("| " + " | ".join([*row[:-1], f"{_MARK[r.verdict]} {row[-1]}"]) + " |")
    return "\n".join(lines) + "\n"


def junit(o: Outcome, base: str, cand: str) -> str:
    """The gate as JUnit XML: one test case per metric (regressed: a failure; not judged:
    skipped), or, not compared, one test case ``comparison`` in error naming why; the warnings
    as properties and the suite's ``system-err``."""
    results = o.results
    suite = ET.Element(
        "testsuite",
        name="replayer gate",
        tests=str(len(results) or 1),
        failures=str(sum(r.verdict == "regressed" for r in results)),
        skipped=str(sum(r.verdict == "not judged" for r in results)),
        errors="1" if o.verdict == "not_compared" else "0",
    )
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="baseline", value=base)
    ET.SubElement(props, "property", name="candidate", value=cand)
    ET.SubElement(props, "property", name="verdict", value=o.verdict)
    if o.verdict != "not_compared":
        ET.SubElement(props, "property", name="goodput", value=_goodput_line(o))
    for w in o.warnings:
        ET.SubElement(props, "property", name="warning", value=w)
    if o.verdict == "not_compared":
        case = ET.SubElement(suite, "testcase", classname="replayer.gate", name="comparison")
        ET.SubElement(
            case, "error", message=f"not compared: {o.reason}"
        ).text = f"baseline {base}, candidate {cand}: not compared (exit code 2): {o.reason}"
    for r, row in zip(results, rows_of(results)):
        case = ET.SubElement(suite, "testcase", classname="replayer.gate", name=r.spec.name)
        text = f"{r.spec.label}: {row[1]} -> {row[2]}, change {row[3]}, interval {row[4]}, fails past {row[5]}"
        if r.verdict == "regressed":
            ET.SubElement(case, "failure", message=f"{r.spec.label} regressed: {row[3]} {row[4]}").text = text
        elif r.verdict == "not judged":
            ET.SubElement(case, "skipped", message=r.reason)
        else:
            ET.SubElement(case, "system-out").text = f"{r.verdict}: {text}"
    if o.warnings:
        ET.SubElement(suite, "system-err").text = "\n".join(f"warning: {w}" for w in o.warnings)
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def json_doc(o: Outcome, base: str, cand: str) -> dict:
    """The gate as ``--json`` prints it (``verdict`` ``not_compared`` with its ``reason``, no
    metrics, when the runs were not compared)."""
    doc: dict = {"baseline": base, "candidate": cand, "verdict": o.verdict}
    if o.verdict == "not_compared":
        return {**doc, "reason": o.reason, "warnings": o.warnings, "metrics": []}
    assert o.gate is not None
    return {
        **doc,
        "warnings": o.warnings,
        "paired_requests": o.n,
        "confidence": o.gate.confidence,
        "resamples": o.gate.resamples,
        "blocks": block_count(o.n, o.gate),
        "seed": o.gate.seed,
        "settings": o.gate.source,
        "goodput_slos_ms": o.slos or None,
        "goodput_slos_from": o.slos_from,
        "metrics": [r.as_dict() for r in o.results],
    }


def text(o: Outcome, base: str, cand: str) -> str:
    """The gate as printed (stdout) when the runs were compared."""
    assert o.gate is not None
    bad = [r.spec.label for r in o.results if r.verdict == "regressed"]
    return (
        f"baseline  = {base}\ncandidate = {cand}\n{_intro(o.n, o.gate)}\n{_goodput_line(o)}\n\n"
        f"{format_table(o.results)}\n\ngate: {o.verdict.upper()}" + (f" ({', '.join(bad)})" if bad else "")
    )


def evaluate(base: str, cand: str, gate_file: str | None = None) -> Outcome:
    """The gate's outcome for ``cand`` against ``base``; the reason of one not compared (bad
    gate file, a path that is not a readable run, runs that cannot be compared) in it."""
    gate = None
    warnings: list[str] = []
    try:
        gate = load_gate_file(gate_file) if gate_file else default_spec()
        inputs = read_inputs(base, cand, gate, warnings)
        results = judge(inputs.paired, gate, inputs.slos, "; ".join(inputs.slowed) or None)
    except (NotComparable, OSError, ValueError) as e:
        return Outcome("not_compared", gate, reason=str(e), warnings=warnings)
    return Outcome(overall(results), gate, results, inputs.paired.n, "", inputs.slos, inputs.slos_from, inputs.warnings)


def main_gate(
    base: str,
    cand: str,
    as_json: bool = False,
    gate_file: str | None = None,
    markdown_file: str | None = None,
    junit_file: str | None = None,
) -> int:
    """Judge ``cand`` against ``base`` (results folders), print the table (or JSON), write the
    Markdown and JUnit files asked for, whatever the verdict; the exit code (module docstring)."""
    o = evaluate(base, cand, gate_file)
    for w in o.warnings:
        print(f"replayer compare --gate: warning: {w}", file=sys.stderr)
    if o.verdict == "not_compared":
        print(f"replayer compare --gate: cannot compare: {o.reason}", file=sys.stderr)
    if as_json:
        print(json.dumps(json_doc(o, base, cand), indent=2))
    elif o.verdict != "not_compared":
        print(text(o, base, cand))
    failed = False
    for path, what, render in ((markdown_file, "Markdown", markdown), (junit_file, "JUnit XML", junit)):
        if not path:
            continue
        try:
            write_text(path, render(o, base, cand), what)
        except OutputError as e:
            print(f"replayer compare --gate: error: {e}", file=sys.stderr)
            failed = True
    return EXIT_WRITE_FAILED if failed and o.exit_code == 0 else o.exit_code
