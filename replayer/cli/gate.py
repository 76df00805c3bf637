"""Flags of the regression gate (``replayer compare A B --gate``) and of ``replayer history``;
no logic: ``replayer.results.gateout`` and ``replayer.results.history`` do the work."""

from __future__ import annotations

import argparse
import sys


def add_gate_flags(cp: argparse.ArgumentParser) -> None:
    """``compare``'s gate flags."""
    g = cp.add_argument_group("regression gate (docs/gate.md)")
    g.add_argument(
        "--gate",
        action="store_true",
        help="judge B (the candidate) against A (the baseline), paired by trace position: exit 0 "
        "when it held, 7 when a metric regressed, 2 when the runs cannot be compared (or a bad gate "
        "file), 5 when it held but a --markdown/--junit file could not be written",
    )
    g.add_argument(
        "--gate-file",
        default=None,
        metavar="FILE",
        help="YAML: the gate's metrics, minimum effects, directions and bootstrap settings (implies --gate)",
    )
    g.add_argument(
        "--markdown",
        default=None,
        metavar="FILE",
        help="with --gate: write the verdict as Markdown (a CI job summary), whatever it is; its folders made",
    )
    g.add_argument(
        "--junit",
        default=None,
        metavar="FILE",
        help="with --gate: write JUnit XML, one test case per metric (one in error when not compared); its folders made",
    )


def run_gate(args: argparse.Namespace) -> int | None:
    """The gate's exit code, or None when ``compare`` was not asked for the gate."""
    if not (args.gate or args.gate_file):
        if args.markdown or args.junit:
            print("replayer compare: error: --markdown and --junit need --gate", file=sys.stderr)
            return 2
        return None
    if args.spans:
        print("replayer compare: error: --spans does not go with --gate", file=sys.stderr)
        return 2
    from replayer.results.gateout import main_gate

    return main_gate(args.a, args.b, args.json, args.gate_file, args.markdown, args.junit)


def add_history_parser(sub: argparse._SubParsersAction) -> None:
    """``replayer history DIR...``."""
    hp = sub.add_parser(
        "history",
        help="runs (or a soak's loops) with their headline metrics and verdicts over time: a table and an HTML picture",
        description="List results folders (each DIR a run, or a folder of runs) in time order with "
        "their headline metrics and verdicts; one run of several loops is listed loop by loop. Exit "
        "codes: 0 listed, 2 a DIR that is not a results folder or a damaged summary.json, 5 the --html "
        "page could not be written.",
    )
    hp.add_argument("dirs", nargs="+", metavar="DIR", help="a results folder, or a folder holding results folders")
    hp.add_argument(
        "--html",
        default=None,
        metavar="FILE",
        help="also draw the history as an HTML page (plotly; its folders made; exit 5 when it cannot be written)",
    )
    hp.add_argument("--json", action="store_true", help="print the table as JSON")
    hp.add_argument("--by-run", action="store_true", help="one line per run, even for a run of several loops")


def run_history(args: argparse.Namespace) -> int:
    from replayer.results.history import main_history

    return main_history(args.dirs, args.html, args.json, args.by_run)
