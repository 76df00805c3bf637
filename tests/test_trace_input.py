"""Trace input a user brings: fractional-millisecond Mooncake timestamps, hash ids written as
decimal strings, and one clear line for a whole-file problem (issue 17, issue 18 items 5 and 6)."""

from __future__ import annotations

import json
import warnings

import pytest

from replayer.payload import PromptBuilder
from replayer.trace import TraceError, hash_id_from_string, read_trace


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _row(ts, ids=(1,), n=10, **kw):
    return {"timestamp": ts, "input_length": n, "output_length": 2, "hash_ids": list(ids), **kw}


# -- A: fractional milliseconds -------------------------------------------------------------


def test_fractional_millisecond_mooncake_timestamps_are_kept_to_the_nanosecond(tmp_path):
    """Slicers and scaled traces write `55.4`: each row used to be refused ("expected an integer")."""
    p = tmp_path / "sliced.jsonl"
    p.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n'
        '{"timestamp": 55.4, "input_length": 10, "output_length": 2, "hash_ids": [2]}\n'
        '{"timestamp": 100.000001, "input_length": 10, "output_length": 2, "hash_ids": [3]}\n'
        '{"timestamp": 100.0000015, "input_length": 10, "output_length": 2, "hash_ids": [4]}\n'
        '{"timestamp": 1e2, "input_length": 10, "output_length": 2, "hash_ids": [5]}\n'
    )
    with pytest.warns(UserWarning, match="1 rows out of timestamp order"):
        t = read_trace(p)
    assert t.metadata["format"] == "mooncake"
    # 100.0000015 ms = 100,000,001.5 ns exactly as written: rounded half-even to 100,000,002
    assert t.timestamp_ns.tolist() == [0, 55_400_000, 100_000_000, 100_000_001, 100_000_002]
    assert t.source_row.tolist() == [1, 2, 5, 3, 4]


def test_fractional_timestamps_beyond_a_doubles_digits_are_read_as_written(tmp_path):
    """Epoch milliseconds with microseconds have 19 digits, more than a double holds: the offsets
    are still exact (the text is read as a decimal number)."""
    p = tmp_path / "epoch.jsonl"
    p.write_text(
        '{"timestamp": 1700000000000.123456, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n'
        '{"timestamp": 1700000000055.4, "input_length": 10, "output_length": 2, "hash_ids": [2]}\n'
        '{"timestamp": 1700000000100, "input_length": 10, "output_length": 2, "hash_ids": [3]}\n'
    )
    assert read_trace(p).timestamp_ns.tolist() == [0, 55_276_544, 99_876_544]
    arr = tmp_path / "epoch.json"  # the same rows as one JSON array
    arr.write_text("[" + ",".join(line for line in p.read_text().splitlines()) + "]")
    assert read_trace(arr).timestamp_ns.tolist() == [0, 55_276_544, 99_876_544]


def test_a_bad_fractional_timestamp_is_still_named(tmp_path):
    p = _jsonl(tmp_path / "bad.jsonl", [_row(1.5), _row(-0.5), _row("soon"), _row(2.25)])
    with pytest.raises(TraceError) as e:
        read_trace(p)
    assert [(q.row, q.field) for q in e.value.problems] == [(2, "timestamp"), (3, "timestamp")]
    assert "negative timestamp -0.5" in str(e.value) and "'soon'" in str(e.value)


# -- B: hash ids as decimal strings ---------------------------------------------------------


def test_decimal_string_hash_ids_are_the_integers_and_give_byte_identical_prompts(tmp_path):
    """How JavaScript producers write 64-bit ints: "4294967303" is the id 4294967303 (it was
    hashed as a name, so the prompts and the prefix sharing with integer ids differed)."""
    big = 2**64 - 5  # above 2**63: stored as its bit pattern, same as the integer
    ints = _jsonl(
        tmp_path / "ints.jsonl",
        [_row(0, [4294967303, 7], n=600), _row(1, [4294967303, big], n=1000), _row(2, [9007199254740993], n=3)],
    )
    strs = _jsonl(
        tmp_path / "strs.jsonl",
        [
            _row(0, ["4294967303", "7"], n=600),
            _row(1, ["4294967303", str(big)], n=1000),
            _row(2, ["9007199254740993"], n=3),
        ],
    )
    a, b = read_trace(ints), read_trace(strs)
    builder = PromptBuilder(seed=3)
    for i in range(len(a)):
        assert a.hash_ids(i).tolist() == b.hash_ids(i).tolist()
        n = int(a.input_length[i])
        assert builder.prompt_json(a.hash_ids(i), n) == builder.prompt_json(b.hash_ids(i), n)
    assert hash_id_from_string("4294967303") == 4294967303 and hash_id_from_string("0") == 0


def test_the_rule_for_every_other_string(tmp_path):
    """docs/reference/trace-formats.md "Hash ids": fixed-width hex (16 digits, a leading zero or a letter) is its
    value; any other non-empty string is a name, hashed; an empty string, a negative decimal and a
    decimal >= 2**64 are errors naming file, row and field."""
    assert hash_id_from_string("00000000000000ff") == 255
    assert hash_id_from_string("1000000000000000") == 10**15  # digits only, no leading zero: decimal
    named = {hash_id_from_string(s) for s in ("007", "block-a", " 7", "0x07", "+7", "７")}
    assert len(named) == 6 and not named & {7}
    p = _jsonl(tmp_path / "bad.jsonl", [_row(0, ["-5"]), _row(1, [str(2**64)]), _row(2, [""]), _row(3, ["12"])])
    with pytest.raises(TraceError) as e:
        read_trace(p)
    got = {(q.row, q.field): q.message for q in e.value.problems}
    assert set(got) == {(1, "hash_ids"), (2, "hash_ids"), (3, "hash_ids")}
    assert "negative hash id '-5'" in got[(1, "hash_ids")]
    assert "does not fit in 64 bits" in got[(2, "hash_ids")] and "empty string" in got[(3, "hash_ids")]
    assert str(e.value).startswith(f"{p}: row 1: hash_ids: hash_ids[0]: negative hash id")


# -- C (issue 18.5): an unsorted trace's warning is a log line ------------------------------


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_an_unsorted_trace_is_logged_as_one_line_not_a_python_warning(tmp_path, log_format):
    """It printed `.../trace/source.py:241: TraceOrderWarning: ...` and the library's source line."""
    import subprocess
    import sys

    p = _jsonl(tmp_path / "unsorted.jsonl", [_row(5, [1]), _row(0, [2])])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(p),
            "--quiet",
            "--admin-port",
            "0",
            "--results",
            str(tmp_path / "r"),
            "--log-format",
            log_format,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "out of timestamp order" in ln]
    assert len(lines) == 1, proc.stderr
    assert "TraceOrderWarning" not in proc.stderr and "source.py" not in proc.stderr
    assert "read_trace(" not in proc.stderr  # (the source line Python printed under it)
    if log_format == "json":
        rec = json.loads(lines[0])
        assert rec["level"] == "warning" and rec["logger"] == "replayer.trace"
        assert (
            rec["msg"] == f"{p}: 1 rows out of timestamp order; rows were stable-sorted by timestamp "
            "(whole rows move together)"
        )
    else:
        assert " WARNING replayer.trace: " in lines[0]


# -- D (issue 18.6): one line for a problem of the whole file -------------------------------


def _one_problem(path, **kw):
    with pytest.raises(TraceError) as e:
        read_trace(path, **kw)
    assert e.value.total == 1 and len(str(e.value).splitlines()) == 1, str(e.value)
    return e.value.problems[0]


def test_an_azure_csv_without_generated_tokens_says_so(tmp_path):
    """It fell back to generic CSV and reported four "missing required column" lines."""
    p = tmp_path / "azure.csv"
    p.write_text("TIMESTAMP,ContextTokens,Foo\n2023-11-16 18:15:46.6805900,100,5\n")
    q = _one_problem(p)
    assert q.row == 0 and q.message.startswith(
        "Azure CSV is missing GeneratedTokens (columns present: TIMESTAMP, ContextTokens, Foo)"
    )
    p.write_text("ContextTokens,GeneratedTokens\n100,5\n")
    assert _one_problem(p).message.startswith("Azure CSV is missing TIMESTAMP (")
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,100,5\n")
    assert len(read_trace(p)) == 1 and read_trace(p).metadata["format"] == "azure"


def test_a_key_missing_from_every_row_is_one_problem(tmp_path, capsys):
    """12,000 rows without output_length printed 50 lines and "... and 11950 more problems"."""
    from replayer.cli import main

    p = tmp_path / "no_output.jsonl"
    p.write_text(
        "".join(json.dumps({"timestamp": i, "input_length": 10, "hash_ids": [i]}) + "\n" for i in range(12_000))
    )
    q = _one_problem(p)
    assert (q.row, q.field) == (0, "output_length")
    assert q.message == (
        "missing from every row: no row has the key 'output_length' (keys of row 1: timestamp, input_length, "
        "hash_ids); name its column with --map output_length=COLUMN"
    )
    q = _one_problem(p, mapping="output_length=gen")
    assert "no row has the key 'gen' (--map output_length=gen)" in q.message
    assert main(["trace", "inspect", str(p)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    # missing from some rows only: each row is named, as before
    p.write_text(json.dumps(_row(0)) + "\n" + json.dumps({"timestamp": 1, "input_length": 10, "hash_ids": [1]}) + "\n")
    assert (_one_problem(p).row, _one_problem(p).message) == (2, "missing")


@pytest.mark.parametrize("name", ["trace.jsonl", "trace.csv", "trace.json"])
def test_binary_data_is_one_problem_saying_the_file_is_not_text(tmp_path, name):
    """Binary garbage gave 19 lines of "str is not valid UTF-8", one per "line"."""
    import random

    rng = random.Random(5)
    data = bytes(rng.randrange(256) for _ in range(4000))
    data = data.replace(b"\n", b"\x80") + b"\n".join(b"\xff\xfe" for _ in range(19))
    p = tmp_path / name
    p.write_bytes(data)
    q = _one_problem(p)
    assert (q.row, q.field) == (0, "file") and q.message.startswith("not a text file (byte ")
    assert ("UTF-8 CSV" if name.endswith(".csv") else "UTF-8 JSON lines") in q.message
    p.write_bytes(b'{"timestamp": 0}\n\x00\x00\x00')
    assert _one_problem(p).message.startswith("not a text file (byte 17 is 0x00)")


def test_a_parquet_or_compressed_file_named_as_text_is_named_for_what_it_is(tmp_path):
    import gzip
    import shutil
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "traces" / "mooncake_conversation_10min.parquet"
    p = tmp_path / "trace.jsonl"
    shutil.copy(src, p)
    assert _one_problem(p).message == (
        "not a text file but a Parquet file: name it .parquet (or give --format parquet)"
    )
    assert len(read_trace(p, fmt="parquet")) == 1750
    p.write_bytes(gzip.compress(json.dumps(_row(0)).encode() + b"\n"))
    assert _one_problem(p).message.startswith("not a text file but gzip-compressed data")
    csv = tmp_path / "excel.csv"
    csv.write_text("timestamp,input_length,output_length,hash_ids\n0,10,2,[1]\n", encoding="utf-16")
    assert _one_problem(csv).message.startswith("not a text file but UTF-16 text: convert it to UTF-8")


def test_a_seeded_sample_keys_any_session_id_as_a_name(tmp_path):
    """Session ids are names, not hash ids: "-5" (an error as a hash id) and "12" sample like any id."""
    from replayer.payload.prompts import mix64
    from replayer.trace.tools import slice_trace
    from replayer.trace.values import hash_name

    ids = ["-5", "12", "", "chat-1", "0000000000000010"]
    p = _jsonl(tmp_path / "s.jsonl", [_row(i, [i], session_id=s) for i, s in enumerate(ids * 40)])
    t = read_trace(p)
    kept = slice_trace(t, fraction=0.5, seed=1)
    want = {s for s in ids if mix64(mix64(1) ^ hash_name(s)) / 2**64 < 0.5}
    assert set(kept.session_id) == want and len(kept) == 40 * len(want)


# -- issue 34: a generic trace's unit, a missing column ------------------------------------


def test_generic_csv_timestamps_that_look_like_seconds_are_warned(tmp_path):
    """0, 1.5, 3 read as milliseconds (the default for generic files) without a word: a replay
    1,000 times too fast."""
    from replayer.trace import TraceUnitWarning

    p = tmp_path / "g.csv"
    p.write_text("timestamp,input_length,output_length\n0,100,10\n1.5,200,20\n3,300,5\n")
    with pytest.warns(TraceUnitWarning, match="some are fractional: if they are seconds, pass --time-unit s"):
        read_trace(p, mapping={"hash_ids": ""})
    p.write_text("timestamp,input_length,output_length\n" + "".join(f"{i // 3},100,10\n" for i in range(30)))
    with pytest.warns(TraceUnitWarning, match="30 rows span 9 ms"):  # seconds, several rows a second
        read_trace(p, mapping={"hash_ids": ""})
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceUnitWarning)
        read_trace(p, mapping={"hash_ids": ""}, time_unit="s")  # the unit given: no warning
        p.write_text("timestamp,input_length,output_length\n0,100,10\n1500,200,20\n3000,300,5\n")
        read_trace(p, mapping={"hash_ids": ""})  # milliseconds that look like milliseconds
    j = _jsonl(tmp_path / "g.jsonl", [_row(0.0), _row(0.5)])
    with pytest.warns(TraceUnitWarning):
        read_trace(j, mapping={"timestamp": "timestamp"})


def test_a_missing_column_error_suggests_map(tmp_path):
    p = tmp_path / "m.csv"
    p.write_text("timestamp,input_len,output_length\n0,100,10\n")
    with pytest.raises(TraceError) as ei:
        read_trace(p)
    assert "name its column with --map input_length=input_len" in str(ei.value)
    assert "--map hash_ids= synthesises unique ids" in str(ei.value)
    j = _jsonl(tmp_path / "m.jsonl", [{"timestamp": 0, "input_tokens": 1, "output_length": 1}])
    with pytest.raises(TraceError, match="name its column with --map input_length=input_tokens"):
        read_trace(j, mapping={"hash_ids": ""})
