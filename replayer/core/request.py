"""The request record: one request ready to send, built in the lead window, read by the planner,
the senders and the client, and the result record it starts (``new_result``)."""

from __future__ import annotations

from dataclasses import dataclass

from replayer.core.endpoints import COMPLETIONS
from replayer.core.result import RequestResult


@dataclass(slots=True)
class PreparedRequest:
    """A request ready to send: where it came from, when it is due, and its body bytes.

    Sessions (``replayer.plan.sessions``): ``dep`` is the key this request waits on (its session, or
    its parent request), ``key`` the key it releases when it ends, ``think_ns`` the trace's think
    time (trace ns). ``release_ns``: when the session gate let it go (None if never held).
    Pooling audit: ``expected_once`` / ``expected_per_doc`` are the prompt tokens the server
    should report with the query counted once / per document (score, rerank).
    """

    index: int  # position in the schedule (0-based)
    row: int  # row index in the trace
    due_ns: int  # offset from the run anchor t0_ns
    body: bytes
    input_length: int
    output_length: int
    prompt_len: int  # token ids in the body's prompt (all inputs together)
    max_tokens: int
    loop: int = 0
    trace_ns: int = 0  # trace-time offset (loop offset included); due_ns is derived from it
    expected_hits: int | None = None  # expected prefix-cache hit tokens (replayer.payload.prefix_cache)
    path: str | None = None  # endpoint path; None = the client's default
    endpoint: str = COMPLETIONS  # known endpoint kind (results, metrics)
    session_id: str | None = None
    turn: int | None = None
    dep: object = None
    key: object = None
    think_ns: int = 0
    release_ns: int | None = None
    n_documents: int | None = None
    expected_once: int | None = None
    expected_per_doc: int | None = None
    x_request_id: str | None = None  # the X-Request-Id header's value (RequestFactory.request_id)
    headers: bytes = b""  # extra header lines of the HTTP head ("Name: value\r\n"...),
    #                                   built in the lead window like the body
    tenant: str | None = None  # the trace of a mix (replayer.trace.mix)
    target: str | None = None  # the target URL it goes to with several targets (replayer.send.routing)
    trace_pos_ns: int | None = None  # the row's own trace offset when --idle-gap-cap moved trace_ns
    images: int = 0  # images in the body (multimodal rows; replayer.payload.images)
    image_bytes: int = 0  # their encoded size (before base64)
    expected_image_tokens: int | None = None  # the trace's image_tokens, else the --image-token-rule's
    expected_image_cache_hits: int = 0  # its images sent before in the run (an encoder cache could hit them)

    def new_result(self, shard: int, due_ns: int | None = None, sent: bool = True) -> RequestResult:
        """The result record this request starts with (outcome ``not_started``): its birth fields
        copied from the request. ``sent=False``: a request recorded without being sent (a stop),
        so nothing of it was sent (``prompt_len_sent`` and ``max_tokens`` 0, no expected hits)."""
        return RequestResult(
            row=self.row,
            loop=self.loop,
            shard=shard,
            input_length=self.input_length,
            output_length=self.output_length,
            prompt_len_sent=self.prompt_len if sent else 0,
            max_tokens=self.max_tokens if sent else 0,
            due_ns=self.due_ns if due_ns is None else due_ns,
            expected_prefix_hit_tokens=self.expected_hits if sent else None,
            endpoint=self.endpoint,
            session_id=self.session_id,
            turn=self.turn,
            n_documents=self.n_documents,
            expected_prompt_tokens_once=self.expected_once,
            expected_prompt_tokens_per_document=self.expected_per_doc,
            x_request_id=self.x_request_id,
            tenant=self.tenant,
            target=self.target,
            images=self.images,
            image_bytes=self.image_bytes,
            expected_image_tokens=self.expected_image_tokens,
            expected_image_cache_hits=self.expected_image_cache_hits,
        )
