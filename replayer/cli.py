"""Command line: parse flags into a RunConfig and call the right entry point; no logic here.

Every ``RunConfig`` field has exactly one flag, derived from the field (``duration_s`` ->
``--duration``, units in the help), so the CLI and the config cannot drift apart.
"""

from __future__ import annotations

import argparse
import sys
import types
import typing

from .config import ConfigError, RunConfig, load_config

POSITIONAL = ("trace",)


def flag_name(field: str) -> str:
    """``read_timeout_s`` -> ``--read-timeout`` (the unit goes to the help text)."""
    return "--" + field.removesuffix("_s").replace("_", "-")


def _base_type(annotation: object) -> type:
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0]
    return annotation  # type: ignore[return-value]


def add_config_flags(p: argparse.ArgumentParser) -> None:
    """One flag per RunConfig field; unset flags stay absent so the config's defaults apply."""
    for name, f in RunConfig.model_fields.items():
        typ = _base_type(f.annotation)
        unit = " (seconds)" if name.endswith("_s") else ""
        default = "" if f.is_required() else f" [default: {f.default}]"
        help_text = f"{f.description}{unit}{default}"
        if name in POSITIONAL:
            p.add_argument(name, help=help_text)
        elif typ is bool:
            p.add_argument(flag_name(name), dest=name, action=argparse.BooleanOptionalAction,
                           default=argparse.SUPPRESS, help=help_text)
        else:
            p.add_argument(flag_name(name), dest=name, type=typ, default=argparse.SUPPRESS,
                           metavar=name.removesuffix("_s").upper(), help=help_text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="replayer", description="Replay LLM serving traces against "
                                "OpenAI-compatible servers, open-loop and token-exact.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="replay a trace (against the embedded simulator if no --target)")
    add_config_flags(run)
    sub.add_parser("sim", help="run the simulated OpenAI-compatible server (see `replayer sim --help`)",
                   add_help=False)
    tr = sub.add_parser("trace", help="trace tools")
    trs = tr.add_subparsers(dest="trace_command", required=True)
    conv = trs.add_parser("convert", help="convert a trace (Mooncake JSONL, Parquet) to canonical Parquet")
    conv.add_argument("input")
    conv.add_argument("-o", "--output", required=True, help="output .parquet path")
    conv.add_argument("--format", default="auto", help="input format: auto, mooncake, parquet [default: auto]")
    conv.add_argument("--block-size", type=int, default=None, help="tokens per hash id [default: 512]")
    conv.add_argument("--first-seconds", type=float, default=None, help="keep rows in the first S seconds")
    conv.add_argument("--source", default=None, help="provenance text stored in the file metadata")
    conv.add_argument("--license", default="", help="license text stored in the file metadata")
    conv.add_argument("--strict", action="store_true", help="out-of-order timestamps are an error")
    sub.add_parser("version", help="print the version")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sim":
        from .sim import main as sim_main

        return sim_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "version":
        from . import __version__

        print(__version__)
        return 0
    if args.command == "run":
        values = {k: v for k, v in vars(args).items() if k in RunConfig.model_fields}
        try:
            cfg = load_config(values)
        except ConfigError as e:
            print(f"replayer run: {e}", file=sys.stderr)
            return 2
        from .daemon import main_run

        return main_run(cfg)
    if args.command == "trace" and args.trace_command == "convert":
        from .trace import TraceError, convert

        try:
            t = convert(args.input, args.output, fmt=args.format, block_size=args.block_size,
                        source=args.source, license=args.license, first_seconds=args.first_seconds,
                        strict=args.strict)
        except (TraceError, OSError, ValueError) as e:
            print(f"replayer trace convert: error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {args.output}: {len(t)} rows")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
