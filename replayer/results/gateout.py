"""``replayer compare BASELINE CANDIDATE --gate``: read both runs, judge the candidate
(``replayer.results.gate``) and write what a person and a CI system read: the printed table,
``--markdown FILE`` (a CI job summary), ``--junit FILE`` (one test case per metric: a regressed
metric is a failure, a metric not judged is skipped) and ``--json``.

Exit codes: 0 the gate held, ``EXIT_REGRESSED`` a metric regressed, 2 the runs cannot be compared
(different traces, slices or schedules, too few requests, a run that was not faithful to its trace,
a folder that is not a run: the message says which).
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET

from replayer.results.gate import COLUMNS, MetricResult, NotComparable, block_count, judge, overall, pair
from replayer.results.gatespec import GateSpec, default_spec, load_gate_file
from replayer.results.gatestall import client_late

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


def _intro(n: int, gate: GateSpec) -> str:
    return (
        f"{n} requests paired by trace position; {100 * gate.confidence:g}% intervals from a block "
        f"bootstrap ({gate.resamples} resamples of {block_count(n, gate)} blocks, seed {gate.seed}); settings: {gate.source}"
    )


def markdown(results: list[MetricResult], base: str, cand: str, n: int, gate: GateSpec) -> str:
    """The gate as a Markdown section (a CI job summary)."""
    verdict = overall(results)
    lines = [
        f"## replayer gate: {'❌ regressed' if verdict == 'regressed' else '✅ held'}",
        "",
        f"Baseline `{base}`, candidate `{cand}`. {_intro(n, gate)}. A metric regresses when its whole interval "
        "is past its minimum effect in the bad direction.",
        "",
        "| " + " | ".join(HEAD) + " |",
        "| " + " | ".join(["---"] + ["---:"] * (len(HEAD) - 2) + ["---"]) + " |",
    ]
    for r, row in zip(results, rows_of(results)):
        lines.append("| " + " | ".join([*row[:-1], f"{_MARK[r.verdict]} {row[-1]}"]) + " |")
    return "\n".join(lines) + "\n"


def junit(results: list[MetricResult], base: str, cand: str) -> str:
    """The gate as JUnit XML: one test case per metric (regressed: a failure; not judged: skipped)."""
    failures = sum(r.verdict == "regressed" for r in results)
    skipped = sum(r.verdict == "not judged" for r in results)
    suite = ET.Element(
        "testsuite",
        name="replayer gate",
        tests=str(len(results)),
        failures=str(failures),
        skipped=str(skipped),
        errors="0",
    )
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="baseline", value=base)
    ET.SubElement(props, "property", name="candidate", value=cand)
    for r, row in zip(results, rows_of(results)):
        case = ET.SubElement(suite, "testcase", classname="replayer.gate", name=r.spec.name)
        text = f"{r.spec.label}: {row[1]} -> {row[2]}, change {row[3]}, interval {row[4]}, fails past {row[5]}"
        if r.verdict == "regressed":
            ET.SubElement(case, "failure", message=f"{r.spec.label} regressed: {row[3]} {row[4]}").text = text
        elif r.verdict == "not judged":
            ET.SubElement(case, "skipped", message=r.reason)
        else:
            ET.SubElement(case, "system-out").text = f"{r.verdict}: {text}"
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def _read(path: str):
    """A run's results (the gate's columns) and summary; ValueError for a path that is not a run."""
    from replayer.results import read_results, read_summary

    folder = path if os.path.isdir(path) else os.path.dirname(path) if path.endswith("summary.json") else path
    if not os.path.isdir(folder):
        raise ValueError(f"{path}: no such results folder")
    from replayer.record.folder import result_files

    if not result_files(folder):
        raise ValueError(f"{path}: no results files (requests*.parquet): not a results folder")
    t = read_results(folder)
    return t.select([c for c in COLUMNS if c in t.column_names]), read_summary(folder)


def unfaithful(name: str, s: dict, max_lag_ms: float = 25.0) -> str | None:
    """Why run ``name`` (its summary) did not replay its trace faithfully, or None: its
    ``fidelity`` verdict when it has one, else its dispatch lag p99 against ``max_lag_ms`` (a run
    that fell behind measured the load generator's host as much as the server)."""
    fid = s.get("fidelity")
    if isinstance(fid, dict) and fid.get("verdict") == "not_faithful":
        return f"the {name} was not faithful to its trace: {'; '.join(map(str, fid.get('reasons') or [])) or 'see its summary'}"
    lag = s.get("dispatch_lag_p99_ms")
    if not isinstance(fid, dict) and isinstance(lag, (int, float)) and lag > max_lag_ms:
        return f"the {name} fell behind its trace: dispatch lag p99 {lag:.1f} ms (over {max_lag_ms:g} ms)"
    return None


def _slos(gate: GateSpec, sb: dict, sc: dict) -> dict[str, float]:
    from replayer.results.verdict import parse_goodput

    if gate.goodput:
        return parse_goodput(gate.goodput)
    slos = sb.get("goodput_slos_ms") or sc.get("goodput_slos_ms") or {}
    return {k: float(v) for k, v in slos.items()} if isinstance(slos, dict) else {}


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main_gate(
    base: str,
    cand: str,
    as_json: bool = False,
    gate_file: str | None = None,
    markdown_file: str | None = None,
    junit_file: str | None = None,
) -> int:
    """Judge ``cand`` against ``base`` (results folders), print the table (or JSON), write the
    Markdown and JUnit files asked for; the exit code (module docstring)."""
    try:
        gate = load_gate_file(gate_file) if gate_file else default_spec()
        (tb, sb), (tc, sc) = _read(base), _read(cand)
        for key, label in (("speedup", "speed-ups"), ("model", "models")):
            if key in sb and key in sc and sb[key] != sc[key]:
                raise NotComparable(f"different {label}: {sb[key]} in the baseline, {sc[key]} in the candidate")
        slowed = []
        for name, summary in (("baseline", sb), ("candidate", sc)):
            why = unfaithful(name, summary, gate.max_dispatch_lag_ms)
            late = client_late(name, summary, gate.max_dispatch_lag_ms, gate.max_client_lag_ms) if why else None
            if late:  # (judged, its tails not: gatestall)
                slowed.append(late)
                print(f"replayer compare --gate: note: {late}; its tails are not judged", file=sys.stderr)
                continue
            if why and gate.require_faithful:
                raise NotComparable(why + " (require_faithful: false in a gate file compares it all the same)")
            if why:
                print(f"replayer compare --gate: warning: {why}", file=sys.stderr)
        paired = pair(tb, tc)
        results = judge(paired, gate, _slos(gate, sb, sc), "; ".join(slowed) or None)
    except NotComparable as e:
        print(f"replayer compare --gate: cannot compare: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"replayer compare --gate: error: {e}", file=sys.stderr)
        return 2
    verdict = overall(results)
    if markdown_file:
        _write(markdown_file, markdown(results, base, cand, paired.n, gate))
    if junit_file:
        _write(junit_file, junit(results, base, cand))
    if as_json:
        doc = {
            "baseline": base,
            "candidate": cand,
            "verdict": verdict,
            "paired_requests": paired.n,
            "confidence": gate.confidence,
            "resamples": gate.resamples,
            "blocks": block_count(paired.n, gate),
            "seed": gate.seed,
            "settings": gate.source,
            "metrics": [r.as_dict() for r in results],
        }
        print(json.dumps(doc, indent=2))
    else:
        print(f"baseline  = {base}\ncandidate = {cand}\n{_intro(paired.n, gate)}\n")
        print(format_table(results))
        bad = [r.spec.label for r in results if r.verdict == "regressed"]
        print(f"\ngate: {verdict.upper()}" + (f" ({', '.join(bad)})" if bad else ""))
    return EXIT_REGRESSED if verdict == "regressed" else 0
