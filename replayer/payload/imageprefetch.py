"""Builds the images of upcoming requests in a thread, ahead of their lead window.

A new image costs tens to hundreds of milliseconds (pixels, PNG/JPEG encoding: see
``bench/bench_multimodal.py``); built on the event loop inside the lead window it would stall the
loop that reads streams and hands requests to the launcher. So when preparation reaches a schedule
batch, this thread walks the batch's rows from the one being prepared onwards and builds their
images into the shared cache (``images.ImageParts``), at most ``LOOKAHEAD_ROWS`` rows ahead (so
what it built is still cached when its row comes). The building itself runs in a child process
(a spawned interpreter): numpy's array copies hold the GIL, and a thread holding it would make
the event loop wait; the thread only waits for the child's answer. A row prepared before the
thread got to it builds its image itself (or waits for the build in progress): the result is the
same bytes either way.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING

from replayer.payload.imagerows import row_images
from replayer.payload.images import ImageParts, build_part

if TYPE_CHECKING:
    from replayer.plan.schedule import ScheduleBatch

log = logging.getLogger(__name__)

#: rows of the schedule the thread may run ahead of preparation
LOOKAHEAD_ROWS = 256
#: the thread ends after this long without preparation moving (the next image row starts it again)
IDLE_EXIT_S = 10.0


class ImagePrefetch:
    """``at(sb, j, seed)``: preparation is at item ``j`` of schedule batch ``sb``, whose images
    have the prompt seed ``seed`` (called per image row)."""

    def __init__(self, parts: ImageParts, default_size: str, lookahead_rows: int = LOOKAHEAD_ROWS) -> None:
        self.parts = parts
        self.default_size = default_size
        self.lookahead = lookahead_rows
        self._cond = threading.Condition()
        self._sb: ScheduleBatch | None = None  # the schedule batch being prepared
        self._pos = 0  # the item of it being prepared
        self._seed = 0  # its images' seed
        self._thread: threading.Thread | None = None
        self._pool: ProcessPoolExecutor | None = None
        self.built = 0  # images this thread built

    def at(self, sb, j: int, seed: int) -> None:
        with self._cond:
            self._sb, self._pos, self._seed = sb, j, seed
            self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="replayer-image-prefetch", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        sb: ScheduleBatch | None = None
        k = 0
        while True:
            with self._cond:
                while True:
                    if self._sb is not sb:  # preparation moved to another batch: follow it
                        sb, k = self._sb, self._pos + 1
                    assert sb is not None  # at() set it before it started this thread
                    k = max(k, self._pos + 1)
                    seed = self._seed
                    if k < len(sb) and k <= self._pos + self.lookahead:
                        break
                    if not self._cond.wait(IDLE_EXIT_S):  # nothing prepared for a while: end (at() restarts it)
                        self._thread = None
                        if self._pool is not None:
                            self._pool.shutdown(wait=False)
                            self._pool = None
                        return
            try:
                self._row(sb, k, seed)
            except Exception:  # a build that failed here fails again, visibly, in preparation
                log.debug("image prefetch failed at row %s", k, exc_info=True)
            k += 1

    def warm(self, sb, n: int, seed: int) -> None:
        """Before the run starts: build the images of the first ``n`` items of ``sb`` (in the child,
        started now), so the first requests due take them from the cache."""
        for k in range(min(n, len(sb))):
            self._row(sb, k, seed)

    def _row(self, sb, k: int, seed: int) -> None:
        t = sb.batch
        i = int(sb.idx[k])
        for image_id, w, h in row_images(t, i, int(sb.rows[k]), self.default_size):
            self.built += self.parts.build_ahead(seed, image_id, w, h, self._in_child)

    def _in_child(self, key: tuple, fmt: str) -> tuple[bytes, int]:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        return self._pool.submit(build_part, key, fmt).result()
