"""Every background task of a run is owned: one that crashes is seen (logged, told, in the summary)
and stops the run cleanly (drain, flush, exit 4) instead of vanishing in an unawaited task."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys

import pyarrow.parquet as pq

from replayer.core.background import BackgroundTasks


def test_a_task_that_raises_is_logged_and_told_and_close_awaits_the_others(caplog):
    async def main():
        told = asyncio.get_running_loop().create_future()
        bg = BackgroundTasks(on_failure=lambda name, exc: told.set_result((name, exc)))
        go, cancelled = asyncio.Event(), asyncio.Event()

        async def broken() -> None:
            await go.wait()
            raise OSError(28, "No space left on device")

        async def forever() -> None:
            try:
                await asyncio.Event().wait()
            finally:
                cancelled.set()

        async def done_early() -> None:  # a task that returns is no failure
            return None

        bg.start("results flush", broken())
        bg.start("self-watch", forever())
        bg.start("parent watch", done_early())
        go.set()
        name, exc = await asyncio.wait_for(told, 60)
        assert name == "results flush" and isinstance(exc, OSError)
        assert not cancelled.is_set()  # the others go on until the run's end closes them
        await bg.close()
        assert cancelled.is_set()
        return bg.failures

    with caplog.at_level(logging.ERROR, logger="replayer"):
        failures = asyncio.run(main())
    assert failures == [{"task": "results flush", "error": "OSError: [Errno 28] No space left on device"}]
    rec = [r for r in caplog.records if "background task 'results flush' failed" in r.getMessage()]
    assert len(rec) == 1 and rec[0].exc_info is not None  # with its traceback


def test_a_live_view_that_fails_is_logged_and_the_run_goes_on(caplog):
    async def main():
        told: list[str] = []
        bg = BackgroundTasks(on_failure=lambda name, exc: told.append(name))

        async def broken_terminal() -> None:
            raise BrokenPipeError(32, "Broken pipe")

        bg.start("progress", broken_terminal(), essential=False)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        await bg.close()
        return told, bg.failures

    with caplog.at_level(logging.ERROR, logger="replayer"):
        told, failures = asyncio.run(main())
    assert told == [] and failures == []  # not a reason to stop a soak
    assert any(
        "background task 'progress' failed" in r.getMessage() and "goes on" in r.getMessage() for r in caplog.records
    )


def test_close_sees_a_task_that_fails_as_it_is_cancelled():
    async def main():
        bg = BackgroundTasks()
        started = asyncio.Event()

        async def fails_on_cancel() -> None:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                raise ValueError("cleanup failed") from None

        bg.start("target samples flush", fails_on_cancel())
        await started.wait()
        await bg.close()
        return bg.failures

    assert asyncio.run(main()) == [{"task": "target samples flush", "error": "ValueError: cleanup failed"}]


_CHILD = """
import sys
import replayer.observe.looplag as m

async def broken(self):
    raise RuntimeError("lag monitor broke")

m.EventLoopLagMonitor.run = broken
from replayer.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_crashed_background_task_stops_the_run_which_drains_flushes_and_exits_4(tmp_path):
    # 10 rows 100 s apart at speed-up 1: without the stop the run would take 15 minutes
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": i * 100_000, "input_length": 16, "output_length": 2, "hash_ids": [i]}) + "\n"
            for i in range(10)
        )
    )
    res = tmp_path / "r"
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _CHILD,
            "run",
            str(trace),
            "--block-size",
            "16",
            "--speedup",
            "1",
            "--results",
            str(res),
            "--admin-port",
            "0",
            "--quiet",
            "--no-scrape-target-metrics",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = p.communicate(timeout=180)
    finally:
        p.kill()
    assert p.returncode == 4, err[-3000:]
    assert "background task 'event-loop lag' failed: RuntimeError: lag monitor broke" in err
    assert "Traceback" in err and "a background task failed (event-loop lag" in err
    s = json.loads((res / "summary.json").read_text())
    assert s["task_failures"] == [{"task": "event-loop lag", "error": "RuntimeError: lag monitor broke"}]
    assert s["stopped_early"] is True and s["stop_signal"] is None
    rows = pq.read_table(res / "requests.parquet").to_pylist()
    assert sorted(r["row"] for r in rows) == list(range(10))  # every row accounted for, flushed
    assert s["sent"] + s["not_started"] == s["scheduled"] == 10 and s["not_started"] >= 1
