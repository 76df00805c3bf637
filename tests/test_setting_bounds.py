"""Settings that were refused only late, silently ignored or crashed (issue 45, a new user trying
the verdicts): each is now refused at start-up with exit 2 and the setting named, no traceback;
and the verdicts' printed lines read as plain text (plural nouns, plain numbers, no nested
parentheses)."""

from __future__ import annotations

import math
import re
import typing
from dataclasses import fields
from pathlib import Path

import pytest

from replayer.cli import main
from replayer.config import ConfigError, RunConfig, load_config
from replayer.core import port_number
from replayer.results.drift import drift_lines, judge_drift
from replayer.results.fidelity import fidelity_lines, judge_fidelity
from replayer.results.history import format_history
from replayer.results.numtext import count, plain
from replayer.sim import SimConfig

TRACE = str(Path(__file__).resolve().parents[1] / "traces" / "mooncake_conversation_10min.parquet")
#: the settings whose inf is a documented value (all at once; evenly spaced gaps)
INF_ALLOWED = {"request_rate", "burstiness"}


def _is_float(annotation: object) -> bool:
    return annotation is float or float in typing.get_args(annotation)


FLOAT_SETTINGS = [name for name, f in RunConfig.model_fields.items() if _is_float(f.annotation)]


def _refused(capsys, argv: list[str]) -> str:
    """Run ``replayer ARGV``: it exits 2 (returned or argparse's SystemExit), without a
    traceback; its stderr."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    return err


# -- 1. inf and nan -------------------------------------------------------------------------------


def test_the_float_settings_are_found():
    assert {"drift_window_s", "speedup", "start_at", "request_rate", "burstiness"} <= set(FLOAT_SETTINGS)


@pytest.mark.parametrize("name", FLOAT_SETTINGS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_every_float_setting_refuses_inf_and_nan(name, value):
    """One rule of the model (not a check per field): a number must be finite, but the two whose
    inf is a documented value (their nan is refused by their bound)."""
    base = {"request_rate": 10.0} if name in INF_ALLOWED else {"trace": TRACE}
    if name in INF_ALLOWED and value == math.inf:
        assert getattr(load_config({**base, name: value}), name) == math.inf
        return
    with pytest.raises(ConfigError) as e:
        load_config({**base, name: value})
    assert len(e.value.problems) == 1 and e.value.problems[0].startswith(f"{name} (")


def test_an_infinite_drift_window_exits_2_naming_it(capsys):
    err = _refused(capsys, ["run", TRACE, "--drift-window", "inf"])
    assert "drift_window_s (--drift-window)" in err and "finite" in err


def test_an_infinite_setting_in_a_config_file_names_the_file(tmp_path, capsys):
    f = tmp_path / "c.yaml"
    f.write_text("drift_window_s: .inf\n")
    err = _refused(capsys, ["run", TRACE, "--config", str(f)])
    assert f"drift_window_s (--drift-window in {f})" in err


@pytest.mark.parametrize("f", [f for f in fields(SimConfig) if f.type in (float, "float")], ids=lambda f: f.name)
def test_every_float_setting_of_the_simulator_refuses_inf(f, capsys):
    flag = f.metadata.get("flags", (f"--{f.name.replace('_', '-')}",))[0]
    err = _refused(capsys, ["sim", flag, "inf", "--port", "0"])
    assert f"{flag} must be a finite number" in err


# -- 2. ports -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, flag, value",
    [
        (["sim", "--port", "99999"], "--port", "99999"),  # (it served on 34463, 99999 - 65536)
        (["sim", "--port", "-1"], "--port", "-1"),
        (["coordinate", "--shards", "1", "--port", "65536"], "--port", "65536"),
        (
            ["record", "--upstream", "http://127.0.0.1:9", "--out", "x", "--admin-port", "70000"],
            "--admin-port",
            "70000",
        ),
        (["run", TRACE, "--admin-port", "99999"], "--admin-port", "99999"),
    ],
    ids=["sim", "sim-negative", "coordinate", "record-admin", "run-admin"],
)
def test_a_port_outside_0_to_65535_is_refused(argv, flag, value, capsys):
    err = _refused(capsys, argv)
    assert flag in err and value in err and "65535" in err


def test_port_numbers_at_the_bounds_are_taken():
    assert (port_number("0"), port_number("65535")) == (0, 65535)


@pytest.mark.parametrize("key", ["target", "coordinator", "metrics_push", "otlp_endpoint"])
def test_a_url_with_a_port_past_65535_is_refused(key):
    extra = {"shard": "0/2"} if key == "coordinator" else {}
    with pytest.raises(ConfigError) as e:
        load_config({"trace": TRACE, key: "http://127.0.0.1:99999", **extra})
    assert e.value.problems[0].startswith(f"{key} (") and "http://127.0.0.1:99999: its port" in e.value.problems[0]


# -- 3. and 4. the embedded simulator's settings -------------------------------------------------


def test_a_simulator_setting_with_a_target_is_refused(capsys):
    err = _refused(capsys, ["run", TRACE, "--target", "http://127.0.0.1:8000", "--sim-ttft-drift-ms-per-min", "20"])
    assert "--sim-ttft-drift-ms-per-min is a test aid of the embedded simulator" in err and "--target" in err
    both = {"sim_ttft_drift_ms_per_min": 20.0, "sim_itl_drift_ms_per_min": -1.0}
    with pytest.raises(ConfigError, match="--sim-ttft-drift-ms-per-min and --sim-itl-drift-ms-per-min are"):
        load_config({"trace": TRACE, "target": "http://127.0.0.1:8000", **both})
    assert load_config({"trace": TRACE, "target": "http://127.0.0.1:8000", "sim_ttft_drift_ms_per_min": 0})


def test_a_negative_drift_is_taken_by_run_and_sim_alike():
    """A server getting faster (the verdict's "improving" path): both accept it."""
    cfg = load_config({"trace": TRACE, "sim_ttft_drift_ms_per_min": -20, "sim_itl_drift_ms_per_min": -1})
    assert (cfg.sim_ttft_drift_ms_per_min, cfg.sim_itl_drift_ms_per_min) == (-20, -1)
    assert SimConfig(ttft_drift_ms_per_min=-20, itl_drift_ms_per_min=-1).ttft_drift_ms_per_min == -20


# -- 5. a reference loop past --loop --------------------------------------------------------------


def test_a_drift_reference_past_the_last_loop_is_refused_at_start(capsys):
    err = _refused(capsys, ["run", TRACE, "--drift-reference", "5", "--loop", "2"])
    assert "--drift-reference 5 is past the last loop (--loop 2 runs loops 0 to 1" in err
    with pytest.raises(ConfigError, match="--loop 1 runs loop 0"):
        load_config({"trace": TRACE, "drift_reference": "1"})
    for ok in ({"drift_reference": "1", "loop": "2"}, {"drift_reference": "7", "loop": "forever"}):
        assert load_config({"trace": TRACE, **ok}).drift_reference == ok["drift_reference"]


# -- 6. the printed lines -------------------------------------------------------------------------


def _depth(text: str) -> int:
    """The deepest nesting of parentheses in ``text``."""
    depth = deepest = 0
    for c in text:
        depth += {"(": 1, ")": -1}.get(c, 0)
        deepest = max(deepest, depth)
    return deepest


def _windows(loops: int, positions: int, ttft) -> list[dict]:
    return [
        {"loop": lp, "position": p, "t_s": (lp * positions + p + 0.5) * 60.0, "ttft_p50_ms": ttft(lp, p)}
        for lp in range(loops)
        for p in range(positions)
    ]


def test_plain_numbers_and_counted_nouns():
    assert plain(37168.4, signed=True) == "+37,170" and plain(-0.5, signed=True) == "-0.5"
    assert (plain(999.96), plain(0.012345), plain(300.0), plain(0.0)) == ("1,000", "0.01235", "300", "0")
    assert (count(1, "window"), count(1234, "window")) == ("1 window", "1,234 windows")


def test_a_too_short_drift_says_one_window_without_nested_parentheses():
    one = drift_lines(judge_drift(_windows(1, 1, lambda lp, p: 50.0), window_s=300.0))
    assert one == ["Drift: too short (1 window of 300 s, at least 6 are needed)"]
    series = _windows(2, 3, lambda lp, p: 50.0)
    series[0]["dispatch_lag_p99_ms"] = 500.0  # (a window the replay lagged in: left out)
    (line,) = drift_lines(judge_drift(series, window_s=60.0, max_lag_ms=25.0, reference="9"))
    assert "5 windows of 60 s" in line and "1 more left out" in line and "--drift-reference 9: no such loop" in line
    assert _depth(line) == 1, line


def test_a_drift_slope_is_a_plain_number():
    # TTFT p50 grows 37,170 ms an hour (windows of a minute), printed as it reads, not +3.717e+04
    series = _windows(3, 10, lambda lp, p: 100.0 + 37170.0 * (lp * 10 + p + 0.5) / 60.0 + (p % 2) * 0.01)
    lines = drift_lines(judge_drift(series, window_s=60.0))
    assert lines[0].startswith("Drift: drifting (30 windows of 60 s, paired across loops: same trace position")
    assert _depth(lines[0]) == 1, lines[0]
    (slope,) = [x for x in lines if x.startswith("  ttft_p50_ms:")]
    assert re.match(r"  ttft_p50_ms: \+37,\d{3} ms/h \[\+37,\d{3}, \+37,\d{3}\]", slope), slope
    assert "e+" not in "\n".join(lines)
    # and when it started, on the run's clock (a window's middle), beside the window's index
    assert re.search(r", worse, from window \d+ \(\d+(\.\d)? (s|min) into the run\)$", slope), slope


def test_a_fidelity_not_judged_says_why_in_the_singular():
    sec = judge_fidelity({"sent": 1})
    assert fidelity_lines(sec) == ["Fidelity: not judged", "  not judged: 1 request sent, fewer than the 10 needed"]
    stopped = judge_fidelity({"sent": 100, "unsent": 1}, stopped_early=True)
    assert stopped["notes"] == ["1 row scheduled was never sent; the run was stopped"]


def test_history_headers_carry_their_units():
    row = {"start": None, "run": "a", "loop": None, "trace": "t", "requests": 3, "median_ttft_ms": 12.5}
    head = format_history([row]).splitlines()[0]
    for header in ("TTFT p50 (ms)", "TTFT p99 (ms)", "TPOT p50 (ms)", "E2E p99 (ms)", "errors", "SLO met"):
        assert header in head
