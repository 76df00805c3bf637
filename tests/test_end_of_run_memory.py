"""The end of a long run in bounded memory (issue 25): a SIGTERM'd run whose folder holds a
long soak's results still writes its summary under a memory limit its own replay fits in."""

import json
import resource
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from conftest import free_port, wait_http

from replayer.core.result import SCHEMA

#: address-space limit of the resumed run (RLIMIT_AS: every mapping counts, so ~2.1 GB of it is
#: the replay's own threads, arenas and libraries, measured as VmPeak while it ran): generously
#: above the run and its bounded end (~0.2 GB more), below what reading the folder whole at the
#: end took (~2.7 GB more: the earlier code is killed by it and writes no summary.json)
LIMIT_BYTES = 3_500 * 2**20
#: rows of earlier loops written into the folder, ~350 ITL samples each (70M samples in all)
ROWS, ITL_PER_ROW = 200_000, 350


def _earlier_loops(like: str, path: str) -> None:
    """Results of loops 1000.. (the recorder's schema and file metadata, copied from ``like``;
    rows of loops the resumed run never reaches before its SIGTERM), in 50k-row groups."""
    rng = np.random.default_rng(25)
    schema = SCHEMA.with_metadata(pq.read_schema(like).metadata)
    with pq.ParquetWriter(path, schema, compression="zstd") as w:
        for start in range(0, ROWS, 50_000):
            n = 50_000
            itl = np.round(rng.lognormal(3, 0.3, n * ITL_PER_ROW), 2).astype(np.float32)
            cols = {name: pa.nulls(n, SCHEMA.field(name).type) for name in SCHEMA.names}
            ms = pa.array(rng.lognormal(5, 0.5, n))
            cols.update(
                loop=pa.array(1000 + (start + np.arange(n)) // 100_000),
                row=pa.array((start + np.arange(n)) % 100_000),
                due_ns=pa.array(np.arange(n) * 1_000_000),
                sent_ns=pa.array(np.arange(n) * 1_000_000),
                end_ns=pa.array(np.arange(n) * 1_000_000 + 9_000_000),
                outcome=pa.array(["success"] * n),
                error_kind=pa.array(["none"] * n),
                endpoint=pa.array(["/v1/completions"] * n),
                prompt_tokens=pa.array(np.full(n, 100)),
                completion_tokens=pa.array(np.full(n, ITL_PER_ROW + 1)),
                input_length=pa.array(np.full(n, 100)),
                output_length=pa.array(np.full(n, ITL_PER_ROW + 1)),
                ttft_ms=ms,
                e2e_ms=ms,
                tpot_ms=ms,
                dispatch_lag_ms=ms,
                itl_ms=pa.ListArray.from_arrays(
                    pa.array(np.arange(n + 1, dtype=np.int32) * ITL_PER_ROW), pa.array(itl)
                ),
            )
            w.write_table(pa.table([cols[name].cast(SCHEMA.field(name).type) for name in SCHEMA.names], schema=schema))


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))


def _run(args, **kw):
    return subprocess.Popen(
        [sys.executable, "-m", "replayer", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def test_sigterm_under_a_memory_limit_still_writes_the_summary(tmp_path, mooncake_slice, sim_process):
    trace = mooncake_slice(60)
    url, _ = sim_process("--itl-base-ms", "40")  # ~300 tokens x 40 ms: still running at SIGTERM
    res = tmp_path / "r"
    port = free_port()
    p = _run(
        [
            str(trace),
            "--target",
            url,
            "--speedup",
            "10",
            "--loop",
            "forever",
            "--results",
            str(res),
            "--admin-port",
            str(port),
            "--drain-timeout",
            "1",
            "--quiet",
        ]
    )
    wait_http(f"http://127.0.0.1:{port}/readyz", 60)
    time.sleep(2)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, err[-2000:]
    (res / "summary.json").unlink()  # the summary checked below is the resumed run's own
    # the folder of a long soak: earlier loops' results, rolled as the recorder rolls them
    _earlier_loops(str(res / "requests.parquet"), str(res / "requests-00000.parquet"))
    port = free_port()
    p = _run(
        [
            "--resume",
            str(res),
            str(trace),
            "--target",
            url,
            "--speedup",
            "10",
            "--loop",
            "forever",
            "--admin-port",
            str(port),
            "--drain-timeout",
            "1",
            "--quiet",
        ],
        preexec_fn=_limit,
    )
    wait_http(f"http://127.0.0.1:{port}/readyz", 60)
    time.sleep(2)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 128 + signal.SIGTERM, err[-3000:]
    s = json.loads((res / "summary.json").read_text())
    assert s["stopped_early"] is True and s["stop_signal"] == "SIGTERM"
    assert s["scheduled"] > ROWS and s["completed"] >= ROWS
    assert s["itl_ms_count"] >= ROWS * ITL_PER_ROW and s["runs"] == 2
    assert "itl_ms" in s["percentiles_sketched"]
