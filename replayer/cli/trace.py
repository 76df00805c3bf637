"""The ``replayer trace`` subcommands: flags -> calls into ``trace``, ``tracetools``, ``synth``.

``convert``, ``inspect``, ``slice``, ``scale``, ``sessionize``, ``synth``, ``from-log`` (in ``capture``). Exit codes: 0 done, 2 bad input or
flags (the message names file, row and field for trace problems; nothing is written).
"""

from __future__ import annotations

import argparse
import math
import os
import sys


def _factor(text: str) -> float:
    """argparse type of the ``trace scale`` factors: a positive finite number (the error names
    the flag, not ``scale_trace``'s parameter)."""
    try:
        f = float(text)
    except ValueError:
        f = math.nan
    if not (math.isfinite(f) and f > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return f


#: ``trace scale``'s earlier flag names -> today's (``--input`` read like the input file's flag).
_DEPRECATED_SCALE_FLAGS = {"--time": "--time-factor", "--input": "--input-factor"}

_SYNTH_FLAGS = {
    "rows": "--rows",
    "rate_per_s": "--rate",
    "arrival": "--arrival",
    "cv": "--cv",
    "turns": "--turns",
    "sessions": "--sessions",
    "system_prompts": "--system-prompts",
    "system_prompt_tokens": "--system-prompt-tokens",
    "block_size": "--block-size",
    "max_input_tokens": "--max-input-tokens",
    "input_dist": "--input-dist",
    "output_dist": "--output-dist",
}


def _add_input(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "input", help="trace: Parquet file, folder or glob of shards; .jsonl (.gz for agentic traces); .json; .csv"
    )
    p.add_argument(
        "--format",
        default="auto",
        help="auto, parquet, mooncake, azure, jsonl, csv, weka, copilot, tracelab "
        "[default: auto, from the extension and, for JSON, the first record's keys]",
    )
    p.add_argument(
        "--map",
        default=None,
        metavar="FIELD=COL,...",
        help="source column of each field, e.g. timestamp=ts,input_length=prompt_tokens, "
        "request_id=chat_id,parent_request_id=parent_chat_id; "
        "hash_ids= (empty) synthesises unique ids",
    )
    p.add_argument(
        "--time-unit",
        default=None,
        choices=("s", "ms", "us", "ns", "datetime"),
        help="unit of the timestamp column [default: format's own; ms for generic files]",
    )
    p.add_argument("--block-size", type=int, default=None, help="tokens per hash id [default: 512 or metadata]")
    p.add_argument("--strict", action="store_true", help="out-of-order timestamps are an error, not a warning")


def _add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", required=True, help="output canonical .parquet path")


def add_trace_parser(sub) -> None:
    """Add ``trace`` and its subcommands to ``sub`` (the top-level subparsers)."""
    tr = sub.add_parser("trace", help="trace tools: convert, inspect, slice, scale, sessionize, synth")
    trs = tr.add_subparsers(dest="trace_command", required=True)

    conv = trs.add_parser("convert", help="validate, sort and write any trace as canonical Parquet")
    _add_input(conv)
    _add_output(conv)
    conv.add_argument("--first-seconds", type=float, default=None, help="keep rows in the first S seconds")
    conv.add_argument("--source", default=None, help="provenance text stored in the file metadata")
    conv.add_argument("--license", default="", help="license text stored in the file metadata")

    ins = trs.add_parser("inspect", help="rows, span, rates, lengths, blocks, prefix-cache hit ratio, sessions")
    _add_input(ins)
    ins.add_argument("--json", action="store_true", help="print one JSON object")
    ins.add_argument(
        "--cache-tokens",
        type=int,
        default=64_000_000,
        metavar="N",
        help="LRU capacity in tokens of the expected prefix-cache model, as replayer run's "
        "--expected-cache-tokens; 0 = infinite (default: %(default)s)",
    )
    ins.add_argument(
        "--kv-block-size",
        type=int,
        default=16,
        metavar="N",
        help="the server's KV block in tokens, as replayer run's (default: %(default)s)",
    )

    sl = trs.add_parser("slice", help="time window / first N rows / seeded sample (sessions kept whole)")
    _add_input(sl)
    _add_output(sl)
    sl.add_argument("--start", type=float, default=None, metavar="S", help="window start (seconds from first row)")
    sl.add_argument("--end", type=float, default=None, metavar="S", help="window end, exclusive (seconds)")
    sl.add_argument("--head", type=int, default=None, metavar="N", help="first N rows")
    sl.add_argument("--sample", type=float, default=None, metavar="F", help="keep a fraction F of sessions/rows")
    sl.add_argument("--seed", type=int, default=None, help="seed of --sample [default: 0]")
    sl.add_argument(
        "--split-sessions", action="store_true", help="cut sessions at the edges instead of keeping them whole"
    )

    sc = trs.add_parser("scale", help="scale times and lengths (hash ids recomputed consistently)")
    _add_input(sc)
    _add_output(sc)
    sc.add_argument(
        "--time-factor", type=_factor, default=1.0, help="time factor (2 = twice as long, half the rate) [default: 1]"
    )
    sc.add_argument("--input-factor", type=_factor, default=1.0, help="input length factor [default: 1]")
    sc.add_argument("--output-factor", type=_factor, default=1.0, help="output length factor [default: 1]")
    for old, new in _DEPRECATED_SCALE_FLAGS.items():  # hidden, still accepted (a warning says the new name)
        sc.add_argument(
            old, type=_factor, default=None, dest=f"deprecated_{new[2:].replace('-', '_')}", help=argparse.SUPPRESS
        )

    se = trs.add_parser("sessionize", help="chain rows that share leading hash ids into sessions (session_id, turn)")
    _add_input(se)
    _add_output(se)
    se.add_argument(
        "--min-shared-blocks",
        type=int,
        default=1,
        metavar="K",
        help="full blocks a row must share with the previous turn [default: 1]",
    )

    _add_from_log(trs)
    _add_synth(trs)


def _add_from_log(trs) -> None:
    """``trace from-log``'s flags."""
    fl = trs.add_parser(
        "from-log",
        help="a capture trace (as `replayer record` writes) from gateway request/response "
        "logs (JSON lines: timestamp, request body, usage)",
    )
    fl.add_argument("log", help="JSON lines, one request per line (see replayer/capture/fromlog.py)")
    _add_output(fl)
    fl.add_argument("--block-size", type=int, default=512, help="tokens per hash id [default: 512]")
    fl.add_argument(
        "--time-unit",
        default="s",
        choices=("s", "ms", "us", "ns"),
        help="unit of numeric timestamps (ISO-8601 strings are read as such) [default: s]",
    )
    fl.add_argument(
        "--endpoint",
        default=None,
        help="API path of lines without an endpoint [default: read from the body: messages is "
        "/v1/chat/completions, prompt /v1/completions, input /v1/embeddings]",
    )
    fl.add_argument(
        "--tokenizer",
        default=None,
        metavar="PATH",
        help="local tokenizer.json (or a folder, or builtin:gpt2) for text prompts",
    )
    fl.add_argument(
        "--tokenize-url",
        default=None,
        metavar="URL",
        help="a server's /tokenize (vLLM's, same model) for text and chat prompts, e.g. http://host:8000/tokenize",
    )
    fl.add_argument(
        "--hash-key-file",
        default=None,
        metavar="FILE",
        help="secret key for the block hashes [default: a random key, not kept]",
    )


def _add_synth(trs) -> None:
    """``trace synth``'s flags."""
    sy = trs.add_parser("synth", help="generate a synthetic trace (seeded)")
    _add_output(sy)
    sy.add_argument("--rows", type=int, required=True, help="requests to generate")
    sy.add_argument("--rate", type=float, required=True, help="requests per second")
    sy.add_argument(
        "--arrival",
        default="poisson",
        choices=("poisson", "gamma", "constant"),
        help="arrival process: poisson (exponential gaps), gamma (gaps with coefficient of "
        "variation --cv: > 1 burstier, < 1 more regular) or constant (exactly 1/--rate apart) [default: poisson]",
    )
    sy.add_argument("--cv", type=float, default=None, help="gamma: coefficient of variation of the gaps [default: 1]")
    sy.add_argument(
        "--input-dist",
        default="lognormal:1024:1.0",
        help="new user tokens per turn: const:N, uniform:LO:HI, lognormal:MEAN:CV, normal:MEAN:SD, exp:MEAN",
    )
    sy.add_argument("--output-dist", default="lognormal:256:0.8", help="output tokens (same forms)")
    sy.add_argument("--lengths-from", default=None, metavar="TRACE", help="resample (input, output) pairs from a trace")
    sy.add_argument("--system-prompts", type=int, default=0, help="number of shared system prompts")
    sy.add_argument("--system-prompt-tokens", type=int, default=0, help="tokens per system prompt")
    sy.add_argument("--turns", type=int, default=1, help="turns per session (multi-turn growth)")
    sy.add_argument("--sessions", type=int, default=1, help="concurrent sessions interleaved")
    sy.add_argument(
        "--max-input-tokens",
        type=int,
        default=None,
        help="cap on a row's input_length (a long session's prompts stop growing there) [default: none]",
    )
    sy.add_argument("--block-size", type=int, default=512, help="tokens per hash id [default: 512]")
    sy.add_argument("--seed", type=int, default=0, help="random seed [default: 0]")


def _open_opts(args) -> dict:
    return dict(
        fmt=args.format, block_size=args.block_size, strict=args.strict, mapping=args.map, time_unit=args.time_unit
    )


def run_trace(args) -> int:
    """Run one ``trace`` subcommand; returns the exit code."""
    import json
    import warnings

    from replayer.trace import TraceError, TraceOrderWarning, coarsest_unit, convert, read_trace, write_parquet

    name = f"replayer trace {args.trace_command}"
    if args.trace_command == "from-log":
        from replayer.capture.fromlog import main_from_log

        return main_from_log(args)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", TraceOrderWarning)
            notes = _deprecated_flags(args) if args.trace_command == "scale" else []
            code = _run(args, json, convert, read_trace, write_parquet, coarsest_unit)
        for w in [*notes, *(w.message for w in caught)]:
            print(f"{name}: warning: {w}", file=sys.stderr)
        return code
    except BrokenPipeError:  # `... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit's flush
        return 0
    except (TraceError, OSError, ValueError) as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return 2


def _deprecated_flags(args) -> list[str]:
    """Take the values of ``trace scale``'s old flag names into the new ones; one warning each.
    Raises ValueError when an old name and its new one are both given."""
    out = []
    for old, new in _DEPRECATED_SCALE_FLAGS.items():
        dest = new[2:].replace("-", "_")
        v = getattr(args, "deprecated_" + dest, None)
        if v is None:
            continue
        if getattr(args, dest) != 1.0:
            raise ValueError(f"{old} is the old name of {new}: give one of them")
        setattr(args, dest, v)
        out.append(f"{old} is deprecated: use {new}")
    return out


def _check_args(args) -> None:
    """Arguments that would otherwise be ignored or give a surprising file (ValueError)."""
    out = getattr(args, "output", None)
    if out is not None and not out.endswith(".parquet"):
        raise ValueError(f"-o {out}: the output is canonical Parquet; give a .parquet path")
    cmd = args.trace_command
    if cmd == "slice":
        if args.seed is not None and args.sample is None:
            raise ValueError("--seed only applies to --sample")
        if args.start is not None and args.end is not None and args.start >= args.end:
            raise ValueError(f"--start {args.start:g} must be before --end {args.end:g}")
    if cmd == "synth" and args.cv is not None and args.arrival != "gamma":
        raise ValueError("--cv only applies to --arrival gamma")
    if cmd == "synth" and not math.isfinite(args.rate):  # (a file of rows all at time 0: not a trace)
        raise ValueError(f"--rate must be a finite number > 0, got {args.rate}")


def _run(args, json, convert, read_trace, write_parquet, coarsest_unit) -> int:
    cmd = args.trace_command
    _check_args(args)
    if cmd == "convert":
        t = convert(
            args.input,
            args.output,
            source=args.source,
            license=args.license,
            first_seconds=args.first_seconds,
            **_open_opts(args),
        )
        print(f"wrote {args.output}: {len(t)} rows")
        return 0
    if cmd == "inspect":
        from replayer.results.traceinspect import format_inspect, inspect_trace

        s = inspect_trace(
            args.input, cache_tokens=args.cache_tokens or None, kv_block_size=args.kv_block_size, **_open_opts(args)
        )
        print(json.dumps(s, indent=2) if args.json else format_inspect(s))
        return 0
    if cmd in ("slice", "scale"):
        from replayer.trace.tools import scale_trace, slice_trace

        t = read_trace(args.input, **_open_opts(args))
        if cmd == "slice":
            t = slice_trace(
                t,
                start_s=args.start,
                end_s=args.end,
                head=args.head,
                fraction=args.sample,
                seed=args.seed or 0,
                whole_sessions=not args.split_sessions,
            )
        else:
            t = scale_trace(
                t, time_factor=args.time_factor, input_factor=args.input_factor, output_factor=args.output_factor
            )
        write_parquet(t, args.output, time_unit=coarsest_unit(t.timestamp_ns))
        print(f"wrote {args.output}: {len(t)} rows")
        return 0
    if cmd == "sessionize":
        from replayer.trace.tools import sessionize_trace

        t, s = sessionize_trace(read_trace(args.input, **_open_opts(args)), min_shared_blocks=args.min_shared_blocks)
        write_parquet(t, args.output, time_unit=coarsest_unit(t.timestamp_ns))
        print(
            f"wrote {args.output}: {s['rows']} rows, {s['sessions']} sessions "
            f"({s['multi_turn_sessions']} multi-turn, max {s['max_turns']} turns)"
        )
        return 0
    if cmd == "synth":
        from replayer.trace.synth import SynthSpec, write_synth

        spec = SynthSpec(
            rows=args.rows,
            rate_per_s=args.rate,
            arrival=args.arrival,
            cv=1.0 if args.cv is None else args.cv,
            input_dist=args.input_dist,
            output_dist=args.output_dist,
            lengths_from=args.lengths_from,
            system_prompts=args.system_prompts,
            system_prompt_tokens=args.system_prompt_tokens,
            turns=args.turns,
            sessions=args.sessions,
            max_input_tokens=args.max_input_tokens,
            block_size=args.block_size,
            seed=args.seed,
        )
        spec.check(names=_SYNTH_FLAGS)  # (errors name the flags, not the fields)
        n = write_synth(spec, args.output)
        print(f"wrote {args.output}: {n} rows")
        return 0
    return 2
