"""Command line: parse flags into a RunConfig and call the right entry point; no logic here.

Every ``RunConfig`` field has exactly one flag, derived from the field (``duration_s`` ->
``--duration``, units in the help), so the CLI and the config cannot drift apart.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import types
import typing

from replayer.cli.gate import add_gate_flags, add_history_parser, run_gate, run_history
from replayer.config.model import SYNTHETIC_LOAD, ConfigError, RunConfig, flag_name, load_config

# NumPy's OpenBLAS starts one spinning thread per core at import; the replayer does no linear
# algebra, and on a small host those threads cost ~0.3 s of CPU per start (set before numpy loads).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

POSITIONAL = ("trace",)
#: list settings given one value per flag, the flag repeated (``--target A --target B``)
REPEATED = ("target",)


#: a ``--goodput`` pair, or several joined by commas: ``ttft:2000``, ``ttft:2000,tpot:50`` (a
#: lower-case key, no ``/`` after the colon: ``s3://...`` and ``dir/t.parquet`` are not pairs)
_PAIRS = re.compile(r"[a-z0-9_]+:[^/,\s]*(,[a-z0-9_]+:[^/,\s]*)*,?")
#: the flags that take ``KEY:VALUE`` pairs
PAIR_FLAGS = ("--goodput",)


def join_pairs(argv: list[str]) -> list[str]:
    """``argv`` with the pairs after each ``--goodput`` (vllm bench serve's ``--goodput ttft:2000
    tpot:50``) joined into one value, ``--goodput=ttft:2000,tpot:50``: the pairs end at the first
    argument that is not one, so a trace path may follow them (argparse's ``nargs='+'`` would take
    it as one more pair). Nothing after ``--`` changes; a ``--`` at the end is dropped."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":  # (one at the end separates nothing: argparse would call it unrecognized)
            return out + argv[i:] if i + 1 < len(argv) else out
        flag, eq, first = a.partition("=")
        if flag in PAIR_FLAGS:
            pairs = [first] if eq else []
            while i + 1 < len(argv) and _PAIRS.fullmatch(argv[i + 1]):
                pairs.append(argv[i + 1])
                i += 1
            out.append(f"{flag}={','.join(p.strip(',') for p in pairs)}" if pairs else a)
        else:
            out.append(a)
        i += 1
    return out


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that reads ``--goodput``'s pairs as ``join_pairs`` says."""

    def parse_known_args(self, args=None, namespace=None):
        return super().parse_known_args(join_pairs(list(sys.argv[1:] if args is None else args)), namespace)


class _Pairs(argparse.Action):
    """``--goodput``'s pairs: each value one pair or several joined by commas; a repeated flag adds
    to the pairs before it."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        pairs = [p for v in values for p in str(v).split(",") if p]
        bad = [v for v in pairs if ":" not in v]
        if bad:
            parser.error(
                f"{option_string}: {bad[0]!r} is not a KEY:VALUE pair; give the pairs as "
                f"{option_string} ttft:2000 tpot:50, {option_string} ttft:2000,tpot:50 or the flag "
                "once per pair"
            )
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest, None) or []), *pairs])


class _Traces(argparse.Action):
    """The trace argument(s): one is ``trace``; several are ``trace`` (the first) and ``mix``."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        flags = [v for v in values if v.startswith("--")]
        if flags:  # (after a '--', argparse takes every argument as a trace)
            parser.error(
                f"{flags[0]!r} is read as a trace: everything after '--' is; put the flags before it "
                "(--goodput needs no '--': --goodput ttft:2000 tpot:50 TRACE)"
            )
        if values:
            namespace.trace = values[0]
            if len(values) > 1:
                namespace.mix = list(values)


def _base_type(annotation: object) -> type:
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0]
    return annotation  # type: ignore[return-value]


def flag_help(name: str) -> str:
    """The help of setting ``name``: its description and its default (a setting whose default is
    unset says what unset means in its description; one in seconds has the metavar SECONDS)."""
    f = RunConfig.model_fields[name]
    if f.is_required() or f.default is None:
        default = ""
    elif isinstance(f.default, bool):
        default = f" [default: {'on' if f.default else 'off'}]"
    else:
        default = f" [default: {f.default}]"
    return f"{f.description}{default}"


class _ShortHelp(argparse.Action):
    """``--help``: the settings of ``groups.SHORT`` only, and where the others are."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from replayer.config.groups import SHORT

        hidden = [a for a in parser._actions if a.dest in RunConfig.model_fields and a.dest not in SHORT]  # noqa: SLF001
        saved = [a.help for a in hidden]
        for a in hidden:
            a.help = argparse.SUPPRESS
        text = parser.format_help()  # (argparse leaves out a heading with nothing left to show)
        for a, h in zip(hidden, saved, strict=True):
            a.help = h
        print(f"{text}\n{len(hidden)} more settings: --help-all, or docs/reference/cli.md")
        parser.exit()


class _FullHelp(argparse.Action):
    """``--help-all``: every setting, under its heading."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.print_help()
        parser.exit()


def add_help_flags(p: argparse.ArgumentParser) -> None:
    """``-h/--help`` (the common settings) and ``--help-all`` on a parser made with ``add_help=False``."""
    p.add_argument("-h", "--help", action=_ShortHelp, help="show the common settings and exit")
    p.add_argument("--help-all", action=_FullHelp, help="show every setting, under its heading, and exit")


def add_config_flags(p: argparse.ArgumentParser) -> None:
    """One flag per RunConfig field, under its heading (``config.groups``); unset flags stay
    absent so the config's defaults apply."""
    from replayer.config.groups import GROUPS

    for heading, names in GROUPS.items():
        g = p.add_argument_group(heading)
        for name in names:
            _add_flag(g, name)


def _add_flag(p: argparse._ArgumentGroup, name: str) -> None:
    typ = _base_type(RunConfig.model_fields[name].annotation)
    help_text = flag_help(name)
    if name in POSITIONAL:  # `run A B ...`: several traces are a mix (one tenant each)
        p.add_argument(name, nargs="*", default=argparse.SUPPRESS, action=_Traces, help=help_text)
    elif name in REPEATED:
        p.add_argument(
            flag_name(name),
            dest=name,
            action="append",
            default=argparse.SUPPRESS,
            metavar=name.upper(),
            help=help_text,
        )
    elif typing.get_origin(typ) is list:  # KEY:VALUE pairs (--goodput, as vllm bench serve takes it)
        p.add_argument(
            flag_name(name),
            dest=name,
            nargs="+",
            action=_Pairs if flag_name(name) in PAIR_FLAGS else "store",
            default=argparse.SUPPRESS,
            metavar="KEY:VALUE" if flag_name(name) in PAIR_FLAGS else name.upper(),
            help=help_text,
        )
    elif typ is bool:
        p.add_argument(
            flag_name(name),
            dest=name,
            action=argparse.BooleanOptionalAction,
            default=argparse.SUPPRESS,
            help=help_text,
        )
    else:
        p.add_argument(
            flag_name(name),
            dest=name,
            type=typ,
            default=argparse.SUPPRESS,
            metavar="SECONDS" if name.endswith("_s") else name.upper(),
            help=help_text,
        )


def read_config_file(path: str, extra: frozenset[str] = frozenset()) -> dict:
    """Settings from a YAML file whose keys are RunConfig field names (``configs/*.yaml``), or
    ``extra`` (a subcommand's own settings, e.g. ``replayer sweep``'s ``SWEEP_KEYS``). Raises
    ConfigError for unreadable files, non-mapping documents and unknown keys."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError([f"config: cannot read {path}: {e}"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"config: {path} must hold a mapping of setting: value"])
    known = [*RunConfig.model_fields, *sorted(extra)]
    unknown = sorted(set(data) - set(known), key=str)
    if unknown:
        import difflib

        def hint(k: str) -> str:
            close = difflib.get_close_matches(str(k), known, n=1)
            return f" (did you mean {close[0]!r}?)" if close else ""

        raise ConfigError([f"config: {path}: unknown setting {k!r}{hint(k)}" for k in unknown])
    return data


def flags_for(cfg: RunConfig, skip: set[str]) -> list[str]:
    """Command-line flags reproducing every setting of ``cfg`` except ``skip`` (a synthetic load's
    settings only for one: with a trace they are refused)."""
    out: list[str] = []
    for name in RunConfig.model_fields:
        if name in skip or (name in SYNTHETIC_LOAD and cfg.request_rate is None):
            continue
        v = getattr(cfg, name)
        if name == "trace":
            out += [v] if v is not None else []
        elif isinstance(v, bool):
            out.append(flag_name(name) if v else "--no-" + flag_name(name)[2:])
        elif isinstance(v, list) and name in REPEATED:
            for x in v:
                out += [flag_name(name), x]
        elif isinstance(v, list):
            out += [flag_name(name), *v]
        elif v is not None:
            out += [flag_name(name), str(v)]
    return out


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="replayer",
        allow_abbrev=False,
        description="Replay LLM serving traces against OpenAI-compatible servers, open-loop and token-exact.",
    )
    sub = p.add_subparsers(dest="command", required=True)
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
    sub.add_parser("sim", help="run the simulated OpenAI-compatible server (see `replayer sim --help`)", add_help=False)
    from replayer.cli.trace import add_trace_parser

    add_trace_parser(sub)
    from replayer.capture.recordflags import add_record_parser

    add_record_parser(sub)
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
    co = sub.add_parser(
        "coordinate",
        help="one start and one clock for a fleet of shards (replayer run --shard I/N --coordinator URL)",
        description="Serve the fleet's start barrier, clock and live view until every shard has ended; "
        "then write OUTPUT/fleet.json and merge the shards' folders when readable here. Exit 0 when "
        "every shard ended and the merge is one whole run, 1 otherwise.",
    )
    co.add_argument("--shards", type=int, required=True, metavar="N", help="how many shards make the fleet")
    co.add_argument("--host", default="127.0.0.1", help="address to listen on [default: 127.0.0.1]")
    co.add_argument("--port", type=int, default=9500, help="port to listen on (0 = a free port) [default: 9500]")
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
    add_history_parser(sub)
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
    sub.add_parser("version", help="print the version")
    _finish_parsers(p)
    return p


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


def _unrecognized(p: argparse.ArgumentParser, extra: list[str]) -> None:
    """Exit 2 with ``p``'s usage, naming the unknown arguments and the closest flags of ``p``."""
    flags = [o for a in p._actions for o in a.option_strings if a.help != argparse.SUPPRESS]  # noqa: SLF001
    hints = [c for c in (_closest_flag(arg, flags) for arg in extra if arg.startswith("-")) if c]
    msg = "unrecognized arguments: " + " ".join(extra)
    if hints:
        msg += "; did you mean " + ", ".join(hints) + "?"
    p.error(msg)


def main(argv: list[str] | None = None) -> int:
    """The ``replayer`` command. A reader that closes the pipe early (``replayer compare A B |
    head``) has what it wanted: the command ends quietly (exit 0, as ``trace`` does), not with a
    traceback."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at the interpreter's exit, where a broken pipe is exit 120
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit's flush
        return 0


def _main(argv: list[str] | None = None) -> int:  # noqa: C901, PLR0912
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sim":
        from replayer.sim import main as sim_main

        return sim_main(argv[1:])
    parser = build_parser()
    commands = list(subcommands(parser))
    if argv and not argv[0].startswith("-") and argv[0] not in commands:
        import difflib

        close = difflib.get_close_matches(argv[0], commands, n=1)
        parser.error(
            f"unknown command {argv[0]!r}"
            + (f"; did you mean {close[0]!r}?" if close else "")
            + f" (commands: {', '.join(commands)})"
        )
    args, extra = parser.parse_known_args(argv)
    if extra:
        _unrecognized(getattr(args, "_leaf", parser), extra)
    if args.command == "version":
        from replayer import __version__

        print(__version__)
        return 0
    sweep_file: dict = {}
    if args.command in ("run", "sweep"):
        flags = {k: v for k, v in vars(args).items() if k in RunConfig.model_fields}
        try:
            own: frozenset[str] = frozenset()
            if args.command == "sweep":
                from replayer.run.sweep import SWEEP_KEYS as own
            values = read_config_file(args.config_file, own) if args.config_file else {}
            sweep_file = {k: values.pop(k) for k in own if k in values}
            from_file = set(values) - set(flags)
            values.update(flags)
            cfg = load_config(values, config_file=args.config_file, from_file=from_file)
        except ConfigError as e:
            print(f"replayer {args.command}: {e}", file=sys.stderr)
            return 2
    if args.command == "sweep":
        from replayer.run.sweep import PER_POINT, SWEEP_KEYS, SweepError, run_sweep, sweep_options

        given = [flag_name(k) for k in ("speedup", "resume", "resume_existing") if k in flags]
        try:
            if given:
                raise SweepError(
                    f"{', '.join(given)}: not for a sweep (it sets the speed-up of each point "
                    "from --speedups and starts a new run per point)"
                )
            opts = sweep_options({k: getattr(args, k) for k in SWEEP_KEYS}, sweep_file)
            _, code = run_sweep(cfg, flags_for(cfg, PER_POINT), **opts)
        except SweepError as e:
            print(f"replayer sweep: {e}", file=sys.stderr)
            return 2
        return code
    if args.command == "run":
        if cfg.workers > 1:
            from replayer.run.workers import run_workers

            skip = {
                "workers",
                "shard",
                "results",
                "start_at",
                "admin_port",
                "target",
                "quiet",
                "config_file",
                "max_error_ratio",
            }  # (checked on the merged summary)
            passthrough = flags_for(cfg, skip)
            return run_workers(cfg, passthrough)
        from replayer.run.daemon import main_run

        return main_run(cfg)  # (the embedded simulator starts once the run's own checks pass)
    return _other_command(args)


def _tls_certs(args: argparse.Namespace) -> int:
    """``replayer tls-certs FOLDER``: write the throw-away CA and certificates, print their paths."""
    from replayer.sim.certs import write_certs

    try:
        paths = write_certs(args.folder, args.name, days=args.days, expired=args.expired)
    except (OSError, ValueError) as e:
        print(f"replayer tls-certs: {e}", file=sys.stderr)
        return 2
    print("\n".join(f"{role:<12} {path}" for role, path in paths.items()))
    return 0


def _coordinate(args: argparse.Namespace) -> int:
    """``replayer coordinate``: serve the fleet until it has ended."""
    import uvloop

    from replayer.fleet.coordinator import coordinate
    from replayer.fleet.roster import Roster
    from replayer.observe.logs import setup_logging

    if args.shards < 1:
        print("replayer coordinate: --shards must be at least 1", file=sys.stderr)
        return 2
    setup_logging(fields={"fleet": "coordinator"})
    import time

    roster = Roster(
        args.shards,
        started_s=time.time(),
        ready_timeout_s=args.ready_timeout,
        margin_s=args.start_margin,
        lost_after_s=args.lost_after,
        give_up_s=args.give_up_after,
    )
    try:
        return uvloop.run(coordinate(roster, args.host, args.port, args.output))
    except OSError as e:  # the port in use
        print(f"replayer coordinate: {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 2


def _other_command(args: argparse.Namespace) -> int:  # noqa: PLR0911
    """The commands that take their arguments alone (no run configuration)."""
    if args.command == "coordinate":
        return _coordinate(args)
    if args.command == "merge":
        from replayer.results.merge import main_merge

        return main_merge(args.dirs, args.output, args.wait)
    if args.command == "report":
        from replayer.results.report import main_report

        return main_report(args.results, args.output, args.spans)
    if args.command == "compare":
        from replayer.results.compare import main_compare

        gated = run_gate(args)  # (issue 45: the regression gate)
        return gated if gated is not None else main_compare(args.a, args.b, args.json, args.spans)
    if args.command == "history":
        return run_history(args)
    if args.command == "record":
        from replayer.capture.record import main_record

        return main_record(args)
    if args.command == "trace":
        from replayer.cli.trace import run_trace

        return run_trace(args)
    if args.command == "tls-certs":
        return _tls_certs(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
