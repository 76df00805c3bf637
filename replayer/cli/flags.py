"""The run settings as flags: one flag per ``RunConfig`` field, derived from the field
(``duration_s`` -> ``--duration``, units in the help) under its heading (``config.groups``), so the
CLI and the config cannot drift apart; ``--help`` and ``--help-all``; the ``--config`` YAML file; and
the flags that reproduce a config (``flags_for``: a sweep's points, ``--workers``' processes).
"""

from __future__ import annotations

import argparse
import re
import types
import typing

from replayer.config.model import SYNTHETIC_LOAD, ConfigError, RunConfig, flag_name

__all__ = [
    "PAIR_FLAGS",
    "POSITIONAL",
    "REPEATED",
    "add_config_flags",
    "add_help_flags",
    "flag_help",
    "flags_for",
    "join_pairs",
    "read_config_file",
]


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
