"""The project's own test hosts: Linux network namespaces on one bridge (tests only).

``TestHosts(["target", "a", "b"])`` makes a namespace per host, each with its own address on a
private /24 and a veth into a bridge that lives in a namespace of its own (``<prefix>-hub``), so
nothing is added to the machine's own network. ``run(host, cmd)`` starts a process on a host;
``link(host, up=False)`` cuts a host off (its interface down: packets to it are dropped) and
``link(host)`` brings it back. ``close()`` ends the processes left in the namespaces and removes
them. Needs root and iproute2 (``available()`` says why not).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


def available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if shutil.which("ip") is None:
        return "needs iproute2 (Debian: iproute2)"
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    probe = f"rpprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (subprocess.CalledProcessError, OSError) as e:
        return f"cannot make a network namespace here: {getattr(e, 'stderr', b'').decode(errors='replace') or e}"
    _ip("netns", "del", probe)
    return None


class TestHosts:
    """Hosts ``names`` on one bridge, addresses 10.(200+k).(pid).(i+1)."""

    __test__ = False  # (not a test class)

    def __init__(self, names: Sequence[str]) -> None:
        pid = os.getpid()
        self.prefix = f"rp{pid % 100000}"
        self.subnet = f"10.{200 + pid % 50}.{pid // 50 % 250}"
        self.names = list(names)
        self.hub = f"{self.prefix}-hub"
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
        """Start ``cmd`` on host ``name``."""
        return subprocess.Popen(["ip", "netns", "exec", self.ns(name), *cmd], **popen)  # type: ignore[call-overload]

    def link(self, name: str, up: bool = True) -> None:
        """Host ``name`` on the network (``up``) or cut off from it."""
        _ip("-n", self.ns(name), "link", "set", "eth0", "up" if up else "down")

    def close(self) -> None:
        for ns in reversed(self._made):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for p in pids:
                try:
                    os.kill(int(p), 9)
                except (OSError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()
