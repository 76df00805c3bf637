"""The walk of one request (docs/architecture.md, "One row's walk"): a one-row Parquet trace is
replayed in this process against the simulator in its own process, and the modules the request's
path executes are recorded; they are the walk the page writes down: its path from the file to
the results row, at most 25 modules, and the branches at the fan-out (the subscribers beside the
recorder: metrics, live window, verdicts...). The only code of ``replayer.run`` among them is the
event stream's implementation (with the run's own subscribers).

How the path is recorded: ``sys.setprofile`` and ``threading.setprofile`` (the trace reader and
the results writer run in threads) see every call and return in the process. A call is on the
request's path when one of its arguments, or the value it returns or yields, is one of the row's
carriers: the reader's raw columns and trace batch, the schedule batch, the prepared request, the
request's exchange (its stream accumulator and SSE decoder, the connection while the exchange is
its own), its moments and latencies, its result, and the Arrow batches and tables the reader and the recorder make of it.
With one row, every such object is that row's. Recording stops when the finish begins (the row is
on disk by then). The launcher process is off (``launcher: false``): with it, a request can also be
written by ``http/launcher`` and, in its own process, ``http/launchproc`` (the page says so).
"""

from __future__ import annotations

import asyncio
import re
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
TRACE = ROOT / "traces" / "mooncake_conversation_10min.parquet"
MAX_MODULES = 25
#: the run's code a request's path may run: the event stream's one implementation (its own subscribers in it)
RUN_ON_PATH = {"run/fanout"}


def _carrier_types() -> tuple[type, ...]:
    from replayer.core import Latencies, PreparedRequest, RequestResult, Timestamps
    from replayer.http import SSEDecoder, StreamAccumulator
    from replayer.http.connection import Exchange
    from replayer.plan.schedule import ScheduleBatch
    from replayer.trace import Trace
    from replayer.trace.columns import _Raw

    return (
        _Raw,
        Trace,
        ScheduleBatch,
        PreparedRequest,
        Exchange,
        StreamAccumulator,
        SSEDecoder,
        Timestamps,
        Latencies,
        RequestResult,
        pa.RecordBatch,
        pa.Table,
    )


class PathRecorder:
    """The profile hook (module docstring): ``modules`` collects ``pkg/module`` names."""

    def __init__(self) -> None:
        self.types = _carrier_types()
        from replayer.http import Connection

        self.connection = Connection
        self.modules: set[str] = set()
        self.on = True
        self.error: Exception | None = None

    def _carries(self, v: object) -> bool:
        if isinstance(v, self.types):
            return True
        if isinstance(v, list | tuple) and v and isinstance(v[0], self.types):
            return True
        # (a connection while the request's exchange is its own; one being built has none yet)
        return isinstance(v, self.connection) and getattr(v, "ex", None) is not None

    def __call__(self, frame, event: str, arg: object):
        if not self.on or event not in ("call", "return"):
            return
        try:
            self._see(frame, event, arg)
        except Exception as e:  # (a hook that raises is switched off by Python: fail loudly instead)
            self.error = e
            self.on = False

    def _see(self, frame, event: str, arg: object) -> None:
        name = frame.f_globals.get("__name__", "")
        if name == "replayer.run.finish":  # the finish: the row is on disk
            self.on = False
            return
        if not name.startswith("replayer."):
            return
        if event == "return":
            hit = self._carries(arg)
        else:
            code = frame.f_code
            args = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
            hit = any(self._carries(frame.f_locals.get(a)) for a in args)
        if hit:
            self.modules.add(name.removeprefix("replayer.").replace(".", "/"))


def _walk_on_page() -> tuple[list[str], list[str]]:
    """The modules the page's walk names: its numbered list (the path, in order) and its bulleted
    list (the branches at the fan-out: the subscribers beside the recorder)."""
    text = PAGE.read_text()
    section = text.split("## One row's walk", 1)[1].split("\n## ", 1)[0]
    path = re.findall(r"^\d+\. `([a-z_/]+)`", section, flags=re.M)
    branches = re.findall(r"^- `([a-z_/]+)`", section, flags=re.M)
    return path, branches


def test_one_rows_walk_is_the_pages_and_never_calls_back_into_the_run(tmp_path, sim_process):
    from replayer.config import load_config
    from replayer.run import run_replay

    trace = tmp_path / "one.parquet"
    pq.write_table(pq.read_table(TRACE).slice(0, 1), trace)
    url, _ = sim_process("--itl-base-ms", "1")
    cfg = load_config(
        {
            "trace": str(trace),
            "target": url,
            "results": str(tmp_path / "r"),
            "admin_port": 0,
            "quiet": True,
            "scrape_target_metrics": False,
            "warm_connections": 1,
            "launcher": False,
        }
    )
    rec = PathRecorder()
    sys.setprofile(rec)
    threading.setprofile(rec)
    try:
        summary = asyncio.run(run_replay(cfg, registry=CollectorRegistry()))
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    assert summary["completed"] == 1 and rec.error is None, rec.error
    walked = rec.modules
    assert {m for m in walked if m.startswith("run/")} <= RUN_ON_PATH  # no call back into the run
    path, branches = _walk_on_page()
    assert len(path) == len(set(path)) <= MAX_MODULES and not set(path) & set(branches)
    on_page = set(path) | set(branches)
    assert on_page == walked, f"on the page only: {sorted(on_page - walked)}; walked only: {sorted(walked - on_page)}"
    assert len(walked - set(branches)) <= MAX_MODULES
