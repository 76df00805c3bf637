"""One writer per results folder: an exclusive lock on ``FOLDER/replayer.lock``.

A run (with ``--resume``/``--resume-existing`` too: a resumed run is a writer), ``--workers``'
parent, ``merge -o`` and retention (which runs inside the run, under its lock) write a results
folder; two at once lose rows silently (each one's parts, rolls and checkpoint overwrite the
other's). ``hold`` takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on the lock file and writes the
holder's record in it (PID, host, start time, command); a second writer is refused at once with
``FolderBusy`` naming the holder (the run exits 2). The kernel drops a flock when its process
dies (SIGKILL included), so a record whose lock is free is stale: it is taken over, with a
warning naming the dead holder.

On a filesystem where flock does not work (``ENOLCK``/``EOPNOTSUPP``: some NFS mounts without a
lock daemon), the record itself is the lock: a record of a live process on this host, or of any
process on another host (whose liveness cannot be seen from here), refuses the folder, naming
the file to remove once that holder is known to be gone; a record of a dead process on this host
is taken over with a warning. Two writers starting within the same instant there can still both
pass (there is no atomic check-and-write without locks): the warning at start says so.

Within one process the lock is re-entrant (the ``--workers`` parent merges into the folder it
holds); the file is removed when its last holder lets go.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator

log = logging.getLogger(__name__)

__all__ = ["LOCK_FILE", "FolderBusy", "FolderLock", "hold", "holder"]

#: the lock file's name inside the results folder
LOCK_FILE = "replayer.lock"

#: errno values meaning "this filesystem does not do flock" (not "someone holds it")
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL}

#: this process's held locks: folder (real path) -> [lock, depth]
_HELD: dict[str, list] = {}


class FolderBusy(Exception):
    """The results folder has another writer (the message names it)."""


def _record(role: str) -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "role": role,
        "command": " ".join(sys.argv[:1] + sys.argv[1:3]),
    }


def _read(fd: int) -> dict | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, 65536)
        rec = json.loads(raw) if raw.strip() else None
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def holder(folder: str) -> dict | None:
    """The record in ``folder``'s lock file (its holder, or a stale one's), or None."""
    try:
        fd = os.open(os.path.join(folder, LOCK_FILE), os.O_RDONLY)
    except OSError:
        return None
    try:
        return _read(fd)
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (someone else's process: alive)
        return True
    return True


def describe(rec: dict | None) -> str:
    """The holder in words: 'PID 12 on host h since T (replayer run)'."""
    if not rec:
        return "a writer whose lock record is empty (starting, or not a replayer)"
    return (
        f"PID {rec.get('pid')} on host {rec.get('host')} since {rec.get('started')}"
        f" ({rec.get('command') or rec.get('role') or 'replayer'})"
    )


class FolderLock:
    """The lock on one results folder; ``acquire`` raises FolderBusy when another writer holds it."""

    def __init__(self, folder: str, role: str = "run") -> None:
        self.folder = folder
        self.path = os.path.join(folder, LOCK_FILE)
        self.role = role
        self.fd: int | None = None
        self.advisory_only = False  # True where flock does not work (the record is the lock)

    def acquire(self) -> None:
        for _ in range(20):  # (retry only when the file was replaced while we waited for it)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if self._lock(fd):
                    self.fd = fd
                    return
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        raise FolderBusy(f"{self.folder}: its lock file keeps being replaced: another writer is starting")

    def _lock(self, fd: int) -> bool:
        """Lock ``fd``; False when the file at ``self.path`` is no longer ``fd``'s (retry)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderBusy(self._busy(_read(fd))) from None
        except OSError as e:
            if e.errno not in _NO_LOCKS:
                raise
            self._without_locks(fd)
            return True
        try:
            if os.fstat(fd).st_ino != os.stat(self.path).st_ino:
                return False  # its holder removed it as we opened it: take the new one
        except FileNotFoundError:
            return False
        old = _read(fd)
        if old and old.get("pid") != os.getpid():
            log.warning(
                "%s: taking over a stale lock of %s: that process is gone (its run ended without releasing "
                "the folder; --resume picks up its rows)",
                self.folder,
                describe(old),
            )
        self._write(fd)
        return True

    def _without_locks(self, fd: int) -> None:
        self.advisory_only = True
        old = _read(fd)
        here = socket.gethostname()
        if old and old.get("pid") != os.getpid():
            pid = old.get("pid")
            if old.get("host") != here or not isinstance(pid, int) or _alive(pid):
                raise FolderBusy(
                    self._busy(old)
                    + f" (this filesystem does not lock files: remove {self.path} once that writer is known to be gone)"
                )
            log.warning("%s: taking over the lock record of %s: that process is gone", self.folder, describe(old))
        log.warning(
            "%s: this filesystem does not lock files (flock: not supported): the folder's lock is only its record "
            "(%s), which two writers starting in the same instant can both pass",
            self.folder,
            LOCK_FILE,
        )
        self._write(fd)

    def _busy(self, rec: dict | None) -> str:
        return (
            f"{self.folder} is being written by {describe(rec)}: one results folder takes one writer at a time "
            "(wait for it to end, or give another --results)"
        )

    def _write(self, fd: int) -> None:
        """The holder's record into the lock file. On a full disk the lock is held all the same
        (the flock needs no space): a refused writer then names no holder, and the run goes on
        to count its results from memory (exit 5), as it does without a lock."""
        data = json.dumps(_record(self.role)).encode()
        os.ftruncate(fd, 0)
        try:
            os.pwrite(fd, data, 0)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            log.warning("%s: the disk is full: the lock is held, but its record (PID, host) is not written", self.path)

    def release(self) -> None:
        """Remove the lock file (if it is still ours) and let go of the lock."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        try:
            if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                os.unlink(self.path)  # (while locked: a waiter that opened it retries on a new file)
        except OSError:
            pass
        finally:
            os.close(fd)


def acquire(folder: str, role: str = "run") -> None:
    """Take ``folder``'s lock for this process (re-entrant: counted); FolderBusy when another holds it."""
    key = os.path.realpath(folder)
    if key in _HELD:
        _HELD[key][1] += 1
        return
    lock = FolderLock(folder, role)
    lock.acquire()
    _HELD[key] = [lock, 1]


def release(folder: str) -> None:
    """Let go of one ``acquire`` of ``folder`` (the lock goes with the last)."""
    key = os.path.realpath(folder)
    held = _HELD.get(key)
    if held is None:
        return
    held[1] -= 1
    if held[1] <= 0:
        del _HELD[key]
        held[0].release()


def held(folder: str) -> bool:
    """Whether this process holds ``folder``'s lock."""
    return os.path.realpath(folder) in _HELD


@contextlib.contextmanager
def hold(folder: str, role: str = "run") -> Iterator[None]:
    """Hold ``folder``'s lock for the block (see ``acquire``)."""
    acquire(folder, role)
    try:
        yield
    finally:
        release(folder)
