import json
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


def free_port() -> int:
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


@pytest.fixture
def mooncake_slice(tmp_path):
    """Write the first `seconds` of the real Mooncake conversation trace as JSONL."""

    def make(seconds: float, name: str = "slice.jsonl") -> Path:
        out = tmp_path / name
        with open(MOONCAKE) as src, open(out, "w") as dst:
            for line in src:
                if json.loads(line)["timestamp"] < seconds * 1000:
                    dst.write(line)
        return out

    return make


@pytest.fixture
def sim_process(tmp_path):
    """Start `replayer sim` in a child process; yields (base_url, record_file). The simulator
    binds port 0 and says which port it got (its first stderr line): no free port is picked
    ahead, which a parallel test's connection could take in between."""
    procs = []

    def start(*args: str):
        n = len(procs)
        rec = tmp_path / f"received-{n}.jsonl"
        err = tmp_path / f"sim-{n}.stderr"
        with open(err, "wb") as fh:
            p = subprocess.Popen([sys.executable, "-m", "replayer", "sim", "--port", "0",
                                  "--record-requests", str(rec), *args], stderr=fh)
        procs.append(p)
        url = wait_sim_url(p, err)
        wait_http(url + "/health")
        return url, rec

    yield start
    for p in procs:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
