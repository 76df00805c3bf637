"""The live console: silent when quiet or not a TTY; renders progress, ETA and rates."""

import asyncio
import io

from rich.console import Console

from replayer.observe.console import LiveConsole

STATUS = {
    "state": "running",
    "scheduled": 100,
    "sent": 50,
    "completed": 40,
    "failed": 2,
    "in_flight": 8,
    "trace_rows": 100,
    "trace_rows_done": 42,
    "trace_time_s": 30.0,
    "trace_duration_s": 60.0,
    "loop": 0,
    "dispatch_lag_p99_s": 0.0021,
    "ttft_p50_s": 0.120,
    "ttft_p99_s": 0.9,
    "completion_tokens_total": 1000,
}


def _text(renderable) -> str:
    c = Console(file=io.StringIO(), width=140, force_terminal=False)
    c.print(renderable)
    return c.file.getvalue()


def test_quiet_or_not_a_tty_draws_nothing():
    buf = io.StringIO()  # not a TTY
    c = LiveConsole(lambda: STATUS, file=buf)
    assert not c.enabled
    assert not LiveConsole(lambda: STATUS, quiet=True, force_terminal=True).enabled
    asyncio.run(c.run())
    assert buf.getvalue() == ""


def test_render_shows_progress_eta_and_rates():
    now = [0.0]
    c = LiveConsole(lambda: STATUS, clock=lambda: now[0], force_terminal=True)
    c.render(STATUS)
    now[0] = 10.0
    st = dict(STATUS, completion_tokens_total=3000, sent=70)
    frac, eta = c.progress(st)
    assert frac == 0.5 and eta == 10.0
    out = _text(c.render(st))
    for needle in ("50.0%", "ETA 0:10", "70/100", "42/100", "2.1 ms", "120.0 ms", "900.0 ms", "200", "running"):
        assert needle in out, (needle, out)
    assert "70/? " in _text(c.render(dict(st, scheduled=0)))  # not known yet (/status says 0): not "70/0"


def test_run_draws_on_a_terminal_and_survives_a_broken_status():
    buf = io.StringIO()
    calls = [0]

    def status():
        calls[0] += 1
        if calls[0] == 2:
            raise KeyError("boom")
        return STATUS

    c = LiveConsole(status, file=buf, force_terminal=True, refresh_s=0.01)

    async def main():
        t = asyncio.create_task(c.run())
        await asyncio.sleep(0.1)
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)

    asyncio.run(main())
    assert calls[0] >= 3
    assert "TTFT p99" in buf.getvalue()


def test_unknown_trace_span_and_the_drain_show_no_made_up_times():
    c = LiveConsole(lambda: STATUS, clock=lambda: 5.0, force_terminal=True)
    st = dict(STATUS, trace_duration_s=0.0, trace_time_s=15.0, sent=100, in_flight=8)
    frac, eta = c.progress(st)
    assert frac == 1.0 and eta is None  # all sent, 8 still streaming
    out = _text(c.render(st))
    assert "trace 0:15 / -" in out and "ETA -" in out, out


def test_the_view_fits_80_columns_with_whole_headers():
    """Nine columns in one table cut "completed" to "complet…" and wrapped "in flight" and the
    rows count at 80 columns."""
    st = dict(STATUS, scheduled=1750, sent=1750, trace_rows=1750, trace_rows_done=1750, completed=1234)
    c = Console(file=io.StringIO(), width=80, force_terminal=False)
    c.print(LiveConsole(lambda: st).render(st))
    out = c.file.getvalue()
    assert "…" not in out and all(len(line) <= 80 for line in out.splitlines())
    for needle in ("completed", "in flight", "tokens/s", "dispatch lag p99", "TTFT p50", "TTFT p99", "rows 1750/1750"):
        assert needle in out, (needle, out)
    assert "1,750/1,750" in out


def test_a_log_line_during_the_view_is_printed_above_it():
    """A log handler on the same terminal wrote its line straight into the table being redrawn;
    it now goes through the live console (which clears the view, prints the line, redraws)."""
    import logging

    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    root = logging.getLogger()
    root.addHandler(handler)
    c = LiveConsole(lambda: STATUS, file=buf, force_terminal=True, refresh_s=0.01)

    async def main():
        t = asyncio.create_task(c.run())
        await asyncio.sleep(0.05)
        logging.getLogger("replayer.test").warning("a line from the log")
        await asyncio.sleep(0.05)
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)

    try:
        asyncio.run(main())
    finally:
        root.removeHandler(handler)
    out = buf.getvalue()
    i = out.index("a line from the log")
    assert "\x1b[2K" in out[max(0, i - 40) : i]  # the view was cleared just before the line
    assert "TTFT p99" in out[i:]  # and drawn again below it
    assert handler.stream is buf  # given back
