"""What makes results folders less than one whole run when they are merged (``replayer merge``):
shards missing or in two folders, damaged files, a folder given twice, rows sent twice, runs not
started in step, runs not yet ended (and the wait for them, ``merge --wait``)."""

from __future__ import annotations

import os
import sys
import time

from replayer.record.folder import open_file, result_files
from replayer.results.summary import read_summary

#: run anchors further apart than this are reported (one shared --start-at gives ~0)
ANCHOR_SPREAD_WARN_S = 0.05


def shard_warnings(shards_by_dir: list[set[str]], dirs: list[str]) -> list[str]:
    """A shard in two folders, folders run with different shard counts, shards missing."""
    warnings = []
    seen: dict[str, str] = {}
    counts: set[int] = set()
    present: set[int] = set()
    for d, shards in zip(dirs, shards_by_dir):
        for s in shards:
            if s in seen and seen[s] != d:
                warnings.append(f"shard {s} appears in both {seen[s]} and {d}")
            seen.setdefault(s, d)
            try:
                i, n = (int(x) for x in s.split("/"))
            except ValueError:
                continue
            counts.add(n)
            present.add(i)
    if len(counts) > 1:
        warnings.append(f"folders were run with different shard counts: {sorted(counts)}")
    elif counts:
        n = counts.pop()
        missing = sorted(set(range(n)) - present)
        if n > 1 and missing:
            warnings.append(f"shards missing from the merge: {', '.join(f'{i}/{n}' for i in missing)}")
    return warnings


def merge_warnings(
    dirs: list[str], shards_by_dir: list[set], damaged: list[str], duplicates: int, starts: list, own: list[dict]
) -> list[str]:
    """What makes the folders less than one whole run: shards missing or overlapping, damaged
    files, a folder given twice, rows sent twice, runs not in step, runs not finished."""
    warnings = shard_warnings(shards_by_dir, list(dirs))
    warnings += [
        f"{f}: damaged results file, its results are left out"
        for d in dirs
        for f in ([d] if os.path.isfile(d) else result_files(d))
        if open_file(f) is None or f in damaged
    ]
    real = [os.path.realpath(d) for d in dirs]
    for d in sorted({d for d, r in zip(dirs, real) if real.count(r) > 1}):
        warnings.insert(0, f"{d} is given more than once: its rows are counted that many times")
    if duplicates:
        warnings.append(f"{duplicates} trace rows were sent by more than one folder (overlapping shards?)")
    if starts and max(starts) - min(starts) > ANCHOR_SPREAD_WARN_S:
        warnings.append(
            f"the runs were anchored {max(starts) - min(starts):.3f} s apart: a shard started after "
            "the shared --start-at (or none was given), so the shards did not replay in step"
        )
    for d, o in zip(dirs, own):
        why = folder_unfinished(o)
        if why:
            warnings.append(f"{d}: {why}")
    return warnings


def unfinished(path: str) -> str | None:
    """Why the run in results folder ``path`` has not ended by itself yet (None when it has):
    no ``summary.json`` (still running, killed, or never started), or one saying a stop cut it
    short (a retried Kubernetes pod resumes it and writes a new one)."""
    return folder_unfinished(read_summary(path))


def folder_unfinished(s: dict) -> str | None:
    """``unfinished`` of a folder whose ``summary.json`` is ``s`` ({} for none)."""
    if not s:
        return "no summary.json yet (still running, killed, or not started)"
    if s.get("stopped_early"):
        return f"stopped early ({s.get('stop_signal') or 'stop'}): its results are partial until it is resumed"
    return None


def wait_finished(dirs: list[str], timeout_s: float, *, poll_s: float = 5.0, say_every_s: float = 60.0) -> list[str]:
    """Wait up to ``timeout_s`` until the run of every folder has ended by itself
    (``unfinished``), saying which are awaited every ``say_every_s``; returns those still not."""
    deadline = time.monotonic() + timeout_s
    said = -float("inf")
    while True:
        left = {d: why for d in dirs if (why := unfinished(d))}
        if not left or time.monotonic() >= deadline:
            return list(left)
        if time.monotonic() - said >= say_every_s:
            said = time.monotonic()
            print(
                "replayer merge: waiting for " + "; ".join(f"{d}: {why}" for d, why in left.items()),
                file=sys.stderr,
                flush=True,
            )
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
