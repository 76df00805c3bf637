"""A real OTLP/HTTP traces receiver for the tests: an aiohttp server on 127.0.0.1 (its own
thread and loop) that decodes each ``ExportTraceServiceRequest`` (protobuf, opentelemetry-proto)
into plain span dicts. ``mode``: ``ok`` (200), ``refuse`` (HTTP 503 to every export) or ``hang``
(never answers)."""

from __future__ import annotations

import asyncio
import gzip
import threading
import time

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

SERVER, CLIENT, INTERNAL = 2, 3, 1  # Span.SpanKind values


def _value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    return getattr(v, kind) if kind else None


def decode(body: bytes) -> list[dict]:
    """An ExportTraceServiceRequest -> one dict per span (ids as hex, attributes as a dict)."""
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    out = []
    for rs in req.resource_spans:
        service = {a.key: _value(a.value) for a in rs.resource.attributes}.get("service.name")
        for ss in rs.scope_spans:
            for sp in ss.spans:
                out.append(
                    {
                        "service": service,
                        "name": sp.name,
                        "kind": sp.kind,
                        "trace_id": sp.trace_id.hex(),
                        "span_id": sp.span_id.hex(),
                        "parent_span_id": sp.parent_span_id.hex(),
                        "start": sp.start_time_unix_nano,
                        "end": sp.end_time_unix_nano,
                        "attributes": {a.key: _value(a.value) for a in sp.attributes},
                        "events": [(e.name, e.time_unix_nano) for e in sp.events],
                        "status": sp.status.code,
                    }
                )
    return out


class Receiver:
    """``with Receiver() as r: r.url`` (base URL; exports go to ``/v1/traces``); ``r.spans``."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.spans: list[dict] = []
        self.bodies: list[bytes] = []  # the accepted exports, as received
        self.exports = 0
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._lock = threading.Lock()

    async def _traces(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        spans = decode(body)
        with self._lock:
            self.exports += 1
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if self.mode == "refuse":
            return web.Response(status=503)
        with self._lock:
            self.spans.extend(spans)
            self.bodies.append(body)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    async def _start(self) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    def __enter__(self) -> Receiver:
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def wait_for(self, pred, timeout: float = 30.0) -> list[dict]:
        """The spans received once ``pred(spans)`` holds (or after ``timeout``: the test then fails)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                got = list(self.spans)
            if pred(got):
                return got
            time.sleep(0.05)
        with self._lock:
            return list(self.spans)

    def write_jsonl(self, path) -> None:
        """The accepted exports as OTLP JSON lines (protobuf's JSON mapping: base64 ids, the form
        of a file exporter that does not rewrite ids to hex)."""
        from google.protobuf.json_format import MessageToJson

        with self._lock:
            bodies = list(self.bodies)
        with open(path, "w", encoding="utf-8") as f:
            for b in bodies:
                req = ExportTraceServiceRequest()
                req.ParseFromString(b)
                f.write(MessageToJson(req, indent=None) + "\n")
