"""End of a long run in bounded memory (issue 25): peak RSS of the final summary, ``replayer
report``, ``replayer merge`` and ``replayer compare`` on results folders of 250k and 2M rows.

    .venv/bin/python bench/bench_end_of_run.py [--sizes 250000,2000000] [--dir /tmp/eor]
                                               [--old-code DIR] [--steps summary,report,merge,compare]

1. Builds each results folder once (kept in ``--dir`` and reused): synthetic results written
   by the recorder itself (``replayer.record.recorder.Recorder``, schema ``replayer/core/result.py``), rolled
   every 250,000 rows into ``requests-NNNNN.parquet`` as a soak with ``--roll-rows`` leaves them.
   Output lengths are drawn from the committed Mooncake slice (mean ~354 tokens, up to 2,000),
   so each successful request holds ``output_length - 1`` ITL samples (~350, realistic lists);
   5 % fail (no ITL), 1 % have no usage; TTFT, TPOT, E2E and dispatch lag are lognormal. A
   folder above 250k rows repeats the 250k folder's results as loops of a ``--loop`` soak.
2. Runs each step in its own process and reads that process's peak RSS (its ``VmHWM`` at exit): ``summary`` = ``summarize_files(result_files(DIR))`` as the daemon calls it at
   the end of a run; ``report`` = ``replayer report DIR``; ``merge`` = ``replayer merge DIR -o
   OUT`` (exit 1 after its work: a built folder has no summary.json, so merge says it is not
   one whole run); ``compare`` = ``replayer compare DIR DIR`` (a folder without summary.json: each side is
   summarized from its files). ``--old-code DIR`` runs the steps again with the code in DIR
   (e.g. ``git archive`` of an older commit) first on ``PYTHONPATH``: the "before" column; on
   folders above 250k rows only ``--old-steps`` (default summary and compare: the old report and
   merge read the whole folder, ~13 GB per 1M rows, more than this machine can spare).
3. On each folder, compares the summaries of the two codes: counts equal, statistics within the
   sketch's relative error (``replayer.core.stats.RELATIVE_ACCURACY``) plus the old percentile
   definition's own difference (linear interpolation vs nearest rank).

Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

#: each step ends by writing its process's VmHWM (peak RSS since its exec, from /proc): the
#: ru_maxrss that wait4 reports keeps the RSS the parent had when it forked (Linux carries it
#: across exec), so a step forked from this script after it built a folder reported that instead
_HWM = (
    "import atexit, sys; atexit.register(lambda: open(sys.argv[2] + '.hwm', 'w').write("
    "next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM'))))\n"
)
STEPS = {
    "summary": "import json,sys; from replayer.record.recorder import result_files; from replayer.results.summary import summarize_files; "
    "json.dump(summarize_files(result_files(sys.argv[1])), open(sys.argv[2], 'w'))",
    "report": "import sys; from replayer.cli import main; sys.exit(main(['report', sys.argv[1], '-o', sys.argv[2] + '.html']))",
    "merge": "import sys; from replayer.cli import main; sys.exit(main(['merge', sys.argv[1], '-o', sys.argv[2] + '.merged']))",
    "compare": "import sys; from replayer.cli import main; sys.exit(main(['compare', sys.argv[1], sys.argv[1], '--json']))",
}
#: rows built result by result; a larger folder repeats them as loops (``extend``)
LOOP_ROWS = 250_000
SLICE = os.path.join(os.path.dirname(__file__), "..", "traces", "mooncake_conversation_10min.parquet")


def build(folder: str, rows: int, seed: int = 25) -> None:
    """A results folder of ``rows`` synthetic results, written by the recorder (see above)."""
    import pyarrow.parquet as pq

    from replayer.core.result import RequestResult
    from replayer.record.recorder import Recorder

    lengths = pq.read_table(SLICE, columns=["output_length"]).column(0).to_numpy()
    rng = np.random.default_rng(seed)
    rec = Recorder(
        folder,
        flush_rows=2000,
        flush_interval_s=3600,
        roll_rows=250_000,
        metadata={"replayer.t0_wall_s": "1796000000.0"},
    )
    t = time.perf_counter()
    chunk = 10_000
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        out = rng.choice(lengths, n)
        ok = rng.random(n) > 0.05
        usage = rng.random(n) > 0.01
        ttft = rng.lognormal(5, 0.6, n)
        tpot = rng.lognormal(3, 0.3, n)
        lag = rng.normal(0.2, 0.1, n)
        for i in range(n):
            row = start + i
            due = row * 2_000_000
            o = int(out[i])
            if ok[i]:
                itl = (tpot[i] * rng.lognormal(0, 0.2, max(o - 1, 0))).astype(np.float32).tolist()
                e2e = float(ttft[i] + sum(itl))
                rec.add(
                    RequestResult(
                        row=row,
                        input_length=1000,
                        output_length=o,
                        due_ns=due,
                        sent_ns=due + int(lag[i] * 1e6),
                        end_ns=due + int(e2e * 1e6),
                        outcome="success",
                        error_kind="none",
                        prompt_tokens=1000 if usage[i] else None,
                        completion_tokens=o if usage[i] else None,
                        ttft_ms=float(ttft[i]),
                        e2e_ms=e2e,
                        tpot_ms=float(tpot[i]) if o > 1 else None,
                        dispatch_lag_ms=float(lag[i]),
                        expected_prefix_hit_tokens=512,
                        itl_ms=itl,
                    )
                )
            else:
                rec.add(
                    RequestResult(
                        row=row,
                        input_length=1000,
                        output_length=o,
                        due_ns=due,
                        sent_ns=due + int(lag[i] * 1e6),
                        end_ns=due + 30_000_000,
                        outcome="failed",
                        error_kind="http_status",
                        dispatch_lag_ms=float(lag[i]),
                        error="503",
                    )
                )
    rec.close()
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".parquet"))
    print(
        f"built {folder}: {rows:,} rows, {size / 2**20:,.0f} MiB of Parquet in {time.perf_counter() - t:.0f} s",
        flush=True,
    )


def extend(small: str, folder: str, rows: int) -> None:
    """A results folder of ``rows`` rows made of ``small``'s results repeated as loops 0, 1, ...
    of a ``--loop`` soak (each loop's times after the previous one's), rolled file by rolled
    file and row group by row group (building 2M rows result by result takes too long here)."""
    import glob

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = time.perf_counter()
    os.makedirs(folder)
    files = sorted(glob.glob(os.path.join(small, "requests*.parquet")))
    per_loop = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    span = max(pq.read_table(f, columns=["end_ns"]).column(0).to_numpy(zero_copy_only=False).max() for f in files)
    n = 0
    for loop in range(-(-rows // per_loop)):
        for f in files:
            src = pq.ParquetFile(f, pre_buffer=False, buffer_size=1 << 20)
            with pq.ParquetWriter(
                os.path.join(folder, f"requests-{n:05d}.parquet"), src.schema_arrow, compression="zstd"
            ) as w:
                for g in range(src.num_row_groups):
                    tb = src.read_row_group(g)
                    i = tb.schema.get_field_index("loop")
                    tb = tb.set_column(
                        i, tb.schema.field(i), pa.array(np.full(tb.num_rows, loop), tb.schema.field(i).type)
                    )
                    for name in ("due_ns", "sent_ns", "first_token_ns", "last_token_ns", "end_ns"):
                        i = tb.schema.get_field_index(name)
                        tb = tb.set_column(
                            i, tb.schema.field(i), pc.add(tb.column(name), pa.scalar(int(loop * (span + 5e9))))
                        )
                    w.write_table(tb)
            n += 1
    print(
        f"built {folder}: {n * per_loop:,} rows ({n // len(files)} loops of {small}) in {time.perf_counter() - t:.0f} s",
        flush=True,
    )


def run_step(step: str, folder: str, out: str, code: str | None) -> tuple[float, float]:
    """(peak RSS in MiB of the step's own process, seconds)."""
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = code + os.pathsep + env.get("PYTHONPATH", "")
    t = time.perf_counter()
    # cwd: not the checkout (``python -c`` puts the cwd first on sys.path, before PYTHONPATH)
    p = subprocess.Popen(
        [sys.executable, "-c", _HWM + STEPS[step], folder, out],
        env=env,
        cwd=os.path.dirname(out),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    err = p.stderr.read()
    _, status, _ = os.wait4(p.pid, 0)
    if status and not (step == "merge" and os.waitstatus_to_exitcode(status) == 1):  # 1: "not one whole run"
        print(f"  {step} failed: {err.decode()[-500:]}", flush=True)
    with open(out + ".hwm") as f:
        return int(f.read()) / 1024, time.perf_counter() - t


def compare_summaries(old: dict, new: dict, tol: float) -> list[str]:
    """Differences beyond ``tol`` (relative) between two summaries, and any count that differs."""
    out = []
    for k, v in old.items():
        if k in ("statistics_sample_rows",) or k not in new:
            continue
        w = new[k]
        if isinstance(v, float) and isinstance(w, (int, float)):
            if abs(w - v) > tol * abs(v):
                out.append(f"{k}: {v:.6g} -> {w:.6g} ({(w - v) / v:+.3%})")
        elif v != w:
            out.append(f"{k}: {v} -> {w}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="250000,2000000")
    ap.add_argument("--dir", default="/tmp/eor")
    ap.add_argument("--old-code", default=None)
    ap.add_argument("--steps", default=",".join(STEPS))
    ap.add_argument(
        "--old-steps",
        default="summary,compare",
        help="steps the old code runs on folders above 250k rows (its report and merge read the "
        "whole folder: ~13 GB per 1M rows of these)",
    )
    args = ap.parse_args()
    from replayer.core.stats import RELATIVE_ACCURACY

    codes = ([("before", args.old_code)] if args.old_code else []) + [("after", None)]
    for rows in (int(x) for x in args.sizes.split(",")):
        folder = os.path.join(args.dir, f"rows-{rows}")
        if not os.path.isdir(folder):
            small = os.path.join(args.dir, f"rows-{min(rows, LOOP_ROWS)}")
            if not os.path.isdir(small):
                build(small, min(rows, LOOP_ROWS))
            if rows > LOOP_ROWS:
                extend(small, folder, rows)
        summaries = {}
        for label, code in codes:
            for step in (args.old_steps if code and rows > LOOP_ROWS else args.steps).split(","):
                out = os.path.join(args.dir, f"{label}-{rows}-{step}")
                rss, took = run_step(step, folder, out + ".json", code)
                print(f"{rows:>9,} rows  {label:<6}  {step:<8} peak RSS {rss:7,.0f} MB  {took:6.1f} s", flush=True)
                if step == "summary" and os.path.exists(out + ".json"):
                    summaries[label] = json.load(open(out + ".json"))
        if len(summaries) == 2:
            diffs = compare_summaries(summaries["before"], summaries["after"], RELATIVE_ACCURACY)
            print(
                f"  summary after vs before: {len(diffs)} fields beyond {RELATIVE_ACCURACY:.1%}"
                + "".join(f"\n    {d}" for d in diffs),
                flush=True,
            )


if __name__ == "__main__":
    main()
