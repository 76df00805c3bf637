"""The open-file limit of the replayer's process: raised for the connections, and named when a
connect fails for want of descriptors."""

from __future__ import annotations

import errno
import resource


def raise_open_file_limit() -> tuple[int, int]:
    """Raise this process's soft limit of open files to its hard limit (as load generators do:
    every request in flight holds a connection, and a default of 1,024 is a few seconds of a
    burst); returns (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= want:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, want


def fd_limit_hint(e: OSError) -> str:
    """What a connect that failed for want of file descriptors (EMFILE) should say."""
    if e.errno != errno.EMFILE:
        return ""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (
        f" (the replayer's open-file limit, ulimit -n {soft}, is reached: each request in flight holds a "
        "connection; raise the hard limit, or use --workers / a lower --speedup)"
    )
