"""The target's metric samples on disk: parts during the run, ``target_metrics.parquet`` at its end.

Rows come from ``replayer.observe.target_metrics.TargetScraper.take_samples`` (long format: one row per
scrape and raw series); ``flush_samples`` writes them to a part file every few scrape intervals
off the loop, ``SampleFiles.roll`` merges them into one file (every ``SAMPLES_ROLL_PARTS`` parts
and at the end), ``read_samples`` reads a results folder's samples back (``replayer report``).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import logging
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from replayer.observe.target_metrics import TargetScraper, TargetScrapers

log = logging.getLogger(__name__)

__all__ = [
    "SAMPLES_FILE",
    "SAMPLES_FLUSH_SCRAPES",
    "SAMPLES_ROLL_PARTS",
    "save_samples",
    "SampleFiles",
    "sample_files",
    "read_samples",
    "flush_samples",
]

SAMPLES_FILE = "target_metrics.parquet"
SAMPLES_FLUSH_SCRAPES = 12  # samples reach a part file every this many scrape intervals (a SIGKILL loses at most that)
SAMPLES_ROLL_PARTS = 60  # parts on disk that trigger a roll during the run (an hour at the soak's 5 s scrapes)
_PARTS = "parts"  # the results folder's parts folder (``replayer.record.recorder.PARTS``)


def _sample_schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("time_s", pa.float64()),
            ("t_ns", pa.int64()),
            ("metric", pa.string()),
            ("labels", pa.string()),
            ("kind", pa.string()),
            ("value", pa.float64()),
            ("canonical", pa.string()),
        ]
    )


def save_samples(rows: list[dict], path: str) -> None:
    """Write sample rows (``TargetScraper.samples`` format) to Parquet, long format: columns
    ``time_s`` (float64, Unix s), ``t_ns`` (int64, ns after the run anchor: negative for the
    baseline, scraped before it), ``metric`` (the raw sample name, e.g.
    ``vllm:prompt_tokens_total``), ``labels`` (JSON object text, every label),
    ``kind`` ("counter"/"gauge"), ``value`` (float64), ``canonical`` (the name replayer reads
    it as, e.g. ``num_requests_running`` for SGLang's ``sglang:num_running_reqs``, or the name of
    a part of a derived value, e.g. Dynamo's ``kv_total_blocks``). Written to a temporary name, fsynced, then
    renamed (``recorder.atomic_file``): a file on disk is always whole."""
    import pyarrow.parquet as pq

    from replayer.record.recorder import atomic_file

    table = _samples_table(rows)
    with atomic_file(path) as f:
        pq.write_table(table, f, compression="zstd")


def _samples_table(rows: list[dict]):
    """Sample rows as an Arrow table of ``_sample_schema()``."""
    import pyarrow as pa

    schema = _sample_schema()
    return pa.table({f.name: [r.get(f.name) for r in rows] for f in schema}, schema=schema)


def sample_files(results_dir: str) -> list[str]:
    """The target-metric sample files of a results folder: ``target_metrics.parquet``, then the
    parts not yet rolled into it (``parts/target_metrics-NNNNNNNN.parquet``: a run still going,
    or one killed before its end; a part that ``target_metrics.parquet`` lists as rolled into it
    is left out: a roll was cut short before removing it)."""
    rolled = os.path.join(results_dir, SAMPLES_FILE)
    parts = sorted(glob.glob(os.path.join(results_dir, _PARTS, "target_metrics-*.parquet")))
    covered = _rolled_parts(rolled)
    return ([rolled] if os.path.exists(rolled) else []) + [p for p in parts if os.path.basename(p) not in covered]


def _rolled_parts(rolled: str) -> set[str]:
    """Names of the parts ``target_metrics.parquet`` holds (empty when there is none)."""
    import pyarrow.parquet as pq

    from replayer.record.recorder import ROLLED_PARTS

    if not os.path.exists(rolled):
        return set()
    names = (pq.read_schema(rolled).metadata or {}).get(ROLLED_PARTS)
    return set(json.loads(names)) if names else set()


def read_samples(results_dir: str):
    """Every target-metric sample of a results folder as one Arrow table (``save_samples``'s
    columns), or None when it has none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sample_files(results_dir)
    if not files:
        return None
    return pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")


class SampleFiles:
    """The scraper's samples on disk, so that nothing scraped is lost: ``write_part`` (every
    ``SAMPLES_FLUSH_SCRAPES`` scrape intervals during the run) writes a small whole Parquet file under
    ``parts/``; ``roll`` merges ``target_metrics.parquet`` (an earlier roll's, or an earlier run's on
    ``--resume``), every part (also those a killed run left) and the given rows into a new
    ``target_metrics.parquet``, batch by batch, then removes the parts. The run rolls at its end,
    and ``write_part`` rolls once ``roll_parts`` parts are on disk, so a days-long soak keeps one
    file, not one per minute.

    ``keep_since`` (-> Unix s or None) bounds the file: a roll leaves out samples older than it
    returns. The run passes the oldest results kept once retention has removed results
    (``retention.samples_kept_since``), so the samples cover what the results cover and stay
    inside the retention bound. Blocking: call from a worker thread, one call at a time."""

    def __init__(
        self,
        results_dir: str,
        *,
        keep_since: Callable[[], float | None] | None = None,
        roll_parts: int = SAMPLES_ROLL_PARTS,
    ) -> None:
        self.dir = results_dir
        self.keep_since = keep_since
        self.roll_parts = roll_parts
        os.makedirs(os.path.join(results_dir, _PARTS), exist_ok=True)
        # part names are never reused: target_metrics.parquet's list of parts must not name a new one
        names = [os.path.basename(p) for p in glob.glob(os.path.join(results_dir, _PARTS, "target_metrics-*.parquet"))]
        self._parts = len(names)
        self._unwritten: list[dict] = []  # rows whose part could not be written (the next write takes them)
        names += _rolled_parts(os.path.join(results_dir, SAMPLES_FILE))
        self._seq = 1 + max((int(n[-16:-8]) for n in names if n[-16:-8].isdigit()), default=-1)

    def write_part(self, rows: list[dict]) -> str | None:
        """Write ``rows`` as the next part file (then roll, when ``roll_parts`` are on disk);
        returns the part's path (None for no rows)."""
        rows = self._unwritten + list(rows) if self._unwritten else rows
        if not rows:
            return None
        path = os.path.join(self.dir, _PARTS, f"target_metrics-{self._seq:08d}.parquet")
        self._seq += 1
        try:
            os.makedirs(os.path.join(self.dir, _PARTS), exist_ok=True)
            save_samples(rows, path)
        except BaseException:
            self._unwritten = list(rows)
            raise
        self._unwritten = []
        self._parts += 1
        if self._parts >= self.roll_parts:
            self.roll()
        return path

    def roll(self, rows: list[dict] | tuple = ()) -> int:
        """Merge everything into ``target_metrics.parquet`` (see the class docstring); returns
        its row count (0, and no file, when there are no samples)."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        from replayer.record.recorder import ROLLED_PARTS, atomic_file

        rows = self._unwritten + list(rows) if self._unwritten else rows
        files = sample_files(self.dir)
        if not files and not rows:
            return 0
        dst = os.path.join(self.dir, SAMPLES_FILE)
        parts = glob.glob(os.path.join(self.dir, _PARTS, "target_metrics-*.parquet"))
        # the parts merged now (and any a cut-short roll left): from the rename on, readers skip
        # them (a kill before their removal shows no sample twice); the parts a finished roll
        # merged are gone, so the list stays as short as the parts on disk
        rolled = sorted({os.path.basename(p) for p in parts})
        since = self.keep_since() if self.keep_since is not None else None
        schema, n = _sample_schema(), 0
        with atomic_file(dst) as out:
            with pq.ParquetWriter(
                out, schema.with_metadata({ROLLED_PARTS: json.dumps(rolled).encode()}), compression="zstd"
            ) as w:
                for table in self._sources(files, rows):
                    if since is not None:
                        table = table.filter(pc.greater_equal(table.column("time_s"), since))
                    if table.num_rows:
                        w.write_table(table)
                        n += table.num_rows
        self._unwritten = []
        for f in parts:
            os.remove(f)
        self._parts = 0
        try:  # (the results' parts went first: nothing left in parts/ then)
            os.rmdir(os.path.join(self.dir, _PARTS))
        except OSError:
            pass
        return n

    @staticmethod
    def _sources(files: list[str], rows: list[dict] | tuple) -> Iterator:
        """The samples to merge as Arrow tables of ``_sample_schema()``, in order, batch by batch."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = _sample_schema()
        for f in files:
            for batch in pq.ParquetFile(f).iter_batches(batch_size=65_536):
                if "canonical" not in batch.schema.names:  # (a part written before the column existed)
                    batch = batch.append_column("canonical", pa.nulls(batch.num_rows, pa.string()))
                yield pa.Table.from_batches([batch.cast(schema)])
        if rows:
            yield _samples_table(list(rows))


async def flush_samples(scraper: TargetScraper | TargetScrapers, samples: SampleFiles, every_s: float) -> None:
    """Write the target-metric samples to a part file every ``every_s`` (off the loop). A write
    that fails (no file descriptor left, disk full) leaves its rows with ``samples`` for the next
    one (``SampleFiles.write_part``), logged when it starts and when writing works again, as the
    results recorder does: a soak goes on."""
    loop = asyncio.get_running_loop()
    failing = False
    while True:
        await asyncio.sleep(every_s)
        fut = loop.run_in_executor(None, samples.write_part, scraper.take_samples())
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:  # the run ends: this part must be on disk before the final roll
            with contextlib.suppress(OSError, pa.ArrowException):  # (or its rows go with the roll)
                await fut
            raise
        except (OSError, pa.ArrowException) as e:
            if not failing:
                log.error(
                    "cannot write target-metric samples in %s: %s; they are kept in memory and written "
                    "when it works again",
                    samples.dir,
                    e,
                )
            failing = True
            continue
        if failing:
            log.warning("writing target-metric samples in %s works again", samples.dir)
        failing = False
