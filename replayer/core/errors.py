"""Outcome and error-kind enums: the closed label sets for results and metrics.

Every request ends as exactly one ``Outcome``; failed requests carry exactly one ``ErrorKind``
(the client maps transport failures to kinds where they happen: ``replayer.http.client``). The four
timeout kinds tell apart where the time ran out; every failure carries a non-empty message
besides its kind.
"""

from __future__ import annotations

import enum


class Outcome(str, enum.Enum):
    """How a scheduled request ended (a closed set: safe as a Prometheus label)."""

    SUCCESS = "success"  # stream ended properly and carried no error
    FAILED = "failed"  # the target or the transport failed; see ErrorKind
    CANCELLED = "cancelled"  # in flight when the replay was stopped and the drain ran out
    NOT_STARTED = "not_started"  # scheduled but never sent (replay stopped before its due time)
    MISSED_WHILE_DOWN = "missed_while_down"  # a fleet shard was down at its due time: not sent, never resent


#: the summary's name of each outcome's count (the top level and every per-tenant or per-target
#: section: ``completed`` is vllm bench serve's name for the successful requests)
SUMMARY_COUNTS = {
    Outcome.SUCCESS: "completed",
    Outcome.FAILED: "failed",
    Outcome.CANCELLED: "cancelled",
    Outcome.NOT_STARTED: "not_started",
}


class ErrorKind(str, enum.Enum):
    """Why a request failed (closed set; the free-text message goes to results only)."""

    NONE = "none"
    CONNECT = "connect"  # could not connect (refused, DNS)
    TLS_ERROR = "tls_error"  # TLS failed: unknown CA, name mismatch, expired, client certificate, handshake timeout
    CONNECT_TIMEOUT = "connect_timeout"  # no connection within --connect-timeout
    FIRST_BYTE_TIMEOUT = "first_byte_timeout"  # no response byte within --read-timeout of the send
    IDLE_TIMEOUT = "idle_timeout"  # a response went silent for --read-timeout (between two reads)
    TOTAL_TIMEOUT = "total_timeout"  # response not complete --request-timeout after the send
    HTTP_STATUS = "http_status"  # HTTP 4xx/5xx; the body is recorded
    STREAM_ERROR = "stream_error"  # an error object inside the response (200 or not)
    PROTOCOL = "protocol"  # malformed SSE or JSON, no choices and no usage
    DISCONNECT = "disconnect"  # the server closed the connection mid-response (or a new one before any byte)
    STALE_CONNECTION = "stale_connection"  # a reused keep-alive connection closed before any response byte
    INCOMPLETE = "incomplete"  # stream ended with no finish_reason, [DONE] or usage
    USAGE = "usage"  # a pooling response without a usable usage object
    CANCELLED = "cancelled"  # cancelled by shutdown
    DEPENDENCY = "dependency"  # not sent: an earlier turn of its session (or its parent) failed (outcome cancelled)
    CLIENT = "client"  # any other client-side exception (a bug worth reporting)
