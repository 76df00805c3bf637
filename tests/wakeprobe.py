"""How late a normal-priority process gets to run on this host, over time (tests only).

``WakeProbe`` runs a child process that sleeps 1 ms again and again and records, for every sleep,
when it began and how much later than asked it woke (CLOCK_MONOTONIC ns, comparable across
processes on Linux). A test that compares the timing of another process (e.g. the capture proxy)
with a bound uses ``allowance_ms``: the largest overshoot the probe saw around each moment, i.e.
the part of a delay that the host, not the process under test, caused.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import numpy as np

_CHILD = r"""
import signal, sys, time
import numpy as np
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
t, o = [], []
while not stop:
    a = time.perf_counter_ns()
    time.sleep(0.001)
    b = time.perf_counter_ns()
    t.append(a)
    o.append(b - a - 1_000_000)
np.save(sys.argv[1], np.array([t, o], dtype=np.int64))
"""


class WakeProbe:
    def __init__(self, path) -> None:
        self.path = str(path)
        self.proc: subprocess.Popen | None = None
        self.t = self.over = None

    def __enter__(self) -> "WakeProbe":
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD, self.path])
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)
            t, o = np.load(self.path if self.path.endswith(".npy") else self.path + ".npy")
            self.t, self.over = t, np.maximum(o, 0)

    def __exit__(self, *exc) -> None:
        self.stop()

    def allowance_ms(self, at_ns: np.ndarray, late_ms: np.ndarray, margin_ms: float = 20.0) -> np.ndarray:
        """Per moment ``at_ns`` (a late event's observed time) with lateness ``late_ms``: the largest
        probe overshoot among sleeps that began in [at - late - margin, at + margin]."""
        self.stop()
        out = np.zeros(len(at_ns))
        lo = np.searchsorted(self.t, at_ns - (late_ms + margin_ms) * 1e6)
        hi = np.searchsorted(self.t, at_ns + margin_ms * 1e6, side="right")
        for i, (a, b) in enumerate(zip(lo, hi)):
            if b > a:
                out[i] = self.over[a:b].max() / 1e6
        return out
