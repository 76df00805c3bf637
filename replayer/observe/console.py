"""Live console view of a running replay (rich), fed by a status callable.

The daemon wires it in three lines::

    console = LiveConsole(lambda: {**_status(state, dispatcher_ref), **metrics.snapshot()}, quiet=cfg.quiet)
    background.append(loop.create_task(console.run()))   # returns at once when disabled

It is silent when ``quiet`` or when the output is not a terminal (``enabled`` is False), so logs
and CI output stay clean. Status keys read (all optional; missing ones print "-"):
``state``, ``scheduled``, ``sent``, ``completed``, ``failed``, ``cancelled``, ``in_flight``,
``trace_rows``, ``trace_rows_done``, ``trace_time_s``, ``trace_duration_s``, ``loop``,
``dispatch_lag_p99_s``, ``ttft_p50_s``, ``ttft_p99_s``, ``completion_tokens_total``,
``prompt_tokens_total``, ``event_loop_lag_max_s`` (``ReplayerMetrics.snapshot()`` gives the last ones);
``max_concurrency``, ``queued``, ``queued_total`` with a ``--max-concurrency`` cap.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import IO

from rich.console import Console, Group
from rich.file_proxy import FileProxy
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:,.1f} ms"


def _dur(s: float | None) -> str:
    if s is None or s != s or s < 0:
        return "-"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def _table(*cells: tuple[str, str | Text]) -> Table:
    """One row of figures under their headers, none wrapped."""
    t = Table(show_header=True, header_style="bold", box=None, pad_edge=False, padding=(0, 2))
    for name, _ in cells:
        t.add_column(name, justify="right", no_wrap=True)
    t.add_row(*(v for _, v in cells))
    return t


def cap_line(st: dict) -> Text | None:
    """The ``--max-concurrency`` line (None without a cap): the cap, and when requests wait for
    a slot, that the cap (not the server) is the bottleneck now."""
    cap = st.get("max_concurrency")
    if cap is None:
        return None
    queued, total = int(st.get("queued") or 0), int(st.get("queued_total") or 0)
    if queued:
        return Text(
            f"cap {cap:,} in flight reached: {queued:,} due requests waiting for a slot "
            f"({total:,} so far): the cap is the bottleneck",
            style="yellow",
        )
    return Text(f"cap {cap:,} in flight ({total:,} requests waited for a slot so far)")


class LiveConsole:
    """Redraws a small panel every ``refresh_s`` from ``status()`` while ``run()`` is awaited."""

    def __init__(
        self,
        status: Callable[[], dict],
        *,
        quiet: bool = False,
        refresh_s: float = 0.5,
        file: IO[str] | None = None,
        rate_window_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        force_terminal: bool | None = None,
    ) -> None:
        self._status = status
        self.refresh_s = refresh_s
        self._file = file if file is not None else sys.stderr
        tty = force_terminal if force_terminal is not None else bool(getattr(self._file, "isatty", lambda: False)())
        self.enabled = not quiet and tty
        self._clock = clock
        self._t0 = clock()
        self._window_s = rate_window_s
        self._tokens: deque[tuple[float, int, int]] = deque()  # (t, completion, sent)

    # -- pure part (tested without a terminal) ---------------------------------------------
    def progress(self, st: dict) -> tuple[float | None, float | None]:
        """(fraction done 0..1, ETA seconds) from trace time reached, else sent / scheduled."""
        dur, reached = st.get("trace_duration_s"), st.get("trace_time_s")
        frac = None
        if dur and reached is not None and dur > 0:
            frac = min(1.0, reached / dur)
        elif st.get("scheduled"):
            frac = min(1.0, st.get("sent", 0) / st["scheduled"])
        elapsed = self._clock() - self._t0
        eta = elapsed * (1 - frac) / frac if frac and frac > 0 else None
        if frac is not None and frac >= 1.0 and st.get("in_flight"):
            eta = None  # all sent, answers still streaming: not "0:00"
        return frac, eta

    def rates(self, st: dict) -> tuple[float | None, float | None]:
        """(completion tokens/s, requests sent/s) over the last ``rate_window_s``."""
        now = self._clock()
        self._tokens.append((now, int(st.get("completion_tokens_total") or 0), int(st.get("sent") or 0)))
        while len(self._tokens) > 2 and now - self._tokens[0][0] > self._window_s:
            self._tokens.popleft()
        t0, c0, s0 = self._tokens[0]
        if now - t0 <= 0:
            return None, None
        return (self._tokens[-1][1] - c0) / (now - t0), (self._tokens[-1][2] - s0) / (now - t0)

    def render(self, st: dict):
        frac, eta = self.progress(st)
        tok_s, req_s = self.rates(st)
        head = Text.assemble(
            ("replayer ", "bold"),
            (str(st.get("state", "")), "cyan"),
            f"  loop {st.get('loop', 0)}  elapsed {_dur(self._clock() - self._t0)}  ETA {_dur(eta)}",
        )
        # The bar takes the width the text leaves (an 80-column terminal wrapped a fixed 40), and
        # the figures are two tables of whole headers (nine columns in one cut them at 80).
        bar = Table.grid(padding=(0, 1), expand=True)
        bar.add_column(ratio=1)
        bar.add_column(no_wrap=True)
        bar.add_row(
            ProgressBar(total=1.0, completed=frac or 0.0, width=None),
            Text(
                f"{(frac or 0) * 100:5.1f}%  trace {_dur(st.get('trace_time_s'))} / "
                f"{_dur(st.get('trace_duration_s') or None)}  rows {st.get('trace_rows_done', '-')}/"
                f"{st.get('trace_rows') or st.get('scheduled', '-')}"
            ),
        )
        failed = int(st.get("failed") or 0)
        scheduled = f"{st['scheduled']:,}" if st.get("scheduled") else "?"  # (0: not known yet)
        counts = _table(
            ("sent", f"{st.get('sent', 0):,}/{scheduled}"),
            ("completed", f"{st.get('completed', 0):,}"),
            ("failed", Text(f"{failed:,}", style="red" if failed else "")),
            ("in flight", f"{st.get('in_flight', 0):,}"),
            ("req/s", "-" if req_s is None else f"{req_s:,.1f}"),
            ("tokens/s", "-" if tok_s is None else f"{tok_s:,.0f}"),
        )
        latency = _table(
            ("dispatch lag p99", _ms(st.get("dispatch_lag_p99_s"))),
            ("TTFT p50", _ms(st.get("ttft_p50_s"))),
            ("TTFT p99", _ms(st.get("ttft_p99_s"))),
        )
        cap = cap_line(st)
        return Group(head, bar, counts, latency) if cap is None else Group(head, bar, counts, latency, cap)

    # -- async shell -----------------------------------------------------------------------
    async def run(self) -> None:
        """Redraw until cancelled; returns at once when disabled. A failing ``status()`` is shown
        as a message, never raised (the console must not stop a replay)."""
        if not self.enabled:
            return
        console = Console(file=self._file, force_terminal=True)
        # Log lines to the same terminal go through the console, above the view: written straight
        # to the file they landed inside the table being redrawn.
        handlers = [
            h
            for h in logging.getLogger().handlers
            if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is self._file
        ]
        with Live(
            console=console, auto_refresh=False, transient=False, redirect_stdout=False, redirect_stderr=False
        ) as live:
            proxy = FileProxy(console, self._file)
            for h in handlers:
                h.setStream(proxy)
            try:
                while True:
                    try:
                        live.update(self.render(self._status()), refresh=True)
                    except Exception as e:  # noqa: BLE001 - a display bug must not kill the replay
                        live.update(Text(f"console: {type(e).__name__}: {e}"), refresh=True)
                    await asyncio.sleep(self.refresh_s)
            finally:
                try:
                    live.update(self.render(self._status()), refresh=True)
                except Exception:  # noqa: BLE001
                    pass
                proxy.flush()
                for h in handlers:
                    h.setStream(self._file)
