"""The end of a run seen by Prometheus: a linger of ``/metrics`` and a push to a Pushgateway.

When the replay ends, its counters are final but Prometheus has not read them yet: the admin
server closing at once would leave the last scrape interval unseen (a CI run of one interval
unseen entirely). So, after the summary:

* ``--metrics-push URL`` pushes the whole exposition (run id included) once to that Pushgateway,
  grouped by ``job="replayer"``, ``run_id`` and ``instance`` (this host and admin port), where it
  stays until deleted (Prometheus scrapes the gateway with ``honor_labels: true``);
* ``--metrics-linger S`` keeps ``/metrics`` served up to S seconds. It ends early once every
  scraper seen during the run (by address and user agent) has scraped again after the end, so
  the final values are seen, and at once on SIGINT/SIGTERM. Unset, it is ``DEFAULT_LINGER_S``
  (two scrape intervals of 15 s, a common interval; ``deploy/prometheus/prometheus.yml`` scrapes
  every 5 s; Prometheus's own default is 60 s: give ``--metrics-linger 120`` there) when a
  scraper came (a request with Prometheus's ``X-Prometheus-Scrape-Timeout-Seconds`` header:
  a one-off ``curl`` is not waited for), and nothing when none did (``make run``, tests): nobody
  waits for values no one reads. With a linger given and no scraper seen, any read of
  ``/metrics`` after the end ends it. The log says when it lingers, for how long and how to skip it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from typing import Any, Protocol

from prometheus_client.exposition import push_to_gateway

log = logging.getLogger("replayer")

#: the linger when none is given and a scraper was seen: two scrape intervals of 15 s
DEFAULT_LINGER_S = 30.0
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Scraped(Protocol):
    """What the admin server says about its scrapes: ``scrapers`` maps each reader's key
    (address, user agent) to the monotonic time of its last read of ``/metrics``;
    ``scrape_jobs`` holds the keys of those that sent Prometheus's scrape header (a Prometheus
    or another scraper that comes back every interval; not a one-off ``curl``)."""

    scrapers: dict[tuple[str, str], float]
    scrape_jobs: set[tuple[str, str]]


def linger_for(setting: float | None, scraped: Scraped) -> float:
    """Seconds to linger: ``setting`` when given, else ``DEFAULT_LINGER_S`` if a scraper came."""
    if setting is not None:
        return max(0.0, setting)
    return DEFAULT_LINGER_S if scraped.scrape_jobs else 0.0


async def linger(scraped: Scraped, seconds: float, *, poll_s: float = 0.1) -> str:
    """Keep serving (the caller's admin server stays up) up to ``seconds``; returns why it ended:
    ``"scraped"`` (every scraper seen has scraped since the call), ``"signal"`` or ``"time"``."""
    if seconds <= 0:
        return "time"
    ended = time.monotonic()
    before = set(scraped.scrape_jobs)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    installed = []
    for sig in _SIGNALS:
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            pass
    who = ", ".join(sorted(f"{host} ({agent})" for host, agent in before)) or "no Prometheus scrape seen yet"
    log.info(
        "run ended: /metrics stays served up to %g s for a last scrape (%s) (--metrics-linger 0 skips "
        "this; Ctrl-C ends it now)",
        seconds,
        who,
    )
    why = "time"
    try:
        deadline = ended + seconds
        while time.monotonic() < deadline:
            now_seen = scraped.scrapers
            after = {k for k, t in now_seen.items() if t > ended}
            if (before and before <= after) or (not before and after):
                why = "scraped"
                break
            try:
                await asyncio.wait_for(stop.wait(), poll_s)
                why = "signal"
                break
            except TimeoutError:
                pass
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
    log.info("metrics linger over (%s) after %.1f s", why, time.monotonic() - ended)
    return why


def push_once(url: str, exposition: Any, *, run_id: str, instance: str, timeout_s: float = 10.0) -> bool:
    """Push ``exposition`` (an object with ``collect``) to the Pushgateway at ``url``; False
    (logged) when the gateway refused it or did not answer. Blocking: run it in a thread."""
    try:
        push_to_gateway(
            url,
            job="replayer",
            registry=exposition,
            grouping_key={"run_id": run_id, "instance": instance},
            timeout=timeout_s,
        )
    except Exception as e:  # (the results are on disk: a failed push never costs the run)
        log.warning("--metrics-push %s: the push failed (%s: %s)", url, type(e).__name__, e)
        return False
    log.info("metrics pushed to %s (job=replayer, run_id=%s, instance=%s)", url, run_id, instance)
    return True


async def last_scrape(admin: Any, *, run_id: str, linger_s: float | None, push_url: str | None) -> None:
    """The run's end (module docstring): the push of what ``admin`` (the ``AdminServer``) serves
    when asked for, then its linger."""
    exposition = admin.registry
    if push_url:
        instance = push_instance(admin.url)
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: push_once(push_url, exposition, run_id=run_id, instance=instance)
        )
    await linger(admin, linger_for(linger_s, admin))


def push_instance(admin_url: str | None) -> str:
    """The ``instance`` a push is grouped by: this host's name and the admin port."""
    port = admin_url.rsplit(":", 1)[-1] if admin_url else "0"
    return f"{socket.gethostname()}:{port}"
