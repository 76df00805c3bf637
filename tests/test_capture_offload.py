"""The capture's worker process and its channel (``replayer.capture.offload``): frames cut right
however the bytes come, answers equal to the same work done in process, and a worker that dies
failing its calls (``WorkerGone``) so that the tokenization queue does the work itself and every
row still gets its hash ids. A real worker process over a real Unix socket."""

from __future__ import annotations

import asyncio
import os
import signal

import orjson
import pytest

from replayer.capture.blocks import BlockHasher
from replayer.capture.metrics import CaptureMetrics
from replayer.capture.offload import Frames, OffloadWorker, WorkerGone, facts_and_digests, frame
from replayer.capture.tokenize import Tokenization

KEY = b"k" * 32


def test_frames_are_cut_right_however_the_bytes_come():
    objs = [(1, "a", (b"x" * 70_000,)), (2, True, None), {"k": [1, 2, 3]}]
    stream = b"".join(frame(o) for o in objs)
    for step in (1, 3, 4, 5, 4096, len(stream)):
        f, got = Frames(), []
        for i in range(0, len(stream), step):
            got += f.feed(stream[i : i + step])
        assert got == objs and not f.buf, step


def body(ids: list[int]) -> bytes:
    return orjson.dumps({"model": "m", "prompt": ids, "max_tokens": 4, "user": "s1"})


def test_the_worker_answers_as_the_work_done_in_process_and_reports_its_errors():
    async def main():
        w = OffloadWorker()
        await w.start(KEY, 16)
        try:
            ids = list(range(100))
            facts, digests, n = await w.call("facts_and_digests", "/v1/completions", body(ids), None)
            here = facts_and_digests(BlockHasher(KEY, 16), None, "/v1/completions", body(ids), None)
            assert (facts, digests, n) == here and n == 100 and len(digests) == 7
            assert facts.session_id == "s1" and facts.max_tokens == 4 and facts.token_ids is None
            # many calls at once come back to their own callers
            many = await asyncio.gather(
                *(w.call("digests_of_tokenize_answer", orjson.dumps({"tokens": [i] * 40})) for i in range(50))
            )
            assert [m[1] for m in many] == [40] * 50 and len({tuple(m[0]) for m in many}) == 50
            with pytest.raises(RuntimeError, match="KeyError"):
                await w.call("no_such_call")
        finally:
            await w.close()
        assert w.proc is not None and w.proc.returncode == 0  # it ended on the socket's close

    asyncio.run(main())


def test_a_worker_that_dies_fails_its_calls_and_the_queue_hashes_on_the_loop():
    async def main():
        w = OffloadWorker()
        await w.start(KEY, 16)
        assert w.proc is not None
        os.kill(w.proc.pid, signal.SIGKILL)
        w.proc.wait()
        with pytest.raises(WorkerGone):
            await w.call("ready")
        rows: list[dict] = []
        hasher = BlockHasher(KEY, 16)
        tok = Tokenization(hasher, rows.append, CaptureMetrics(), offload=w)
        tok.start()
        for i in range(3):
            tok.submit(
                {"endpoint": "/v1/completions", "input_length": None},
                body(list(range(i * 100, i * 100 + 40))),
                None,
                None,
            )
        await tok.drain()
        assert tok.offload is None  # gave up on the worker, said so in the log
        assert [r["tokenized_by"] for r in rows] == ["request"] * 3
        assert [r["hash_ids"] for r in rows] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]

    asyncio.run(main())
