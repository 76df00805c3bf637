"""The capture's worker process and the event loop's channel to it: the per-token work of a
finished request (parsing its body, the block digests, parsing a ``/tokenize`` answer) runs
there, never on the loop that relays streams.

Why not ``concurrent.futures.ProcessPoolExecutor``: its ``submit`` wakes a manager thread through
a pipe, and a queue feeder thread pickles the call: two threads that take the GIL from the event
loop at every request, so the requests and stream events waiting on the loop wait for them too.
Here the channel is one Unix socket read and written by the loop itself (an ``asyncio.Protocol``;
writes are buffered by the transport, never blocking), with no thread on the proxy's side.

Frames on the socket: a 4-byte big-endian length, then a pickle. The first frame to the worker
is ``(key, block_size)`` (the hash key travels in memory, never in argv or a file); each call is
``(call_id, name, args)`` and its answer ``(call_id, ok, result or error text)``. The worker runs
the calls one at a time in order. When it dies, the calls waiting fail with ``WorkerGone`` and
the caller does the work itself.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
import subprocess
import sys
from collections.abc import Callable

import orjson

from replayer.capture.blocks import BlockHasher, content_hash
from replayer.capture.rows import RequestFacts, request_facts

FRAME = struct.Struct("!I")


class WorkerGone(Exception):
    """The worker process ended (or was never reachable)."""


def frame(obj) -> bytes:
    """``obj`` as one frame: its pickle's length (4 bytes, big-endian), then the pickle (``Frames`` reads them)."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return FRAME.pack(len(data)) + data


class Frames:
    """Cuts a byte stream into frames (sans I/O: ``feed`` returns the complete frames' objects)."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> list:
        self.buf += data
        out = []
        pos = 0
        buf = self.buf
        while len(buf) - pos >= FRAME.size:
            (n,) = FRAME.unpack_from(buf, pos)
            if len(buf) - pos - FRAME.size < n:
                break
            out.append(pickle.loads(memoryview(buf)[pos + FRAME.size : pos + FRAME.size + n]))
            pos += FRAME.size + n
        if pos:
            del buf[:pos]
        return out


class OffloadWorker(asyncio.Protocol):
    """The proxy's side: ``await start(key, block_size)``, then ``await call(name, *args)``
    (``name``: one of ``CALLS``); ``close()`` ends the worker once no call is waiting (calls still
    waiting then fail with ``WorkerGone``)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.transport: asyncio.Transport | None = None
        self._waiting: dict[int, asyncio.Future] = {}
        self._next = 0
        self._frames = Frames()
        self.gone = False

    async def start(self, key: bytes, block_size: int) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "replayer.capture.offload", str(child.fileno())],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        finally:
            child.close()
        loop = asyncio.get_running_loop()
        await loop.connect_accepted_socket(lambda: self, parent)
        assert self.transport is not None
        self.transport.write(frame((key, block_size)))
        await self.call("ready")  # imported and keyed: not during the first requests

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        for call_id, ok, value in self._frames.feed(data):
            fut = self._waiting.pop(call_id, None)
            if fut is not None and not fut.done():
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(RuntimeError(f"in the capture worker: {value}"))

    def connection_lost(self, exc) -> None:
        self.gone = True
        waiting, self._waiting = self._waiting, {}
        for fut in waiting.values():
            if not fut.done():
                fut.set_exception(WorkerGone("the capture worker process ended"))

    def call(self, name: str, *args) -> asyncio.Future:
        """``CALLS[name](*args)`` in the worker; the future fails with ``WorkerGone`` if it dies."""
        fut = asyncio.get_running_loop().create_future()
        if self.gone or self.transport is None or self.transport.is_closing():
            fut.set_exception(WorkerGone("the capture worker process is not running"))
            return fut
        self._next += 1
        self._waiting[self._next] = fut
        self.transport.write(frame((self._next, name, args)))
        return fut

    async def close(self, timeout_s: float = 10.0) -> None:
        """End the worker: it stops when it reads the socket's end (killed after ``timeout_s``)."""
        if self.transport is not None:
            self.transport.close()
        if self.proc is not None:
            loop = asyncio.get_running_loop()
            try:
                await asyncio.wait_for(loop.run_in_executor(None, self.proc.wait), timeout_s)
            except asyncio.TimeoutError:
                self.proc.kill()
                self.proc.wait()


# ---- the worker process -------------------------------------------------------------------------
_hasher: BlockHasher | None = None
_key = b""


def _image_hash(data) -> str:
    return content_hash(_key, data)


def facts_and_digests(
    hasher: BlockHasher | None, image_hash, endpoint: str, body: bytes, session: str | None
) -> tuple[RequestFacts, list[bytes] | None, int]:
    """The body's facts (without its token ids) and, for a token-id prompt, its block digests and
    token count. ``hasher`` / ``image_hash`` None: the worker process's own."""
    hasher = hasher or _hasher
    assert hasher is not None
    facts = request_facts(endpoint, body, session, image_hash or _image_hash)
    if facts.token_ids is None:
        return facts, None, 0
    n = len(facts.token_ids)
    digests = hasher.digests(facts.token_ids)
    facts.token_ids = None
    return facts, digests, n


def digests_of_tokenize_answer(hasher: BlockHasher | None, data: bytes) -> tuple[list[bytes], int] | None:
    """A ``/tokenize`` answer's tokens as block digests and their count (None: no tokens in it)."""
    hasher = hasher or _hasher
    assert hasher is not None
    try:
        tokens = orjson.loads(data).get("tokens")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    if type(tokens) is not list or not tokens or not all(type(t) is int for t in tokens):
        return None
    return hasher.digests(tokens), len(tokens)


#: what the proxy may call in the worker (the worker's own hasher and image hash)
CALLS: dict[str, Callable[..., object]] = {
    "facts_and_digests": lambda *a: facts_and_digests(None, None, *a),
    "digests_of_tokenize_answer": lambda *a: digests_of_tokenize_answer(None, *a),
    "ready": lambda: True,
}


def _serve(sock: socket.socket) -> None:
    global _hasher, _key
    f = sock.makefile("rwb")

    def read():
        head = f.read(FRAME.size)
        if len(head) < FRAME.size:
            return None
        (n,) = FRAME.unpack(head)
        data = f.read(n)
        return pickle.loads(data) if len(data) == n else None

    init = read()
    if init is None:
        return
    _key, block_size = init
    _hasher = BlockHasher(_key, block_size)
    while (msg := read()) is not None:
        call_id, name, args = msg
        try:
            out = (call_id, True, CALLS[name](*args))
        except Exception as e:  # the proxy logs it and goes on without this row's hash ids
            out = (call_id, False, f"{type(e).__name__}: {e}")
        f.write(frame(out))
        f.flush()


if __name__ == "__main__":
    import signal

    # a Ctrl-C or SIGTERM to the process group is the proxy's to handle (it drains, and this
    # process still hashes what is queued); the socket's end is this process's signal to stop
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _serve(socket.socket(fileno=int(sys.argv[1])))
