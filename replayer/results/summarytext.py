"""The summary as printed at the end of a run and by ``replayer merge``: a fixed-width text table
of the main fields (``n/a`` for a value not known), and one line per tenant or target."""

from __future__ import annotations

from collections.abc import Callable

import replayer.results.verdict as verdict
from replayer.observe.selfwatch import BEHIND_MS


def synthetic_text(load: dict) -> str:
    """A synthetic load's settings (summary.json's ``synthetic_load``) in one line."""
    rate = load["request_rate"]
    arrivals = {"poisson": "Poisson", "gamma": f"gamma (burstiness {load['burstiness']})", "constant": "evenly spaced"}
    when = "all at once" if rate == "inf" else f"{arrivals.get(load['arrival'], load['arrival'])} at {rate:g} req/s"
    spread = f" +-{load['range_ratio']:.0%}" if load.get("range_ratio") else ""
    n, shared = load.get("prefix_len") or 0, load.get("prefix_shared_tokens") or 0
    prefix = f" after a {n:,}-token shared prefix" if n else ""
    if shared != n:  # (whole blocks of it are shared)
        prefix = f" after a {n:,}-token prefix ({shared:,} shared)"
    return (
        f"{load['num_prompts']:,} requests, {when}; {load['input_len']:,}{spread} prompt tokens{prefix}, "
        f"{load['output_len']:,}{spread} output tokens; seed {load['seed']}"
    )


def _peak_rows(s: dict) -> list[tuple[str, object]]:
    """The peak concurrency row (none for a summary written before it was measured)."""
    if "max_concurrent_requests" not in s:
        return []
    at = s.get("max_concurrent_requests_at_s")
    return [
        (
            "Peak concurrent requests",
            f"{s['max_concurrent_requests']:,}" + (f" (at {at:,.3f} s)" if at is not None else ""),
        )
    ]


def _otel_rows(otel: object) -> list:
    """The printed summary's OpenTelemetry lines (``--otlp-endpoint``): spans exported and dropped."""
    if not isinstance(otel, dict) or "spans_exported" not in otel:
        return []
    return [
        "OpenTelemetry spans (--otlp-endpoint)",
        ("Exported / dropped", f"{otel['spans_exported']:,} / {otel['spans_dropped']:,}"),
    ]


def _behind_rows(s: dict) -> list[tuple[str, object]]:
    """A warning row when the dispatch lag p99 is past the self-watch's bound (``BEHIND_MS``, the
    lag past which a sweep point is ``replayer_behind``): the client, not the server, was late."""
    lag_p99 = s.get("dispatch_lag_p99_ms")
    if lag_p99 is None or lag_p99 <= BEHIND_MS:
        return []
    return [
        (
            f"REPLAYER FELL BEHIND (lag p99 > {BEHIND_MS:g} ms)",
            "requests left late on the client side; latencies from the due time include it "
            "(the log's self-watch names the cause)",
        )
    ]


def _run_notes(s: dict) -> list[tuple[str, object] | str]:
    """The rows a run has only sometimes, first in the table: no trace, TLS, stopped early."""
    rows: list[tuple[str, object] | str] = []
    if s.get("synthetic_load"):
        rows.append(("Synthetic load (no trace)", synthetic_text(s["synthetic_load"])))
    if s.get("tls_insecure"):
        rows.append(("TLS certificate NOT verified", "--insecure"))
    if s.get("tls"):
        t = s["tls"]
        versions = ", ".join(sorted(t.get("versions", {})))
        rows.append(
            (
                "TLS handshakes (resumed)",
                f"{t['handshakes']:,} ({t['resumed']:,})" + (f", {versions}" if versions else ""),
            )
        )
        if "requests_sealed" in t:
            rows.append(("TLS requests sealed / by the loop", f"{t['requests_sealed']:,} / {t['requests_loop']:,}"))
    if s.get("stopped_early"):
        rows.append(("Stopped early (results partial)", f"by {s['stop_signal']}" if s.get("stop_signal") else "yes"))
    return rows


def _fmt(v: object) -> str:
    """A summary value as printed: ``n/a`` for None, thousands separated, floats to 2 places."""
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:,.2f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def _three(s: dict, name: str, stats: tuple[str, ...] = ("mean", "median", "p99")) -> str:
    """``mean / median / p99`` (or ``stats``) of the summary's ``name``."""
    return " / ".join(_fmt(s[f"{k}_{name}"]) for k in stats)


def format_summary(s: dict) -> str:
    """A fixed-width text table of the main summary fields (``n/a`` for None)."""
    rows: list[tuple[str, object] | str] = ["Replay result", *_run_notes(s)]
    verdict_rows = verdict.verdict_rows(s)  # the verdict first, when there are bounds
    if verdict_rows:
        rows += ["Verdict (--goodput; failed = missed)", *verdict_rows, "Requests"]
    rows += [
        ("Scheduled requests", s["scheduled"]),
        ("Sent requests", s["sent"]),
        ("Successful requests", s["completed"]),
        ("Failed requests", s["failed"]),
        ("Cancelled / not started", f"{s['cancelled']:,} / {s['not_started']:,}"),
        ("Duration (s)", s["duration"]),
        ("Total input tokens (server)", s["total_input_tokens"]),
        ("Total output tokens (server)", s["total_output_tokens"]),
        ("Request throughput (req/s)", s["request_throughput"]),
        ("Output token throughput (tok/s)", s["output_throughput"]),
        ("Prompt-token mismatches vs trace", s["prompt_token_mismatches"]),
        ("Completion-token mismatches", s["completion_token_mismatches"]),
        ("Usage missing / TTFT unmeasured", f"{s['usage_missing']:,} / {s['ttft_unmeasured']:,}"),
        *_peak_rows(s),
        "Dispatch lag (sent - due)",
        (
            "p50 / p99 / max (ms)",
            " / ".join(_fmt(s[f"dispatch_lag_{k}_ms"]) for k in ("p50", "p99", "max")),
        ),
        *_behind_rows(s),
    ]
    rows += _pace_rows(s, _fmt)
    rows += _latency_rows(s)
    rows += _cache_and_image_rows(s)
    rows += _section_rows(s)
    rows.extend(_otel_rows(s.get("otel")))
    if s.get("errors_by_kind"):
        rows.append("Errors by kind")
        rows.extend((k, v) for k, v in s["errors_by_kind"].items())
    rows += _failure_rows(s)  # (issue 47)
    return _render(rows)


def _render(rows: list[tuple[str, object] | str], width: int = 50) -> str:
    """The rows as fixed-width lines: a string is a section's title, a pair a label and value."""
    lines = []
    for r in rows:
        if isinstance(r, str):
            lines.append(f"{'-' * 4} {r} ".ljust(width + 14, "-"))
        else:  # (a long label and a long value keep two spaces between them)
            value = _fmt(r[1])
            lines.append(f"{r[0]}{' ' * max(2, width + 14 - len(r[0]) - len(value))}{value}")
    return "\n".join(lines)


def _latency_rows(s: dict) -> list[tuple[str, object] | str]:
    """TTFT, TPOT, ITL and E2E (and from the due time, decode TPOT), the server's own timings."""
    rows: list[tuple[str, object] | str] = []
    for name, label in (
        ("ttft_ms", "Time to first token"),
        ("tpot_ms", "Time per output token (excl. 1st)"),
        ("itl_ms", "Inter-token latency"),
        ("e2el_ms", "End-to-end latency"),
    ):
        rows.append(label)
        rows.append(("mean / median / p99 (ms)", _three(s, name)))
        if name in ("ttft_ms", "e2el_ms") and f"mean_{name[:-3]}_from_due_ms" in s:
            rows.append(("  from the due time (ms)", _three(s, f"{name[:-3]}_from_due_ms")))
        if name == "tpot_ms" and s.get("decode_tpot_ms_count"):  # (issue 47)
            rows.append(("  decode, after the 1st chunk (ms)", _three(s, "decode_tpot_ms")))
    if "client_overhead_ms_count" in s:
        rows.append("Server timings (--server-timings; mean / median / p99, ms)")
        for name, label in (
            ("server_queue_time_ms", "Server queue time"),
            ("server_time_to_first_token_ms", "Server TTFT (from scheduling)"),
            ("server_generation_time_ms", "Server generation time"),
            ("client_overhead_ms", "Client overhead (TTFT - queue - server TTFT)"),
        ):
            rows.append((label, _three(s, name)))
    return rows


def _cache_and_image_rows(s: dict) -> list[tuple[str, object] | str]:
    """The prefix cache's tokens (expected from hash ids, server-reported) and the images sent."""
    rows: list[tuple[str, object] | str] = []
    expected, server = s.get("expected_prefix_hit_tokens"), s.get("server_prefix_cache_hit_tokens")
    if isinstance(server, float) and server.is_integer():  # (a counter's delta: a float in Prometheus)
        server = int(server)
    if expected is not None or server is not None:
        rows.append("Prefix cache (prompt tokens served from it)")
        rows.append(("Expected from hash ids / server-reported", f"{_fmt(expected)} / {_fmt(server)}"))
    if "images_sent" in s:
        rows += [
            "Images (server counts the tokens)",
            ("Image requests / images sent", f"{s['image_requests']:,} / {s['images_sent']:,}"),
            ("Image bytes sent", s["image_bytes_sent"]),
            (
                "Image tokens server / expected",
                f"{_fmt(s['image_tokens_server'])} / {_fmt(s['image_tokens_expected'])}",
            ),
            (
                "Image-token mismatches / not reported",
                f"{s['image_token_mismatches']:,} / {s['image_tokens_unknown']:,}",
            ),
            (
                "Image cache hits expected / server",
                f"{s['expected_image_cache_hits']:,} / {_fmt(s.get('server_image_cache_hits'))}",
            ),
        ]
    return rows


def _section_rows(s: dict) -> list[tuple[str, object] | str]:
    """Sessions, endpoints and the pooling usage audit, where the run had them."""
    rows: list[tuple[str, object] | str] = []
    if s.get("sessions"):
        ss = s["sessions"]
        rows.append("Sessions (turn waits for its predecessor)")
        rows.append(("Sessions / turns / turns held", f"{ss['sessions']} / {ss['turns']} / {ss['turns_held']}"))
        w = ss["session_wait_ms"]
        rows.append(("Session wait p50 / p99 / max (ms)", " / ".join(_fmt(w[k]) for k in ("p50", "p99", "max"))))
    if s.get("endpoints"):
        rows.append("Endpoints (completed / failed)")
        rows.extend((k, f"{v['completed']} / {v['failed']}") for k, v in s["endpoints"].items())
    if s.get("usage_audit"):
        rows.append("Pooling usage audit (ok / inflated / missing)")
        rows.extend(
            (k, " / ".join(str(v[a]) for a in ("ok", "inflated", "missing"))) for k, v in s["usage_audit"].items()
        )
    return rows


def _failure_rows(s: dict) -> list[tuple[str, object] | str]:
    """What failures cost beyond the error rate: session turns not sent after a failed turn, and
    the HTTP errors told apart (429 rate limited, 503 overloaded, other)."""
    rows: list[tuple[str, object] | str] = []
    lost = (s.get("sessions") or {}).get("turns_lost")
    if lost:
        rows.append(("Turns lost (an earlier turn of the session failed)", f"{lost:,}"))
    http = s.get("http_errors")
    if http:
        counts = f"{http['rate_limited']:,} / {http['overloaded']:,} / {http['other']:,}"
        rows.append(("HTTP errors: 429 rate limited / 503 overloaded / other", counts))
    return rows


def _pace_rows(s: dict, fmt: Callable[[object], str]) -> list[tuple[str, object] | str]:
    """The rows of ``--max-concurrency`` (how often the cap made requests wait, and how long)
    and of the warm-up (its requests, left out of every other number)."""
    rows: list[tuple[str, object] | str] = []
    cap = s.get("concurrency_cap")
    if cap:
        rows.append(f"Concurrency cap (--max-concurrency {cap.get('max_concurrency', '?')})")
        waited, n = cap.get("waited", 0), cap.get("requests", 0)
        share = cap.get("waited_share")
        rows.append(("Requests that waited for a slot", f"{waited:,} of {n:,}" + (f" ({share:.1%})" if share else "")))
        w = cap.get("queue_wait_ms") or {}
        rows.append(("Queue wait p50 / p99 / max (ms)", " / ".join(fmt(w.get(k)) for k in ("p50", "p99", "max"))))
        if waited:
            rows.append(("The cap set the pace (from-due latency incl. wait)", "yes"))
    warm = s.get("warmup")
    if warm:
        rows.append("Warm-up (left out of every number above and below)")
        rows.append(
            (
                "Warm-up requests (sent / ok / failed)",
                f"{warm.get('sent', 0):,} / {warm.get('completed', 0):,} / {warm.get('failed', 0):,}",
            )
        )
    return rows


def fmt_ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.2f}"


def format_groups(title: str, sections: dict, tail: Callable[[dict], str]) -> str:
    """One line per group (tenant, target) of a summary section: requests, outcomes, TTFT p50 /
    p99 and E2E p50 (``stats.latency_fields``' names), then ``tail(section)``."""
    lines = [title]
    for name, s in sections.items():
        lines.append(
            f"  {name}: {s.get('requests', 0)} requests ({s.get('completed', 0)} ok, {s.get('failed', 0)} failed), "
            f"TTFT p50 {fmt_ms(s.get('median_ttft_ms'))} / p99 {fmt_ms(s.get('p99_ttft_ms'))} ms, "
            f"E2E p50 {fmt_ms(s.get('median_e2e_ms'))}{tail(s)}"
        )
    return "\n".join(lines)
