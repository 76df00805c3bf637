"""Log output of the daemon: text or JSON lines, secrets redacted, and error bursts summarised.

``setup_logging(fmt, level, secrets=...)`` installs one stderr handler on the root logger:
``fmt="text"`` gives ``<time> <LEVEL> <logger>: <message>``; ``fmt="json"`` gives one JSON object
per line (``JsonFormatter``). Either way a secret (API key, control token) in a formatted line is
replaced by ``[redacted]`` where it stands as a value (a header value, a URL's credentials, a
config dump's entry), never inside a longer word: a short token redacted inside every word that
holds it would garble the log and give itself away by the words around it.

Warnings (``warnings.warn``, e.g. the trace reader's ``TraceOrderWarning`` for an unsorted trace)
are logged through the same handler, one line each, instead of Python's two-line
``file:line: Category: message`` print.

``ErrorBurstLog`` turns a stream of failed results into a few lines per error kind: one when
failures of that kind start, then at most one summary per window (10 s) with the count and the
last error, and one when a window passes without any; never one line per request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import warnings
from collections.abc import Iterable
from datetime import datetime, timezone
from urllib.parse import quote

from replayer.core.result import RequestResult

__all__ = ["JsonFormatter", "RedactingFormatter", "ErrorBurstLog", "setup_logging", "log_warning", "TEXT_FORMAT"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_REDACTED = "[redacted]"
#: attributes every LogRecord has; anything else on a record came from ``extra=`` (a field)
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime"}


#: a secret shorter than this is too short to be one (warned about at start: ``short_secrets``)
MIN_SECRET_CHARS = 8
#: the characters that make a secret part of a longer word (not redacted there: "tok" in "tokens")
_WORD = "A-Za-z0-9_"


def _pattern(secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    """One regex matching each secret (and its URL-encoded form) where it stands as a value:
    not preceded or followed by a letter, digit or underscore (a header value, a URL's
    credentials, a quoted or ``key=value`` config entry), never inside a longer word."""
    forms = sorted({f for s in secrets for f in (s, quote(s, safe="")) if f}, key=len, reverse=True)
    if not forms:
        return None
    return re.compile(f"(?<![{_WORD}])(?:{'|'.join(map(re.escape, forms))})(?![{_WORD}])")


def _redact(text: str, pattern: re.Pattern[str] | None) -> str:
    return text if pattern is None else pattern.sub(_REDACTED, text)


def short_secrets(named: dict[str, str | None]) -> list[str]:
    """The names of the secrets in ``named`` (name -> value) shorter than ``MIN_SECRET_CHARS``:
    a value that short is a word, not a secret, and guessable from the lines it is redacted in."""
    return [name for name, value in named.items() if value and len(value) < MIN_SECRET_CHARS]


def warn_short_secrets(named: dict[str, str | None]) -> None:
    """Log a warning for each secret of ``named`` too short to be one (``short_secrets``)."""
    for name in short_secrets(named):
        logging.getLogger("replayer").warning(
            "%s is under %d characters: too short to be a secret (guessable, and a word of the log): use a long "
            "random value; it is redacted only where it stands alone",
            name,
            MIN_SECRET_CHARS,
        )


class RedactingFormatter(logging.Formatter):
    """A ``logging.Formatter`` that removes ``secrets`` (non-empty strings) from its output."""

    def __init__(self, fmt: str | None = None, *, secrets: Iterable[str | None] = ()) -> None:
        super().__init__(fmt)
        self.secrets = tuple(s for s in secrets if s)
        self._pattern = _pattern(self.secrets)

    def format(self, record: logging.LogRecord) -> str:
        return _redact(super().format(record), self._pattern)


class JsonFormatter(RedactingFormatter):
    """One JSON object per record: ``ts`` (ISO-8601 UTC, ms, ``Z``), ``level`` (lower case),
    ``logger``, ``msg`` (the formatted message), then every ``extra=`` field of the record
    (non-JSON values as ``str``), and ``exc`` (the traceback text) when an exception is attached.
    Newlines inside values are escaped, so a line is always one record."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, tz=timezone.utc)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in vars(record).items():
            if k not in _STANDARD_ATTRS and k not in out and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = record.stack_info
        return _redact(json.dumps(out, default=str, ensure_ascii=False), self._pattern)


def setup_logging(
    fmt: str = "text",
    level: str = "info",
    *,
    secrets: Iterable[str | None] = (),
    stream=None,
    fields: dict[str, str] | None = None,
) -> logging.Handler:
    """Route every log record to one handler on ``stream`` (default stderr) with the ``fmt``
    formatter (``text`` or ``json``) at ``level``; replaces handlers already on the root logger.
    ``fields``: added to every record (e.g. ``{"shard": "1/4"}``, so the lines of N shards on one
    terminal or in one log store tell apart): a JSON field each, ``logger[shard 1/4]`` in text.
    Returns the handler."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log format must be text or json, got {fmt!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    text = TEXT_FORMAT
    if fields:
        tag = " ".join(f"{k} {v}" for k, v in fields.items())
        text = TEXT_FORMAT.replace("%(name)s", f"%(name)s[{tag.replace('%', '%%')}]")

        def add_fields(record: logging.LogRecord) -> bool:
            for k, v in fields.items():
                setattr(record, k, v)
            return True

        handler.addFilter(add_fields)
    handler.setFormatter(JsonFormatter(secrets=secrets) if fmt == "json" else RedactingFormatter(text, secrets=secrets))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    warnings.showwarning = log_warning
    return handler


def log_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: object = None,
    line: str | None = None,
) -> None:
    """``warnings.showwarning`` that logs a warning as one WARNING line: the replayer's own
    (``TraceOrderWarning``) by their message alone on their package's logger (``replayer.trace``),
    with no source line; any other as ``Category: message (file:line)`` on ``py.warnings``."""
    module = getattr(category, "__module__", "") or ""
    if module == "replayer" or module.startswith("replayer."):
        logging.getLogger(".".join(module.split(".")[:2])).warning("%s", message)
    else:
        logging.getLogger("py.warnings").warning("%s: %s (%s:%s)", category.__name__, message, filename, lineno)


class _Burst:
    __slots__ = ("count", "last_error", "last_status", "timer")

    def __init__(self) -> None:
        self.count = 0
        self.last_error: str | None = None
        self.last_status: int | None = None
        self.timer: asyncio.TimerHandle | None = None


class ErrorBurstLog:
    """Rate-limited logging of failed requests, per error kind (``res.error_kind``).

    ``observe(res)`` takes every finished result (anything but ``failed`` is ignored at once).
    The first failure of a kind logs a warning and opens a window of ``window_s``; when a window
    ends, the failures of that kind during it are logged as ONE line ("12 requests failed with
    http_status in the last 10 s; last error: ...") and a new window opens; a window with none
    ends the burst ("... no longer failing"), so the next failure logs a start line again.
    Windows are timed with ``loop.call_later`` on the running event loop (``observe`` must be
    called from it). ``close()`` logs what the open windows hold and cancels their timers.
    Lines carry the fields ``error_kind``, ``failed`` (count) and ``window_s``.
    """

    def __init__(self, logger: logging.Logger | None = None, *, window_s: float = 10.0) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.log = logger or logging.getLogger("replayer.failures")
        self.window_s = window_s
        self._bursts: dict[str, _Burst] = {}
        self.lines = 0  # lines logged (for tests and curiosity)

    def observe(self, res: RequestResult) -> None:
        if res.outcome != "failed":
            return
        kind = res.error_kind
        b = self._bursts.get(kind)
        if b is None:
            b = self._bursts[kind] = _Burst()
            self._emit(
                logging.WARNING,
                "requests started failing with %s%s: %s",
                kind,
                _status(res.http_status),
                _short(res.error),
                kind=kind,
                failed=1,
            )
            b.timer = asyncio.get_running_loop().call_later(self.window_s, self._window_end, kind)
            return
        b.count += 1
        b.last_error = res.error
        b.last_status = res.http_status

    def _window_end(self, kind: str) -> None:
        b = self._bursts.get(kind)
        if b is None:
            return
        if b.count:
            self._summary(kind, b)
            b.count = 0
            b.timer = asyncio.get_running_loop().call_later(self.window_s, self._window_end, kind)
        else:
            del self._bursts[kind]
            self._emit(
                logging.INFO,
                "requests no longer failing with %s (none in the last %g s)",
                kind,
                self.window_s,
                kind=kind,
                failed=0,
            )

    def _summary(self, kind: str, b: _Burst) -> None:
        self._emit(
            logging.WARNING,
            "%d requests failed with %s in the last %g s; last error: %s%s",
            b.count,
            kind,
            self.window_s,
            _short(b.last_error),
            _status(b.last_status),
            kind=kind,
            failed=b.count,
        )

    def close(self) -> None:
        """Log the failures of every open window (no start/stop lines) and cancel the timers."""
        for kind, b in list(self._bursts.items()):
            if b.timer is not None:
                b.timer.cancel()
            if b.count:
                self._summary(kind, b)
        self._bursts.clear()

    def _emit(self, level: int, msg: str, *args: object, kind: str, failed: int) -> None:
        self.lines += 1
        self.log.log(level, msg, *args, extra={"error_kind": kind, "failed": failed, "window_s": self.window_s})


def _status(status: int | None) -> str:
    return f" (HTTP {status})" if status else ""


def _short(error: str | None, limit: int = 200) -> str:
    if not error:
        return "-"
    error = " ".join(error.split())  # one line
    return error if len(error) <= limit else error[:limit] + "..."
