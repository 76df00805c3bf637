"""A trace row's ``model``, ``priority`` and ``extra_body`` reach the request body (issue 17), in
every trace format that carries them and for every endpoint, with the precedence of
docs/reference/trace-formats.md: the row's extra_body over the built body, the model and priority columns over
both; reserved keys and bad values are refused before anything is sent."""

from __future__ import annotations

import asyncio
import csv
import json
import subprocess
import sys
import threading

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiohttp import web
from test_text_mode import word_tokenizer

from replayer.payload import PayloadBuilder
from replayer.trace import EXTRA_BODY_RESERVED, read_trace

BS = 16


class RecordingServer:
    """A real aiohttp OpenAI-style server on 127.0.0.1 (own thread and loop) that keeps every
    request body it receives (``bodies``: (path, parsed JSON)) and answers each endpoint with a
    minimal valid response (SSE with usage for generation, JSON with usage for pooling)."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, dict]] = []
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "run-model", "object": "model"}]})

    async def _post(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.bodies.append((request.path, body))
        usage = {"prompt_tokens": 1, "total_tokens": 1}
        if request.path.endswith("/completions"):
            n = body["max_tokens"]
            usage = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
            choice = (
                {"index": 0, "delta": {"content": "x"}, "finish_reason": "length"}
                if "chat" in request.path
                else {"index": 0, "text": "x", "finish_reason": "length"}
            )
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for ev in ({"choices": [choice]}, {"choices": [], "usage": usage}):
                await resp.write(b"data: " + orjson.dumps(ev) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        if request.path.endswith("/embeddings"):
            out = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.1]}]}
        elif request.path.endswith("/score"):
            out = {"object": "list", "data": [{"index": 0, "score": 0.5}]}
        else:
            out = {"results": [{"index": 0, "relevance_score": 0.5}]}
        return web.json_response({**out, "usage": usage})

    def __enter__(self) -> "RecordingServer":
        def main() -> None:
            loop = self._loop = asyncio.new_event_loop()
            app = web.Application(client_max_size=1 << 26)
            app.router.add_get("/v1/models", self._models)
            app.router.add_post("/{tail:.*}", self._post)
            runner = web.AppRunner(app, access_log=None)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            self._ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=main, daemon=True)
        self._thread.start()
        assert self._ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)


def _hash(n: int, base: int) -> list[int]:
    return [base + j for j in range(-(-n // BS))]


#: (row, the body fields it must produce). Rows carry distinct output lengths (max_tokens) so
#: generation bodies can be told apart; pooling endpoints appear once each.
ROWS = [
    (
        {
            "endpoint": "completions",
            "output_length": 11,
            "model": "m-a",
            "priority": 5,
            "extra_body": {"temperature": 0.25, "ignore_eos": False, "model": "loses-to-column", "priority": 9},
        },
        {"model": "m-a", "priority": 5, "temperature": 0.25, "ignore_eos": False},
    ),
    ({"endpoint": "completions", "output_length": 12}, {"model": "run-model", "ignore_eos": True}),
    (
        {
            "endpoint": "completions",
            "output_length": 13,
            "extra_body": {"model": "from-extra", "top_k": 3, "nested": {"a": [1, 2]}},
        },
        {"model": "from-extra", "top_k": 3, "nested": {"a": [1, 2]}},
    ),
    (
        {"endpoint": "chat", "output_length": 14, "priority": -2, "extra_body": {"seed": 7}},
        {"model": "run-model", "priority": -2, "seed": 7},
    ),
    (
        {
            "endpoint": "embeddings",
            "model": "emb-m",
            "priority": 1,
            "extra_body": {"truncate_prompt_tokens": 10},
            "document_lengths": [10, 10],
        },
        {"model": "emb-m", "priority": 1, "truncate_prompt_tokens": 10},
    ),
    (
        {"endpoint": "score", "model": "score-m", "priority": 0, "query_length": 5, "document_lengths": [15]},
        {"model": "score-m", "priority": 0},
    ),
    (
        {"endpoint": "rerank", "extra_body": {"top_n": 1}, "query_length": 4, "document_lengths": [8, 8]},
        {"model": "run-model", "top_n": 1},
    ),
]


def _rows() -> list[dict]:
    out = []
    for i, (r, _) in enumerate(ROWS):
        row = {"timestamp": 5 * i, "input_length": 20, "output_length": 1, **r}
        row["hash_ids"] = _hash(row["input_length"], 100 * i)
        out.append(row)
    return out


def _write(path, fmt: str) -> str:
    rows = _rows()
    names = list(dict.fromkeys(k for r in rows for k in r))
    if fmt == "jsonl":  # extra_body as inline objects
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "csv":  # lists and objects as JSON text in their cells, empty cell = not set
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(names)
            for r in rows:
                w.writerow(
                    [
                        "" if r.get(k) is None else json.dumps(r[k]) if isinstance(r[k], (list, dict)) else r[k]
                        for k in names
                    ]
                )
    else:  # extra_body as a string column holding JSON objects
        cols = {k: [json.dumps(r[k]) if k == "extra_body" and k in r else r.get(k) for r in rows] for k in names}
        table = pa.table(cols).replace_schema_metadata({"replayer.block_size": str(BS)})
        pq.write_table(table, path)
    return str(path)


def _run(tmp_path, trace: str, url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            trace,
            "--target",
            url,
            "--results",
            str(tmp_path / "res"),
            "--admin-port",
            "0",
            "--quiet",
            "--block-size",
            str(BS),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_each_rows_model_priority_and_extra_body_reach_the_server(tmp_path, fmt):
    tok = word_tokenizer(tmp_path / "tokenizer.json")
    trace = _write(tmp_path / f"fields.{fmt}", fmt)
    with RecordingServer() as srv:
        p = _run(tmp_path, trace, srv.url, "--tokenizer", tok)
    assert p.returncode == 0, p.stderr[-3000:]
    got = pq.read_table(tmp_path / "res" / "requests.parquet").to_pylist()
    assert sorted(r["outcome"] for r in got) == ["success"] * len(ROWS), [r["error"] for r in got]
    assert len(srv.bodies) == len(ROWS)
    by_key = {}
    for path, body in srv.bodies:
        by_key[(path, body.get("max_tokens"))] = body
    for (row, want), row_full in zip(ROWS, _rows()):
        path = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}.get(
            row["endpoint"], f"/v1/{row['endpoint']}"
        )
        body = by_key[(path, row["output_length"] if "output_length" in row else None)]
        for key, value in want.items():
            assert body[key] == value, (row, key, body)
        if "priority" not in want:
            assert "priority" not in body, body
        # what the replayer builds from the row is untouched
        if path == "/v1/completions":
            assert body["stream"] is True
            assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
            assert body["max_tokens"] == row["output_length"] and len(body["prompt"]) == row_full["input_length"]
        elif path == "/v1/chat/completions":
            assert body["stream"] is True and body["messages"][0]["role"] == "user"
        elif path == "/v1/embeddings":
            assert [len(x) for x in body["input"]] == row["document_lengths"]
        elif path == "/v1/score":
            assert isinstance(body["text_1"], str) and len(body["text_2"]) == 1
        else:
            assert isinstance(body["query"], str) and len(body["documents"]) == 2


def test_bad_values_are_refused_naming_file_row_and_field_before_anything_is_sent(tmp_path):
    base = {"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": _hash(20, 1)}
    rows = [
        dict(base, extra_body=[1, 2]),
        dict(base, priority="high"),
        dict(base, priority=1.5),
        dict(base, extra_body={"stream": False, "max_tokens": 3}),
        dict(base, extra_body="{not json"),
        dict(base, model=7),
    ]
    trace = tmp_path / "bad.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with RecordingServer() as srv:
        p = _run(tmp_path, str(trace), srv.url)
    assert p.returncode == 2, p.stderr[-3000:]
    err = p.stderr
    assert f"{trace}: row 1: extra_body: expected a JSON object" in err
    assert f"{trace}: row 2: priority: expected an integer, got string 'high'" in err
    assert f"{trace}: row 3: priority: expected an integer, got non-integer 1.5" in err
    assert f"{trace}: row 4: extra_body: sets 'max_tokens', 'stream'" in err
    assert f"{trace}: row 5: extra_body: not valid JSON" in err
    assert f"{trace}: row 6: model: expected a string" in err
    assert srv.bodies == []


def test_a_priority_column_of_floats_with_nulls_reads_as_integers(tmp_path):
    # pandas writes an integer column with missing values as float64 with NaN
    table = pa.table(
        {
            "timestamp": [0, 1, 2],
            "input_length": [5, 5, 5],
            "output_length": [1, 1, 1],
            "hash_ids": [[1], [2], [3]],
            "priority": pa.array([3.0, float("nan"), -1.0]),
        }
    )
    pq.write_table(table, tmp_path / "p.parquet")
    t = read_trace(str(tmp_path / "p.parquet"))
    assert t.priority == [3, None, -1]


def test_for_row_precedence_reserved_keys_and_reuse():
    b = PayloadBuilder("run", vllm_extensions=False)
    assert b.for_row(None, None, None) is b
    r = b.for_row("m", 4, '{"model": "x", "priority": 1, "temperature": 0}')
    assert r is b.for_row("m", 4, '{"model": "x", "priority": 1, "temperature": 0}')  # one per distinct row
    assert orjson.loads(r.body(b"[1,2]", 3)) == {
        "model": "m",
        "stream": True,
        "priority": 4,
        "temperature": 0,
        "stream_options": {"include_usage": True},
        "max_tokens": 3,
        "prompt": [1, 2],
    }
    assert orjson.loads(r.embeddings_body([b"[1]"])) == {"model": "m", "priority": 4, "temperature": 0, "input": [[1]]}
    assert orjson.loads(b.body(b"[1]", 2))["model"] == "run"  # the run's builder is unchanged
    for key in sorted(EXTRA_BODY_RESERVED):
        with pytest.raises(ValueError, match=key):
            b.for_row(None, None, json.dumps({key: 1}))
    with pytest.raises(ValueError, match="JSON object"):
        b.for_row(None, None, "[1]")


def test_a_parquet_struct_extra_body_sends_only_each_rows_own_keys(tmp_path):
    # pyarrow makes a struct column of dicts: every row gets every key, the missing ones null;
    # a null must not override what the replayer builds (ignore_eos) or reach the server as a key
    table = pa.table(
        {
            "timestamp": [0, 5],
            "input_length": [10, 10],
            "output_length": [2, 2],
            "hash_ids": [[1], [2]],
            "extra_body": [{"temperature": 0.5, "opts": {"a": 1}}, {"ignore_eos": False, "opts": {"b": 2}}],
        }
    )
    pq.write_table(table, tmp_path / "s.parquet")
    t = read_trace(str(tmp_path / "s.parquet"))
    assert [json.loads(x) for x in t.extra_body] == [
        {"temperature": 0.5, "opts": {"a": 1}},
        {"ignore_eos": False, "opts": {"b": 2}},
    ]
