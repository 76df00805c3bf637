"""The ``replayer`` parser: every subcommand's flags (``build_parser``; the run settings come
from ``cli.flags``), the subcommands of a parser, and the unknown-flag errors that name the closest
flag of the subcommand typed.
"""

from __future__ import annotations

import argparse
import sys

from replayer.cli.flags import add_config_flags, add_help_flags, join_pairs
from replayer.cli.gate import add_gate_flags, add_history_parser
from replayer.core.ports import port_number

__all__ = ["FLAG_HINT_CUTOFF", "build_parser", "subcommands", "unrecognized"]


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that reads ``--goodput``'s pairs as ``join_pairs`` says."""

    def parse_known_args(self, args=None, namespace=None):
        return super().parse_known_args(join_pairs(list(sys.argv[1:] if args is None else args)), namespace)


def build_parser() -> argparse.ArgumentParser:
    """replayer's parser: one subcommand per verb, in the order ``--help`` lists them."""
    p = _Parser(
        prog="replayer",
        allow_abbrev=False,
        description="Replay LLM serving traces against OpenAI-compatible servers, open-loop and token-exact.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    _add_run_parser(sub)
    sub.add_parser("sim", help="run the simulated OpenAI-compatible server (see `replayer sim --help`)", add_help=False)
    from replayer.cli.trace import add_trace_parser

    add_trace_parser(sub)
    from replayer.capture.recordflags import add_record_parser

    add_record_parser(sub)
    _add_merge_parser(sub)
    _add_coordinate_parser(sub)
    _add_report_parser(sub)
    _add_sweep_parser(sub)
    _add_compare_parser(sub)
    add_history_parser(sub)
    _add_tls_certs_parser(sub)
    sub.add_parser("version", help="print the version")
    _finish_parsers(p)
    return p


def _add_run_parser(sub) -> None:
    """``replayer run``: a replay; its flags generated from the run settings (``add_config_flags``)."""
    run = sub.add_parser(
        "run",
        add_help=False,
        help="replay a trace (against the embedded simulator if no --target)",
        usage="%(prog)s [options] [trace ...]",
        description="Replay a trace. Settings come from --config FILE (YAML; keys are "
        "the setting names: the flag without '--', dashes as underscores, and '_s' "
        "appended for settings in seconds, e.g. read_timeout_s) and are overridden by flags.",
    )
    add_help_flags(run)
    run.add_argument(
        "--config",
        dest="config_file",
        default=None,
        metavar="FILE",
        help="YAML file of settings (see configs/); flags override it",
    )
    add_config_flags(run)


def _add_merge_parser(sub) -> None:
    """``replayer merge``: the results folders of shards or workers as one run."""
    mg = sub.add_parser("merge", help="merge the results folders of shards or workers into one summary")
    mg.add_argument("dirs", nargs="+", help="results folders")
    mg.add_argument(
        "-o", "--output", default=None, help="folder for the merged summary.json [default: none: print it only]"
    )
    mg.add_argument(
        "--wait",
        type=float,
        default=None,
        metavar="S",
        help="first wait up to S seconds for every folder's run to end by itself (a "
        "summary.json that was not cut short by a stop), e.g. in a Kubernetes merge Job",
    )


def _add_coordinate_parser(sub) -> None:
    """``replayer coordinate``: a fleet's start barrier, clock and live view."""
    co = sub.add_parser(
        "coordinate",
        help="one start and one clock for a fleet of shards (replayer run --shard I/N --coordinator URL)",
        description="Serve the fleet's start barrier, clock and live view until every shard has ended; "
        "then write OUTPUT/fleet.json and merge the shards' folders when readable here. Exit 0 when "
        "every shard ended and the merge is one whole run, 1 otherwise.",
    )
    co.add_argument("--shards", type=int, required=True, metavar="N", help="how many shards make the fleet")
    co.add_argument("--host", default="127.0.0.1", help="address to listen on [default: 127.0.0.1]")
    co.add_argument(
        "--port", type=port_number, default=9500, help="port to listen on (0 = a free port) [default: 9500]"
    )
    co.add_argument(
        "--ready-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="start without the shards not ready by then (named; they join in step later) [default: 120]",
    )
    co.add_argument(
        "--start-margin",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="the start is set this far ahead once every shard is ready [default: 2]",
    )
    co.add_argument(
        "--lost-after",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="a shard not heard from for this long is marked lost (and running again when heard) [default: 10]",
    )
    co.add_argument(
        "--give-up-after",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="the fleet ends without a shard lost (or never come) for this long [default: 600]",
    )
    co.add_argument("-o", "--output", default=None, help="folder for fleet.json and merged/ [default: none: log only]")


def _add_report_parser(sub) -> None:
    """``replayer report``: a results folder's HTML report."""
    rp = sub.add_parser("report", help="write a self-contained HTML report (plots) of a results folder")
    rp.add_argument("results", help="results folder (holds requests.parquet)")
    rp.add_argument("-o", "--output", default=None, help="output .html [default: RESULTS/report.html]")
    rp.add_argument(
        "--spans",
        default=None,
        metavar="FILE",
        help="OpenTelemetry spans of the run (OTLP JSON lines, as the Collector's file exporter writes "
        "them): each request's TTFT split into network and front end, queue, prefill, its E2E into decode, "
        "joined with the server's llm_request spans (also written per request to OUTPUT's .spans.csv)",
    )


def _add_sweep_parser(sub) -> None:
    """``replayer sweep``: a trace at growing speed-ups, with every run flag."""
    sw = sub.add_parser(
        "sweep",
        add_help=False,
        help="replay a trace at growing speed-ups until the SLO attainment drops; finds the highest load that held",
        usage="%(prog)s --speedups LIST --goodput KEY:VALUE... [run options] [trace]",
        description="Replay a trace (or a window: --max-requests, --duration) at each speed-up "
        "of --speedups in turn, one results folder per point under --results, and stop after "
        "the first point that did not hold: over its steady window, SLO attainment (--goodput) "
        "below --min-attainment, less than 90% of the offered rate achieved, or a window "
        "shorter than the median E2E. Writes "
        "sweep.json and sweep.html there. Every option of `replayer run` applies to each point, "
        "except --speedup, --seed (salted per point with --prefix-cache salt) and --resume.",
    )
    add_help_flags(sw)
    sw.add_argument(
        "--config",
        dest="config_file",
        default=None,
        metavar="FILE",
        help="YAML file of run settings (see configs/) and of the sweep's own (speedups, "
        "min_attainment, prefix_cache, max_dispatch_lag); flags override it",
    )
    sw.add_argument(
        "--speedups",
        default=None,
        metavar="LIST",
        help="speed-ups to replay at, in increasing order, e.g. 1,2,4,8,16 (at most 32); "
        "required here or as speedups: in the --config file",
    )
    sw.add_argument(
        "--min-attainment",
        type=float,
        default=None,
        metavar="F",
        help="a point holds when, over its steady window (a warm-up and a cool-down left out), at "
        "least this fraction of its judged requests met every --goodput bound and the server "
        "completed at least 0.9 of the requests offered in it [default: 0.9]",
    )
    sw.add_argument(
        "--prefix-cache",
        choices=("salt", "reset", "warm"),
        default=None,
        help="keep points from sharing prefix-cache hits: salt = fresh prompt prefixes per point; "
        "reset = the same prompts, POST /reset_prefix_cache to the target before each point "
        "(vLLM in dev mode, the simulator); warm = neither [default: salt]",
    )
    sw.add_argument(
        "--max-dispatch-lag",
        type=float,
        default=None,
        metavar="MS",
        help="a point whose dispatch lag p99 is above this is marked replayer_behind (the replayer, "
        "not the server, fell behind) and ends the sweep [default: the lag past which a run "
        "warns that the replayer itself is the bottleneck: 50 ms]",
    )
    add_config_flags(sw)


def _add_compare_parser(sub) -> None:
    """``replayer compare``: two runs side by side, and the regression gate (``--gate``)."""
    cp = sub.add_parser("compare", help="compare two runs' summary.json side by side")
    cp.add_argument("a", help="results folder or summary.json of run A")
    cp.add_argument("b", help="results folder or summary.json of run B")
    cp.add_argument("--json", action="store_true", help="print the comparison as JSON")
    cp.add_argument(
        "--spans",
        nargs="+",
        default=None,
        metavar="FILE",
        help="OpenTelemetry spans (OTLP JSON lines; one file holding both runs, or A's then B's): the "
        "TTFT and E2E split (network and front end, queue, prefill, decode) p50/p99 of both runs",
    )
    add_gate_flags(cp)  # (issue 45: the regression gate, and history)


def _add_tls_certs_parser(sub) -> None:
    """``replayer tls-certs``: throw-away certificates for TLS trials and tests."""
    tc = sub.add_parser(
        "tls-certs",
        help="write a throw-away CA and server and client certificates (PEM) for a TLS simulator and tests",
        description="Write ca.pem, server.pem, server.key, client.pem and client.key into FOLDER: a new "
        "private CA and certificates it signed, for `replayer sim --tls-cert` and `replayer run "
        "--ca-bundle`. Throw-away material for tests and trials, never for production.",
    )
    tc.add_argument("folder", help="where to write the files (created)")
    tc.add_argument(
        "--name",
        action="append",
        default=None,
        help="a DNS name or IP address the server certificate is for (repeat) [default: localhost, 127.0.0.1, ::1]",
    )
    tc.add_argument("--days", type=float, default=30.0, help="validity in days [default: 30]")
    tc.add_argument("--expired", action="store_true", help="certificates that ended an hour ago (to see that error)")


def subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``p``'s subcommands: name -> parser."""
    return {name: c for a in p._actions if isinstance(a, argparse._SubParsersAction) for name, c in a.choices.items()}  # noqa: SLF001


def _finish_parsers(p: argparse.ArgumentParser) -> None:
    """Every subcommand's parser records itself as ``_leaf`` in the namespace (the innermost
    one wins), so an unknown flag is reported with that subcommand's usage, not the top level's;
    and none accepts abbreviations (``--max-request`` is an unknown flag, not ``--max-requests``:
    an abbreviation that works today breaks when a flag with the same prefix is added)."""
    for sp in subcommands(p).values():
        sp.allow_abbrev = False
        sp.set_defaults(_leaf=sp)
        _finish_parsers(sp)


#: How alike an unknown flag and a real one must be (``difflib`` ratio of the names without their
#: dashes) for "did you mean": ``--speedupp`` -> ``--speedup`` (0.93), but ``--foo`` gets no
#: ``--loop`` (0.57).
FLAG_HINT_CUTOFF = 0.7


def _closest_flag(arg: str, flags: list[str]) -> str | None:
    """The flag of ``flags`` closest to ``arg`` (``--name`` or ``--name=value``), or None: the one
    flag ``arg`` abbreviates if there is one, else the closest name within ``FLAG_HINT_CUTOFF``."""
    import difflib

    names = {f.lstrip("-"): f for f in flags}
    typed = arg.split("=", 1)[0].lstrip("-")
    longer = [n for n in names if n.startswith(typed)] if typed else []
    if len(longer) == 1:
        return names[longer[0]]
    close = difflib.get_close_matches(typed, list(names), n=1, cutoff=FLAG_HINT_CUTOFF)
    return names[close[0]] if close else None


def unrecognized(p: argparse.ArgumentParser, extra: list[str]) -> None:
    """Exit 2 with ``p``'s usage, naming the unknown arguments and the closest flags of ``p``."""
    flags = [o for a in p._actions for o in a.option_strings if a.help != argparse.SUPPRESS]  # noqa: SLF001
    hints = [c for c in (_closest_flag(arg, flags) for arg in extra if arg.startswith("-")) if c]
    msg = "unrecognized arguments: " + " ".join(extra)
    if hints:
        msg += "; did you mean " + ", ".join(hints) + "?"
    p.error(msg)
