"""Command line: parse flags into a RunConfig and call the right entry point; no logic here.

Every ``RunConfig`` field has exactly one flag, derived from the field (``duration_s`` ->
``--duration``, units in the help), so the CLI and the config cannot drift apart: ``cli.flags``
makes them, ``cli.parser`` the subcommands' parsers; this module is ``main`` and the small
commands (the names below are importable from here as before).
"""

from __future__ import annotations

import argparse
import os
import sys

from replayer.cli.flags import (
    PAIR_FLAGS,
    POSITIONAL,
    REPEATED,
    add_config_flags,
    add_help_flags,
    flag_help,
    flags_for,
    join_pairs,
    read_config_file,
)
from replayer.cli.gate import run_gate, run_history
from replayer.cli.parser import FLAG_HINT_CUTOFF, build_parser, subcommands, unrecognized
from replayer.config.model import SIM_ONLY, ConfigError, RunConfig, flag_name, load_config

__all__ = [
    "FLAG_HINT_CUTOFF",
    "PAIR_FLAGS",
    "POSITIONAL",
    "REPEATED",
    "add_config_flags",
    "add_help_flags",
    "build_parser",
    "flag_help",
    "flag_name",
    "flags_for",
    "join_pairs",
    "main",
    "read_config_file",
    "subcommands",
]

# NumPy's OpenBLAS starts one spinning thread per core at import; the replayer does no linear
# algebra, and on a small host those threads cost ~0.3 s of CPU per start (set before numpy loads).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


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
        unrecognized(getattr(args, "_leaf", parser), extra)
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
            _, code = run_sweep(cfg, flags_for(cfg, PER_POINT | set(SIM_ONLY)), **opts)
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
                *SIM_ONLY,  # (the parent's embedded simulator takes them; the workers get its --target)
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
