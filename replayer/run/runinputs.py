"""What a run reads and where it writes, checked before anything is sent: the results folder,
the trace's batches (validated, endpoints and images checked against the settings) and how many
requests the schedule will send."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import numpy as np
import pyarrow.parquet as pq

import replayer.record.lock as folder_lock
from replayer.config.model import RunConfig
from replayer.core.endpoints import TEXT_ONLY
from replayer.payload.imagerows import ImageEndpointError, check_image_endpoints, may_have_images
from replayer.record.folder import earlier_run, new_results_dir
from replayer.results.traceinspect import GRIDS_NS
from replayer.run.readiness import StartupError
from replayer.trace import open_mix, open_trace, parse_mapping
from replayer.trace.synth import SynthSource
from replayer.trace.values import set_length_bound

log = logging.getLogger("replayer")


def results_dir_for(cfg: RunConfig) -> tuple[str, bool]:
    """The results folder, created if needed and locked for this run (``record.lock``: released
    by ``release_results_dir``): (path, whether this call created it). Without ``--results``: a
    new ``results/<timestamp>`` (``-2``, ``-3``... when runs start in the same second). Raises
    StartupError when the path is a file, cannot be created, has another writer, or (without
    ``--resume``) already holds a run's results."""
    if cfg.resume:
        _lock(cfg.resume, "--resume")
        return cfg.resume, False  # (resume_plan checks it)
    if cfg.results is None:
        try:
            path = new_results_dir()
        except OSError as e:
            raise StartupError(f"cannot create a results folder under ./results: {e.strerror or e}") from None
        _lock(path, "--results")
        return path, True
    path = cfg.results
    created = False
    if not os.path.exists(path):
        try:
            os.makedirs(path)
            created = True
        except FileExistsError:  # (another run made it first: its lock says who)
            pass
        except OSError as e:
            raise StartupError(f"--results {path}: cannot create the folder: {e.strerror or e}") from None
    if not os.path.isdir(path):  # (a traceback before)
        raise StartupError(f"--results {path}: exists and is not a folder")
    _lock(path, "--results")
    used = earlier_run(path)
    if used:
        folder_lock.release(path)
        raise StartupError(f"--results {path}: {used}")
    return path, created


def _lock(path: str, flag: str) -> None:
    """Take ``path``'s writer lock, or raise StartupError naming its holder."""
    try:
        folder_lock.acquire(path, "run")
    except folder_lock.FolderBusy as e:
        raise StartupError(f"{flag} {e}") from None
    except OSError as e:
        raise StartupError(f"{flag} {path}: cannot lock the folder: {e.strerror or e}") from None


def release_results_dir(path: str | None) -> None:
    """Let go of the run's lock on its results folder (taken by ``results_dir_for``)."""
    if path is not None:
        folder_lock.release(path)


BATCH_ROWS = 65_536
#: the requests a run will send are counted ahead (``count_scheduled``, a pass over the trace
#: before the start: ~2 ms per 1,000 rows) when at most this many schedule entries are read:
#: every pass of a trace of this size, or under ``--duration`` the entries due before its end
COUNT_LIMIT = 250_000


def count_scheduled(
    schedule, *, speedup: float, duration_ns: int | None = None, rebase: bool = False, limit: int = COUNT_LIMIT
) -> int | None:
    """How many requests a schedule (``iter_schedule``'s batches: shard, loops, ``--max-requests``
    and resume skips applied) will send: all of them, or under ``duration_ns`` those due before it
    (due = (trace_ns - trace0) / speedup, trace0 = 0, or the first entry's with ``rebase``, as the
    dispatcher does on resume). None when the count passes ``limit`` (a schedule without end)."""
    n, trace0 = 0, None
    for sb in schedule:
        t = np.asarray(sb.trace_ns, dtype=np.int64)
        if not t.size:
            continue
        if trace0 is None:
            trace0 = int(t[0]) if rebase else 0
        if duration_ns is None:
            n += int(t.size)
        else:
            k = int(np.count_nonzero(np.round((t - trace0) / speedup) < duration_ns))
            n += k
            if k < t.size:
                return n
        if n > limit:
            return None
    return n


def open_batches_factory(cfg: RunConfig):
    """(function returning a fresh iterator of trace batches — one pass per loop, block size,
    number of rows or None, trace seconds spanned by one loop's schedule or None when not known
    without reading the rows: ``TraceSource.span_ns``). With ``validate_trace=full`` every row
    is checked before anything is sent (a TraceError lists every problem); with ``lazy`` each
    batch is checked as it is read. A synthetic load (``--request-rate``) is generated batch by
    batch, the same rows on every pass (``replayer.trace.synth.SynthSource``)."""
    opts: dict[str, Any] = dict(
        fmt=cfg.format, block_size=cfg.block_size, strict=cfg.strict, mapping=cfg.map, time_unit=cfg.time_unit
    )
    spec = cfg.synthetic_spec()
    if spec is not None:
        bs = cfg.synthetic_block_size
        if cfg.prefix_len % bs:
            log.warning(
                "--prefix-len %d: its first %d tokens are shared (whole %d-token blocks, --block-size or "
                "--kv-block-size: what a server with that block size can hit), the rest is each request's own",
                cfg.prefix_len,
                cfg.prefix_len // bs * bs,
                bs,
            )
        synthetic = SynthSource(spec)
        span_ns = synthetic.span_ns(cfg.max_requests)
        return (
            (lambda: synthetic.batches(BATCH_ROWS)),
            synthetic.block_size,
            synthetic.num_rows,
            span_ns / 1e9 if span_ns is not None else None,
        )
    assert cfg.trace is not None  # (RunConfig: a trace or a synthetic load)
    set_length_bound(cfg.max_trace_length)  # (issue 47: a length beyond any model is refused)
    if cfg.mix:  # several traces (tenants) on one clock: replayer.trace.mix
        source = open_mix(
            [dataclasses.replace(e, hash_id_scope=e.hash_id_scope or cfg.hash_id_scope) for e in cfg.mix_entries],
            **opts,
        )
    else:
        source = open_trace(cfg.trace, **opts)
    if cfg.validate_trace == "full":
        source.validate()
    if not cfg.tokenizer and may_have_endpoints(source, cfg):
        check_endpoints(source.batches(BATCH_ROWS), cfg.trace)
    if may_have_images(source, cfg.map):
        try:
            check_image_endpoints(source.batches(BATCH_ROWS), cfg.trace, cfg.endpoint)
        except ImageEndpointError as e:
            raise StartupError(str(e)) from None
    warn_coarse_grid(source, cfg.trace_label)  # (issue 47)
    span_ns = source.span_ns(cfg.max_requests)
    span_s = span_ns / 1e9 if span_ns is not None else None
    return (lambda: source.batches(BATCH_ROWS)), source.block_size, source.num_rows, span_s


def coarse_grid(timestamp_ns: np.ndarray) -> str | None:
    """The trace's timestamp grid (``trace inspect``'s: the coarsest of 1 s .. 1 us that every
    offset is a multiple of) when it is coarser than 1 ms, else None (also for fewer than 2 rows)."""
    if len(timestamp_ns) < 2:
        return None
    for label, g in GRIDS_NS:
        if g <= 1_000_000:
            return None
        if not (timestamp_ns % g).any():
            return label
    return None


def warn_coarse_grid(source: Any, label: str) -> None:
    """Warn when the trace's first batch has timestamps on a grid coarser than 1 ms: requests
    that arrived apart replay together, as bursts at each grid step."""
    first = next(iter(source.batches(BATCH_ROWS)), None)
    grid = coarse_grid(np.asarray(first.timestamp_ns)) if first is not None else None
    if grid is not None:
        log.warning(
            "%s: the trace's timestamps are on a %s grid: requests that arrived apart within a step replay "
            "together, as a burst at each step (trace inspect shows the grid; a finer trace replays arrivals "
            "as they came)",
            label,
            grid,
        )


def may_have_endpoints(source, cfg: RunConfig) -> bool:
    """Whether the trace may carry an ``endpoint`` column, without reading its rows (Parquet:
    the schema; a loaded trace: the column; other sources: assume it may)."""
    trace = getattr(source, "trace", None)
    if trace is not None:
        return getattr(trace, "endpoint", None) is not None
    files = getattr(source, "files", None)
    if files:
        name = parse_mapping(cfg.map).get("endpoint", "endpoint")
        return name in pq.read_schema(files[0]).names
    return True


def check_endpoints(batches, trace: str) -> None:
    """Without a tokenizer, refuse (before anything is sent) a trace whose ``endpoint`` column
    names a text-only API (chat, score, rerank): token ids cannot go there. Reads the trace only
    when it has that column."""
    for batch in batches:
        col = getattr(batch, "endpoint", None)
        if col is None:
            return
        bad = {e for e in col if e in TEXT_ONLY}
        if bad:
            raise StartupError(
                f"{trace}: rows for {', '.join(sorted(bad))} need text prompts: pass "
                "--tokenizer PATH (token-id prompts cannot go to these endpoints)"
            )
