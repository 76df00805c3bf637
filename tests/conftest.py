import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MOONCAKE = SHARED / "traces" / "mooncake_conversation.jsonl"
SLICE_10MIN = ROOT / "traces" / "mooncake_conversation_10min.parquet"
SLICE_SECONDS = 600  # SLICE_10MIN is the first 600 s of MOONCAKE


def slice_rows() -> list[dict]:
    """SLICE_10MIN's rows as dicts (its columns in the order of MOONCAKE's keys)."""
    import pyarrow.parquet as pq

    return pq.read_table(SLICE_10MIN).to_pylist()


def _port_span() -> tuple[int, int] | None:
    """This test process's share of the ports below the kernel's ephemeral range (None: no room).

    A port picked ahead for a child process stays free until the child binds it only if nothing
    else takes it in between: outgoing connections take their source ports from the ephemeral
    range (Linux: ``ip_local_port_range``, 32768-60999 by default), so the ports below it are
    never taken that way, and each pytest-xdist worker picks from its own slice of them."""
    try:
        low_ephemeral = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    lo, hi = 10_000, low_ephemeral
    if hi - lo < 1000:
        return None
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    span = (hi - lo) // max(workers, 1)
    return lo + (worker % max(workers, 1)) * span, lo + (worker % max(workers, 1) + 1) * span


def free_port() -> int:
    """A 127.0.0.1 port free now that no outgoing connection or other test process will take
    (``_port_span``); a kernel-chosen one where the ephemeral range leaves no room below it."""
    span = _port_span()
    if span is not None:
        for _ in range(200):
            port = random.randrange(*span)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(url)
        time.sleep(0.1)


def start_up_lead(trace, processes: int) -> float:
    """Seconds to give ``processes`` replays started at once to be ready (a shared ``--start-at``,
    a coordinator's ready timeout): four times the time one process takes now to import and read
    ``trace`` (``trace inspect``), times the processes sharing each CPU (a replay is two: its
    launcher's too); at least 5 s. Measured on this machine now, so a busy host gets a longer lead
    and a quiet one does not wait out a busy one's."""
    t = time.monotonic()
    subprocess.run([sys.executable, "-m", "replayer", "trace", "inspect", str(trace)], capture_output=True, check=True)
    one_s = time.monotonic() - t
    return max(5.0, 4.0 * one_s * max(1.0, 2 * processes / (os.cpu_count() or 1)))


def wait_sim_url(p: subprocess.Popen, stderr_file: Path, timeout: float = 60.0) -> str:
    """The URL a `replayer sim` child serves at, from its "serving at URL" line on stderr."""
    deadline = time.monotonic() + timeout
    while True:
        for line in stderr_file.read_text(errors="replace").splitlines():
            if " serving at " in line:
                return line.rsplit(" serving at ", 1)[1].strip()
        if p.poll() is not None:
            raise AssertionError(f"replayer sim exited {p.returncode}: {stderr_file.read_text(errors='replace')}")
        if time.monotonic() > deadline:
            raise TimeoutError("replayer sim did not say where it serves")
        time.sleep(0.05)


#: the longest response a test needs when it checks prompts, rows, counts or log lines, not the
#: responses' length: a replay ends with its longest response, and the slice's first minute has
#: one of 929 tokens (~10 s at the simulator's default 10 ms per token)
SHORT_OUTPUT = 8


def write_slice(out: Path, seconds: float, max_output: int | None = None) -> Path:
    """Write the first ``seconds`` of the real Mooncake conversation trace to ``out`` as JSONL. Up
    to 600 s from the committed slice (`traces/`: the same rows, written as the same bytes, as
    test_trace_files checks), so these tests need nothing beside the checkout; longer from
    ../shared. ``max_output``: each row's output_length capped at that many tokens (e.g.
    ``SHORT_OUTPUT``), for a test that does not need the trace's long responses."""

    with open(out, "w") as dst:

        def write(row: dict) -> None:
            if max_output is not None:
                row["output_length"] = min(row["output_length"], max_output)
            dst.write(json.dumps(row) + "\n")

        if seconds <= SLICE_SECONDS:
            for row in slice_rows():
                if row["timestamp"] < seconds * 1000:
                    write(row)
            return out
        with open(MOONCAKE) as src:
            for line in src:
                row = json.loads(line)
                if row["timestamp"] < seconds * 1000:
                    if max_output is None:
                        dst.write(line)
                    else:
                        write(row)
    return out


@pytest.fixture
def mooncake_slice(tmp_path):
    """``write_slice`` into this test's folder: ``make(seconds, name="slice.jsonl", max_output=None)``."""

    def make(seconds: float, name: str = "slice.jsonl", max_output: int | None = None) -> Path:
        return write_slice(tmp_path / name, seconds, max_output)

    return make


@contextlib.contextmanager
def simulator(folder: Path, *args: str, name: str = "sim"):
    """``replayer sim`` in a child process for the block; yields (base_url, record_file), the
    requests it received written to ``folder/NAME-received.jsonl``. The simulator binds port 0
    and says which port it got (its first stderr line): no free port is picked ahead, which a
    parallel test's connection could take in between."""
    rec = folder / f"{name}-received.jsonl"
    err = folder / f"{name}.stderr"
    with open(err, "wb") as fh:
        p = subprocess.Popen(
            [sys.executable, "-m", "replayer", "sim", "--port", "0", "--record-requests", str(rec), *args],
            stderr=fh,
        )
    try:
        url = wait_sim_url(p, err)
        wait_http(url + "/health")
        yield url, rec
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


@pytest.fixture
def sim_process(tmp_path):
    """Start ``simulator(tmp_path, *args)`` for this test: ``start(*args)`` -> (base_url, record_file)."""
    with contextlib.ExitStack() as stack:
        started = []

        def start(*args: str):
            started.append(args)
            return stack.enter_context(simulator(tmp_path, *args, name=f"sim-{len(started) - 1}"))

        yield start


def _known_durations() -> dict[str, float]:
    """tests/durations.txt: node id -> seconds, for the slowest tests."""
    known: dict[str, float] = {}
    for line in (Path(__file__).parent / "durations.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            secs, nodeid = line.split(maxsplit=1)
            known[nodeid] = known.get(nodeid, 0.0) + float(secs)
    return known


def _chunk_starts(n: int, workers: int) -> list[int]:
    """Where each worker's first share of ``n`` items starts: pytest-xdist's worksteal scheduler
    sends ``pending // nodes_remaining`` contiguous items to each idle worker in turn."""
    starts, at = [], 0
    for i in range(workers):
        starts.append(at)
        at += (n - at) // (workers - i)
    return starts


def _shared_fixtures(item) -> set[str]:
    """The fixtures of ``item`` set up once for several tests (module, class or package scope)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    return {
        name
        for name, defs in info.name2fixturedefs.items()
        if defs and defs[-1].scope in ("module", "class", "package")
    }


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist's worksteal, the slowest tests (tests/durations.txt) head each worker's
    first share, dealt longest first to the least loaded: worksteal steals from the tail of a
    queue, so they run first on their worker and the run does not end waiting on one long test
    that started last. A slow test takes along the tests of its module that share one of its
    module-scoped fixtures (set up once, not twice). Every worker computes the same order
    (xdist checks that the collections are equal)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers < 2 or config.getoption("dist", "no") != "worksteal":
        return
    known = _known_durations()
    slow = sorted((it for it in items if it.nodeid in known), key=lambda it: -known[it.nodeid])
    taken: set[int] = set()
    units: list[tuple[float, list]] = []
    for it in slow:
        if id(it) in taken:
            continue
        shared = _shared_fixtures(it)
        unit = [it] + [
            o
            for o in items
            if o is not it
            and id(o) not in taken
            and getattr(o, "module", None) is getattr(it, "module", None)
            and shared & _shared_fixtures(o)
        ]
        taken.update(id(o) for o in unit)
        units.append((sum(known.get(o.nodeid, 0.0) for o in unit), unit))
    if not units:
        return
    rest = [it for it in items if id(it) not in taken]
    buckets: list[list] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for secs, unit in sorted(units, key=lambda u: -u[0]):  # longest first, to the least loaded worker
        k = loads.index(min(loads))
        buckets[k] += unit
        loads[k] += secs
    starts = _chunk_starts(len(items), workers) + [len(items)]
    ordered: list = []
    for k in range(workers):
        take = max(0, starts[k + 1] - starts[k] - len(buckets[k]))
        ordered += buckets[k] + rest[:take]
        rest = rest[take:]
    items[:] = ordered + rest


def replay_command(trace, url: str | None, results, *extra: str, model: str | None = "m") -> list[str]:
    """``replayer run TRACE --target URL --model MODEL`` into ``results``, quiet, with no admin port
    of its own and no target scraping: the command the tests against test servers share. ``url``
    None: the embedded simulator; ``model`` None: the model the target serves (a simulator's)."""
    cmd = [sys.executable, "-m", "replayer", "run", str(trace)]
    cmd += ["--target", url] if url is not None else []
    cmd += ["--model", model] if model is not None else []
    return cmd + ["--results", str(results), "--admin-port", "0", "--quiet", "--no-scrape-target-metrics", *extra]


def replay_against(
    trace, url: str | None, results, *extra: str, model: str | None = "m", timeout: float = 120
) -> subprocess.CompletedProcess:
    """``replay_command`` run to its end, its output captured as text."""
    cmd = replay_command(trace, url, results, *extra, model=model)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
