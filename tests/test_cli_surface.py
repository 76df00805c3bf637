"""CLI and config stay one surface: every field has a flag and every flag a field, with the same
defaults; the committed reference page (docs/reference/cli.md) fails CI when it drifts.
Regenerate it with: python -m replayer.cli.reference
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from replayer.cli import build_parser, flag_name, read_config_file
from replayer.config import ConfigError, RunConfig, load_config

ROOT = Path(__file__).resolve().parents[1]


def _run_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["run"]


def test_every_field_has_one_flag_and_every_flag_a_field():
    p = _run_parser()
    dests = {a.dest for a in p._actions if a.dest not in ("help", "help_all", "config_file")}
    assert dests == set(RunConfig.model_fields)
    for name in RunConfig.model_fields:
        if name == "trace":
            continue
        assert flag_name(name) in p._option_string_actions, name


def test_unset_flags_leave_the_config_defaults():
    args = _run_parser().parse_args(["x.parquet"])
    assert {k for k in vars(args) if k in RunConfig.model_fields} == {"trace"}
    cfg = load_config({"trace": str(ROOT / "traces" / "mooncake_conversation_10min.parquet")})
    for name, f in RunConfig.model_fields.items():
        if name != "trace":  # (given; none = a synthetic load)
            assert getattr(cfg, name) == f.default, name


def test_the_reference_page_is_current():
    """docs/reference/cli.md is what the code generates; regenerate with
    ``python -m replayer.cli.reference`` after a deliberate change of a flag."""
    from replayer.cli.reference import main

    assert main(["--check"]) == 0, "docs/reference/cli.md is stale: run python -m replayer.cli.reference"


def test_every_setting_is_under_one_heading():
    from replayer.config.groups import GROUPS, SHORT

    listed = [n for names in GROUPS.values() for n in names]
    assert sorted(listed) == sorted(RunConfig.model_fields), "a setting in no group, or in two"
    assert SHORT <= set(RunConfig.model_fields)


def _help(*args: str) -> str:
    env = dict(os.environ, COLUMNS="100")
    cmd = [sys.executable, "-m", "replayer", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout


def test_help_shows_the_common_settings_and_help_all_every_one():
    short, full = _help("run", "--help"), _help("run", "--help-all")
    assert len(short.splitlines()) <= 100, "run --help must fit in two screens"
    for name in RunConfig.model_fields:
        if name == "trace":
            continue
        assert flag_name(name) in full, name
    assert "--retry-backoff" not in short and "--retry-backoff" in full
    assert "--help-all" in short and "more settings" in short
    for heading in ("Target:", "Schedule:", "Prompts:", "Results:", "Soak:", "Observability:"):
        assert heading in full


def test_every_flag_says_its_default_or_what_unset_means():
    full = _help("run", "--help-all")
    assert "[default: None]" not in full and "daemon." not in _help("sweep", "--help-all")
    for name, f in RunConfig.model_fields.items():
        if f.default is None and not f.is_required():
            assert "none =" in f.description or "unset =" in f.description, name


def test_sim_help_says_every_default():
    text = _help("sim", "--help")
    for flag in ("--host", "--port", "--ttft-base-ms", "--itl-base-ms", "--itl-per-running-us", "--vocab-size"):
        block = text.split("\n  " + flag, 1)[1].split("\n  --", 1)[0]
        assert "(default:" in block, flag


@pytest.mark.parametrize("name", ["benchmark.yaml", "soak.yaml", "sharded.yaml"])
def test_example_configs_are_valid(name):
    values = read_config_file(str(ROOT / "configs" / name))
    values["trace"] = str(ROOT / values["trace"])
    load_config(values)


def test_config_file_then_flags(tmp_path):
    trace = ROOT / "traces" / "mooncake_conversation_10min.parquet"
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"trace": str(trace), "speedup": 3, "seed": 9}))
    values = read_config_file(str(f))
    args = _run_parser().parse_args(["--speedup", "7"])
    values.update({k: v for k, v in vars(args).items() if k in RunConfig.model_fields})
    cfg = load_config(values)
    assert cfg.speedup == 7 and cfg.seed == 9


def test_bad_value_from_a_config_file_names_the_file(tmp_path, capsys):
    from replayer.cli import main

    f = tmp_path / "c.yaml"
    f.write_text("speedup: fast\nseed: 1\n")
    trace = str(ROOT / "traces" / "mooncake_conversation_10min.parquet")
    assert main(["run", trace, "--config", str(f), "--loop-gap", "-1"]) == 2
    err = capsys.readouterr().err
    assert f"speedup (--speedup in {f})" in err and "'fast'" in err
    assert "loop_gap_s (--loop-gap)" in err and "--loop-gap in" not in err  # a flag's value


def test_workers_and_shard_together_are_refused():
    trace = str(ROOT / "traces" / "mooncake_conversation_10min.parquet")
    with pytest.raises(ConfigError, match="cannot be combined with --shard"):
        load_config({"trace": trace, "workers": 2, "shard": "1/2"})
    assert load_config({"trace": trace, "workers": 1, "shard": "1/2"}).shard == "1/2"  # a worker's own


def test_unknown_config_keys_are_errors(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("speedupp: 3\nfoo: 1\n")
    with pytest.raises(ConfigError) as e:
        read_config_file(str(f))
    assert "speedupp" in str(e.value) and "foo" in str(e.value)


@pytest.mark.parametrize(
    "argv, usage, hint",
    [
        (
            ["run", "t.parquet", "--speedupp", "2"],
            "usage: replayer run [options] [trace ...]",
            "--speedupp 2; did you mean --speedup?",
        ),
        (["trace", "inspect", "t.parquet", "--jsn"], "usage: replayer trace inspect", "--jsn; did you mean --json?"),
        (["merge", "a", "--ouput", "x"], "usage: replayer merge", "--ouput x; did you mean --output?"),
    ],
)
def test_a_misspelt_flag_is_reported_by_its_subcommand(argv, usage, hint, capsys):
    from replayer.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage)
    assert f"error: unrecognized arguments: {hint}" in err and "{run,sim,trace" not in err  # not the top-level usage


def test_a_misspelt_command_gets_a_hint(capsys):
    from replayer.cli import main

    with pytest.raises(SystemExit) as e:
        main(["runn", "t.parquet"])
    assert e.value.code == 2 and "unknown command 'runn'; did you mean 'run'?" in capsys.readouterr().err


@pytest.mark.parametrize("given", ["http://h:8000/v1", "http://h:8000/v1/", "http://h:8000/", "http://h:8000"])
def test_a_target_given_with_v1_is_the_server_base_url(given):
    """OpenAI clients take ``.../v1``; requests here add ``/v1/...`` themselves (was /v1/v1/models: 404)."""
    trace = str(ROOT / "traces" / "mooncake_conversation_10min.parquet")
    assert load_config({"trace": trace, "target": given}).target == ["http://h:8000"]
    assert load_config({"trace": trace, "target": "http://h/api/v1x"}).target == ["http://h/api/v1x"]


def test_resume_of_a_folder_that_is_not_a_run_names_the_folder(tmp_path):
    """``--resume DIR`` alone takes the trace from DIR's checkpoint: a missing folder, or one with
    no checkpoint, was first reported as a missing trace ("give a TRACE to replay")."""
    with pytest.raises(ConfigError) as ei:
        load_config({"resume": str(tmp_path / "gone")})
    assert str(ei.value).count("\n") == 1 and "no such file or folder" in str(ei.value)
    with pytest.raises(ConfigError) as ei:
        load_config({"resume": str(tmp_path)})
    assert f"resume: {tmp_path} holds no readable checkpoint.json" in str(ei.value)
    assert "give a TRACE to replay" not in str(ei.value)


def test_resume_alone_takes_the_trace_and_settings_of_the_checkpoint(tmp_path, caplog):
    trace = str(ROOT / "traces" / "mooncake_conversation_10min.parquet")
    d = tmp_path / "r"
    d.mkdir()
    settings = {"seed": 7, "shard": "1/3", "vocab_range": "2000:40000", "loop": "3", "max_requests": 500}
    (d / "checkpoint.json").write_text(
        json.dumps(
            {
                "trace": trace,
                "shard": "1/3",
                "seed": 7,
                "settings": settings,
                "loop": 2,
                "next_row": 350,
                "next_index": 4000,
            }
        )
    )
    cfg = load_config({"resume": str(d)})
    assert (cfg.trace, cfg.seed, cfg.shard, cfg.vocab_range, cfg.loop, cfg.max_requests) == (
        trace,
        7,
        "1/3",
        "2000:40000",
        "3",
        500,
    )
    assert load_config({"resume": str(d), "seed": 3}).seed == 3  # given again: the daemon compares
    w = tmp_path / "w"  # a --workers run's folder: worker-0's settings, not its shard
    (w / "worker-0").mkdir(parents=True)
    (w / "worker-0" / "checkpoint.json").write_text((d / "checkpoint.json").read_text())
    cfg = load_config({"resume": str(w), "workers": 3})
    assert cfg.trace == trace and cfg.seed == 7 and cfg.shard == "0/1"
    # the log names the checkpoint's position (it said "from loop 1" for loop 2, row 350)
    from replayer.run.resume import resume_plan

    caplog.set_level("INFO", logger="replayer")
    start_loop, _ = resume_plan(str(d))
    assert start_loop == 1  # (rows of the loop before are checked too: their results may be lost)
    assert f"resuming {d} at loop 2, row 350 (its checkpoint): 0 rows already recorded" in caplog.text


def _all_parsers(p=None, path=("replayer",)):
    """(command path, parser) of the top level and every subcommand, at any depth, and `replayer sim`."""
    from replayer.cli import subcommands
    from replayer.sim import parser as sim_parser

    if p is None:
        yield ("replayer", "sim"), sim_parser()
        p = build_parser()
    yield path, p
    for name, sp in subcommands(p).items():
        yield from _all_parsers(sp, (*path, name))


@pytest.mark.parametrize(
    "argv, full",
    [
        (["run", "t.parquet", "--max-request", "5"], "--max-requests"),
        (["run", "t.parquet", "--spee", "5"], "--speedup"),
        (["trace", "scale", "t.parquet", "-o", "x.parquet", "--output-fact", "2"], "--output-factor"),
        (["merge", "a", "--wai", "5"], "--wait"),
    ],
)
def test_abbreviated_flags_are_refused_with_the_full_name(argv, full, capsys):
    """An unambiguous prefix used to be taken for the flag: it would break the day a second flag
    with that prefix is added. Now it is an unknown flag, and the hint names the full one."""
    from replayer.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert f"; did you mean {full}?" in capsys.readouterr().err


def test_no_parser_accepts_abbreviations():
    for path, p in _all_parsers():
        assert p.allow_abbrev is False, " ".join(path)
    with pytest.raises(SystemExit):
        next(p for path, p in _all_parsers() if path == ("replayer", "sim")).parse_args(["--po", "1"])


@pytest.mark.parametrize(
    "arg, hint", [("--foo", None), ("--speedpu", "--speedup"), ("--seeds", "--seed"), ("--loop-salts=1", "--loop-salt")]
)
def test_did_you_mean_only_for_close_flags(arg, hint, capsys):
    """`--foo` was answered "did you mean --loop?": a hint is given only for a close name."""
    from replayer.cli import main

    with pytest.raises(SystemExit):
        main(["run", "t.parquet", arg])
    err = capsys.readouterr().err
    assert f"unrecognized arguments: {arg}" in err
    if hint is None:
        assert "did you mean" not in err
    else:
        assert f"did you mean {hint}?" in err


def test_every_flag_of_every_command_has_help():
    """`trace synth --arrival` had none."""
    missing = [
        f"{' '.join(path)} {a.option_strings[0]}"
        for path, p in _all_parsers()
        for a in p._actions
        if a.option_strings and not a.help and not isinstance(a, argparse._HelpAction)
    ]
    missing_sim = [m for m in missing if m.startswith("replayer sim ")]  # the simulator's knobs: names suffice
    assert [m for m in missing if m not in missing_sim] == []


def test_trace_scale_factors_are_named_alike_and_the_old_names_still_work(tmp_path, capsys):
    from replayer.cli import main
    from replayer.trace import read_trace

    src = str(ROOT / "traces" / "mooncake_conversation_10min.parquet")
    new, old = tmp_path / "new.parquet", tmp_path / "old.parquet"
    assert (
        main(
            [
                "trace",
                "scale",
                src,
                "-o",
                str(new),
                "--time-factor",
                "2",
                "--input-factor",
                "0.5",
                "--output-factor",
                "3",
            ]
        )
        == 0
    )
    assert "deprecated" not in capsys.readouterr().err
    assert main(["trace", "scale", src, "-o", str(old), "--time", "2", "--input", "0.5", "--output-factor", "3"]) == 0
    err = capsys.readouterr().err
    assert "--time is deprecated: use --time-factor" in err and "--input is deprecated: use --input-factor" in err
    a, b, orig = read_trace(new), read_trace(old), read_trace(src)
    assert (a.timestamp_ns == b.timestamp_ns).all() and (a.input_length == b.input_length).all()
    assert a.timestamp_ns[-1] == 2 * orig.timestamp_ns[-1] and a.input_length.sum() < orig.input_length.sum()
    assert (a.output_length == 3 * orig.output_length).all()
    assert main(["trace", "scale", src, "-o", str(tmp_path / "c.parquet"), "--input", "2", "--input-factor", "3"]) == 2
    assert "--input is the old name of --input-factor: give one of them" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["benchmark.yaml", "soak.yaml", "sharded.yaml"])
def test_example_configs_bind_loopback_and_say_why_each_setting(name):
    """configs/soak.yaml bound the admin server (which can pause and stop the run) to 0.0.0.0; the
    containers in deploy/ pass their own flags, so no example here needs to. Every setting of the
    soak file carries its reason."""
    import ipaddress

    path = ROOT / "configs" / name
    cfg = read_config_file(str(path))
    assert ipaddress.ip_address(cfg.get("admin_host", "127.0.0.1")).is_loopback
    if name == "soak.yaml":
        lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith((" ", "#"))]
        assert len(lines) == len(cfg)
        assert [ln.split(":")[0] for ln in lines if "#" not in ln] == ["trace"]
        assert "--speedup 10" in path.read_text()  # how to see a loop soon when trying it


def test_a_reader_that_closes_the_pipe_early_gets_no_traceback(tmp_path):
    """`replayer compare A B | head` ended in a BrokenPipeError traceback (exit 1, or 120 when the
    output waited in the buffer until exit) when head left first; every command now ends quietly
    then (exit 0, as `trace` already did)."""
    for name, speedup in (("a", 1), ("b", 2)):
        (tmp_path / name).mkdir()
        summary = {"completed": 10, "duration": 5.0, "speedup": speedup, "median_ttft_ms": 20.0 * speedup}
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first write: every write fails with EPIPE
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "replayer", "compare", str(tmp_path / "a"), str(tmp_path / "b")],
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(w)
    assert "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, (proc.returncode, proc.stderr)


def test_sim_on_a_port_in_use_says_so_in_one_line_and_exits_2(capsys):
    import socket

    from replayer.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["sim", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"127.0.0.1:{port}: Address already in use" in err and "--port 0" in err
