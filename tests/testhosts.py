"""The project's own test hosts: Linux network namespaces on one bridge (tests only).

``TestHosts(["target", "a", "b"])`` makes a namespace per host, each with its own address on a
private /24 and a veth into a bridge that lives in a namespace of its own (``<prefix>-hub``), so
nothing is added to the machine's own network. ``run(host, cmd)`` starts a process on a host,
``start(host, cmd, log)`` one whose stderr goes to a file, ``call(host, cmd)`` runs one to its end
and returns its output. ``link(host, up=False)`` cuts a host off by its own interface (down: it can
send nothing, packets to it are dropped); ``port(host, up=False)`` by its port on the bridge (the
host's interface stays up, as when the switch drops it: packets either way are dropped); ``up=True``
brings it back. ``close()`` ends the processes started on the hosts (and any left in the
namespaces) and removes the namespaces. Needs root and iproute2 (``available()`` says why not).
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

_seq = itertools.count()


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if shutil.which("ip") is None:
        return "needs iproute2 (Debian: iproute2)"
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    probe = f"rpprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        return f"cannot make a network namespace here: {e}"
    _ip("netns", "del", probe)
    return None


class TestHosts:
    """Hosts ``names`` on one bridge, addresses 10.(200+k).(pid).(i+1)."""

    __test__ = False  # (not a test class)

    def __init__(self, names: Sequence[str]) -> None:
        pid = os.getpid()
        # a fresh prefix per instance: one whose namespaces could not be removed blocks no other
        self.prefix = f"rp{pid % 100000}x{next(_seq)}"
        self.subnet = f"10.{200 + pid % 50}.{pid // 50 % 250}"
        self.names = list(names)
        self.hub = f"{self.prefix}-hub"
        self.procs: list[subprocess.Popen] = []
        self._made: list[str] = []
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    def ns(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def addr(self, name: str) -> str:
        return f"{self.subnet}.{self.names.index(name) + 1}"

    def _make(self) -> None:
        _ip("netns", "add", self.hub)
        self._made.append(self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        for i, name in enumerate(self.names):
            ns = self.ns(name)
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            # the pair is made inside the host's namespace, its other end moved into the hub's
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}")
            _ip("-n", ns, "link", "set", f"p{i}", "netns", self.hub)
            _ip("-n", self.hub, "link", "set", f"p{i}", "master", "br0")
            _ip("-n", self.hub, "link", "set", f"p{i}", "up")
            _ip("-n", ns, "addr", "add", f"{self.addr(name)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def run(self, name: str, cmd: Sequence[str], **popen: object) -> subprocess.Popen:
        """Start ``cmd`` on host ``name`` (``popen``: as for ``subprocess.Popen``); ended at ``close``."""
        p = subprocess.Popen(["ip", "netns", "exec", self.ns(name), *cmd], **popen)  # type: ignore[call-overload]
        self.procs.append(p)
        return p

    def start(self, name: str, cmd: Sequence[str], log: Path) -> subprocess.Popen:
        """Start ``cmd`` on host ``name``, its stderr written to ``log`` (its stdout dropped)."""
        with open(log, "wb") as fh:
            return self.run(name, cmd, stderr=fh, stdout=subprocess.DEVNULL)

    def call(self, name: str, cmd: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess:
        """Run ``cmd`` on host ``name`` to its end; its exit status, stdout and stderr (text)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.ns(name), *cmd], capture_output=True, text=True, timeout=timeout
        )

    def link(self, name: str, up: bool = True) -> None:
        """Host ``name``'s own interface up, or down (the host is off the network)."""
        _ip("-n", self.ns(name), "link", "set", "eth0", "up" if up else "down")

    def port(self, name: str, up: bool = True) -> None:
        """Host ``name``'s port on the bridge up, or down (the host's interface stays up; its packets
        and those sent to it are dropped)."""
        _ip("-n", self.hub, "link", "set", f"p{self.names.index(name)}", "up" if up else "down")

    def close(self) -> None:
        """End the processes started here (SIGTERM, then SIGKILL after 10 s), kill any left in the
        namespaces, remove the namespaces."""
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        self.procs.clear()
        for ns in reversed(self._made):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (OSError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self._made.clear()
