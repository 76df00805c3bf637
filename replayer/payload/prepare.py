"""Schedule item -> PreparedRequest: the prompt (hash-id expansion), the body for the row's
endpoint, its session keys and its expected prefix-cache hits. Pure and deterministic: the same
trace, seed and settings give byte-identical bodies in every process.

Per endpoint (the row's ``endpoint`` column, else ``--endpoint``; ``replayer.payload.body``):

* ``/v1/completions``: token ids (default) or, with ``--prompt-mode text``, the decoded text;
* ``/v1/chat/completions``: text (decoded with ``--tokenizer``) as user message(s);
* ``/v1/embeddings``: token ids, split into a batch by ``document_lengths`` (else one input);
* ``/v1/score``, ``/v1/rerank``: the row's ``input_length`` tokens cut into the query
  (``query_length``) and the documents (``document_lengths``), each decoded to text.

A row's ``model``, ``priority`` and ``extra_body`` columns go into its body
(``PayloadBuilder.for_row``; built here, in the lead window, like the rest of the body).

Sessions: each row's keys for the session gate and its session header (``replayer.payload.sessionkeys``);
prompt builders per pass and the expected prefix-cache model: ``replayer.payload.loopprompts``.

Prefix growth without hash ids (a session's turn is its conversation so far): ``replayer.payload.growth``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np
import orjson

from replayer.core.endpoints import CHAT, COMPLETIONS, EMBEDDINGS, POOLING, SCORE, endpoint_kind
from replayer.core.events import QUIET, RequestEvents
from replayer.core.request import PreparedRequest
from replayer.core.result import RequestResult
from replayer.core.tracecontext import TraceContext
from replayer.payload.body import PayloadBuilder
from replayer.payload.growth import Conversations
from replayer.payload.image_tokens import parse_rule
from replayer.payload.imageprefetch import ImagePrefetch
from replayer.payload.imagerows import image_count, row_images
from replayer.payload.images import ImageParts
from replayer.payload.loopprompts import Prompts
from replayer.payload.prefix_cache import modelled
from replayer.payload.sessionkeys import session_header_lines, session_header_value, session_keys
from replayer.payload.textprefetch import TextPrefetch
from replayer.payload.textprompts import TextPromptBuilder
from replayer.plan.schedule import ScheduleBatch, Timeline, column_value

if TYPE_CHECKING:
    from replayer.trace import Trace

log = logging.getLogger(__name__)

#: items of the first schedule batch whose images and texts are made before the run is anchored
WARM_ROWS = 64
#: most requests built before the run is anchored (``RequestFactory.prebuild``)
PREBUILD_MAX = 10_000


#: optional per-row columns ``prepare`` reads (as ``column_value`` would, looked up once per batch)
_ROW_COLUMNS = (
    "endpoint",
    "session_id",
    "turn",
    "model",
    "priority",
    "extra_body",
    "tenant",
    "image_ids",
    "num_images",
)


def _grows(batch: object, kind: str, session: object) -> bool:
    """A turn whose prompt is its session's conversation so far (a trace without hash ids:
    ``replayer.payload.growth``), not the blocks of its own hash ids."""
    return session is not None and getattr(batch, "hash_ids_synthetic", False) and kind in (COMPLETIONS, CHAT)


class RequestFactory:
    """Builds the PreparedRequest (``prepare``) or the never-sent RequestResult (``unsent``) of
    item ``j`` of a schedule batch. Raises ValueError for a row its settings cannot build (a
    text-only endpoint without ``--tokenizer``: ``check_endpoints`` reports it before the run).

    ``endpoint``: of rows without an ``endpoint`` column (``--endpoint``); ``text_mode``: text
    prompts on completions (``--prompt-mode text``); ``sessions``: rows wait on their session or
    parent (``--session-policy`` not ``off``); ``shard``: recorded in each result;
    ``session_header``: ``--session-header`` (a header name or preset carrying the session id);
    ``image_*``: the multimodal settings (``--image-size``, ``--image-format``,
    ``--image-token-rule``, ``--image-cache-mb``).
    ``run_id``: each request gets the header ``X-Request-Id: <run_id>-<loop>-<row>``
    (``request_id``), built here in the lead window with the body, and the result records it
    (``x_request_id``); None sends no such header. ``trace_context`` (``--otlp-endpoint``): each
    request's head also carries its W3C ``traceparent`` (``replayer.core.tracecontext``). ``targets``:
    with several targets, their URLs, indexed by the schedule's route (``ScheduleBatch.targets``).
    ``events``: the run's event stream, told of each request handed out (``prepared``); nothing
    here touches metrics (the stream's subscribers count each request, its expected hits too)."""

    def __init__(
        self,
        prompts: Prompts,
        payload: PayloadBuilder,
        timeline: Timeline,
        *,
        endpoint: str = COMPLETIONS,
        text_mode: bool = False,
        sessions: bool = False,
        shard: int = 0,
        run_id: str | None = None,
        session_header: str | None = None,
        image_size: str = "512x512",
        image_format: str = "png",
        image_token_rule: str = "qwen2-vl",
        image_cache_mb: int = 256,
        trace_context: TraceContext | None = None,
        targets: Sequence[str] | None = None,
        events: RequestEvents = QUIET,
    ) -> None:
        self.run_id = run_id
        self.targets = targets
        self.events = events
        self.trace_context = trace_context
        self.prompts = prompts
        self.payload = payload
        self.timeline = timeline
        self.shard = shard
        self.default_endpoint = endpoint_kind(endpoint)
        self.text_mode = text_mode
        self.sessions = sessions
        self.session_header = session_header_lines(session_header)
        self.image_size, self.image_format = image_size, image_format
        self.image_token_rule, self.image_cache_mb = image_token_rule, image_cache_mb
        self._conversations = Conversations()  # prefix growth without hash ids
        self._seen: tuple[Trace, int, int] | None = None  # (batch, loop, next row to observe)
        self._cols: tuple = (None,)  # (batch, *its _ROW_COLUMNS or None)
        self._image_src: ImageParts | None = None  # built on the first image
        self._image_rule: Callable[[int, int], int] | None = None
        self._prefetch: ImagePrefetch | None = None
        self._text_prefetch: TextPrefetch | None = None  # started by the first text row
        self._prebuilt: tuple[ScheduleBatch, dict[int, PreparedRequest]] | None = None  # (batch, item -> request)

    # -- the request --------------------------------------------------------------------------
    def prebuild(self, sb: ScheduleBatch | None, lead_ns: int, cap: int = PREBUILD_MAX) -> int:
        """Before the run is anchored: build the requests of ``sb`` due within ``lead_ns`` of the
        start (at most ``cap``), in order, so that the first lead window is not built at the
        start of the run, behind its due times (a run whose first second is hundreds of
        requests started late and stayed late). ``prepare`` hands them out; returns how many."""
        if sb is None:
            return 0
        built: dict[int, PreparedRequest] = {}
        j = 0
        while j < min(cap, len(sb)) and self.timeline.due(int(sb.trace_ns[j])) <= lead_ns:
            try:
                built[j] = self._build(sb, j)
            except Exception:  # this row fails again, visibly, when the run prepares it
                log.debug("prebuild stopped at item %d", j, exc_info=True)
                break
            j += 1
        self._prebuilt = (sb, built) if built else None
        return len(built)

    def prepare(self, sb: ScheduleBatch, j: int) -> PreparedRequest:
        """Item ``j`` of ``sb`` as a request (built now, or by ``prebuild``), its target set when
        there are several, told to the event stream (``prepared``) as it is handed out."""
        req = None
        if self._prebuilt is not None and self._prebuilt[0] is sb:
            req = self._prebuilt[1].pop(j, None)
            if not self._prebuilt[1]:
                self._prebuilt = None
        if req is None:
            req = self._build(sb, j)
        if self.targets is not None:  # several targets: the route chose one per row (replayer.send.routing)
            req.target = self.targets[sb.targets[j]]  # type: ignore[index]
        self.events.prepared(req)
        return req

    def _build(self, sb: ScheduleBatch, j: int) -> PreparedRequest:
        t = cast("Trace", sb.batch)  # (the plan types its batches as object)
        i = int(sb.idx[j])
        self._observe_unsent(t, sb.loop, i)
        n_in, n_out = int(t.input_length[i]), int(t.output_length[i])
        hash_ids = t.hash_ids(i)
        if self._cols[0] is not t:  # the batch's optional columns, looked up once per batch
            self._cols = (t, *(getattr(t, name, None) for name in _ROW_COLUMNS))
        _, c_path, c_session, c_turn, c_model, c_priority, c_extra, c_tenant, c_img, c_nimg = self._cols
        path = None if c_path is None else c_path[i]
        kind = endpoint_kind(path) if path else self.default_endpoint
        session = None if c_session is None else c_session[i]
        turn = None if c_turn is None else c_turn[i]
        trace_ns = int(sb.trace_ns[j])
        req = PreparedRequest(
            index=sb.first_index + j,
            row=int(sb.rows[j]),
            due_ns=self.timeline.due(trace_ns),
            body=b"",
            input_length=n_in,
            output_length=n_out,
            prompt_len=n_in,
            max_tokens=n_out,
            loop=sb.loop,
            trace_ns=trace_ns,
            path=path,
            endpoint=kind,
            session_id=session,
            turn=turn,
            tenant=None if c_tenant is None else c_tenant[i],
        )
        if sb.trace_pos_ns is not None:
            req.trace_pos_ns = int(sb.trace_pos_ns[j])
        if self.run_id is not None:
            req.x_request_id = rid = self.request_id(sb.loop, req.row)
            req.headers = b"X-Request-Id: " + rid.encode("ascii") + b"\r\n"
        if self.session_header is not None and session is not None:
            req.headers += self.session_header % session_header_value(session, sb.loop)
        if self.trace_context is not None:
            req.headers += self.trace_context.header(sb.loop, req.row)
        if self.sessions:
            session_keys(req, t, i, sb.loop, session)
        payload = self.payload.for_row(
            None if c_model is None else c_model[i],
            None if c_priority is None else c_priority[i],
            None if c_extra is None else c_extra[i],
        )
        if kind in POOLING:
            self._pooling(req, payload, t, i, hash_ids, kind, sb.loop)
        elif _grows(t, kind, session):
            loop = sb.loop
            builder = self.prompts.for_loop(loop)
            self._conversations.build(
                req, payload, hash_ids, (loop, session), kind, builder, lambda: self._text(loop), self.text_mode
            )
        else:
            ids = c_img[i] if c_img is not None else None
            n_img = len(ids) if ids is not None else (c_nimg[i] if c_nimg is not None else None) or 0
            if n_img:
                if kind != CHAT:
                    raise ValueError(
                        f"row {req.row}: images need the chat API (--endpoint /v1/chat/completions "
                        f"--tokenizer PATH); {kind} takes no images"
                    )
                text = self._prompt_text(sb, j, hash_ids, n_in, True, int(n_img))
                req.body = payload.image_body(text, self._image_parts(req, sb, j, t, i), n_out)
            elif kind == CHAT or self.text_mode:
                text = self._prompt_text(sb, j, hash_ids, n_in, kind == CHAT, 0)
                req.body = payload.text_body(text, n_out, chat=kind == CHAT)
            else:
                # (prompt_json takes Sequence[int]; the row's int64 array serves as one)
                prompt = self.prompts.for_loop(sb.loop).prompt_json(hash_ids, n_in)  # type: ignore[arg-type]
                req.body = payload.body(prompt, n_out)
            frame = self._frame(kind, sb.loop, int(n_img))
            req.expected_hits = self.prompts.expected_cache(sb.loop).observe(hash_ids, n_in, *frame)
        return req

    def _observe_unsent(self, t, loop: int, i: int) -> None:
        """Before row ``i`` of batch ``t`` is prepared, feed the expected prefix-cache model the
        rows before it that this process does not send (other shards' rows, rows a resumed run
        skips), in trace order: a shard's expected hits are then those of one process replaying
        the whole trace against one server. (Rows of a batch holding none of this shard's rows
        are not seen: batches hold 65,536 rows.)"""
        seen = self._seen
        if seen is not None and (seen[0] is not t or seen[1] != loop):
            self._observe_rows(seen[0], seen[1], seen[2], len(seen[0]))  # the previous batch's tail
            seen = None
        self._observe_rows(t, loop, seen[2] if seen is not None else 0, i)
        self._seen = (t, loop, i + 1)

    def _observe_rows(self, t, loop: int, a: int, b: int) -> None:
        if a >= b:
            return
        model = self.prompts.expected_cache(loop)
        for k in range(a, b):
            path = column_value(t, "endpoint", k)
            kind = endpoint_kind(path) if path else self.default_endpoint
            if not modelled(kind, column_value(t, "session_id", k), getattr(t, "hash_ids_synthetic", False)):
                continue  # rows whose prompt is not their hash ids' blocks (as prepare decides)
            images = image_count(t, k) if kind == CHAT else 0
            model.observe(t.hash_ids(k), int(t.input_length[k]), *self._frame(kind, loop, images))

    def _frame(self, kind: str, loop: int, images: int) -> tuple[int, int]:
        """(head, tail) the server counts around a text prompt's blocks (its chat template's
        prefix and generation prompt: ``TextPromptBuilder.frame``); (0, 0) for token ids."""
        if not (kind == CHAT or self.text_mode or images) or not self.prompts.tokenizer:
            return 0, 0
        return self._text(loop).frame(kind == CHAT, images)

    def unsent(self, sb: ScheduleBatch, j: int) -> RequestResult:
        t = cast("Trace", sb.batch)
        i = int(sb.idx[j])
        path = column_value(t, "endpoint", i)
        return RequestResult(
            row=int(sb.rows[j]),
            loop=sb.loop,
            shard=self.shard,
            due_ns=self.timeline.due(int(sb.trace_ns[j])),
            input_length=int(t.input_length[i]),
            output_length=int(t.output_length[i]),
            endpoint=endpoint_kind(path) if path else self.default_endpoint,
            session_id=column_value(t, "session_id", i),
            turn=column_value(t, "turn", i),
            tenant=column_value(t, "tenant", i),
            x_request_id=None if self.run_id is None else self.request_id(sb.loop, int(sb.rows[j])),
        )

    def request_id(self, loop: int, row: int) -> str:
        """The ``X-Request-Id`` of trace row ``row`` in pass ``loop``: unique in the run (a retry
        re-sends the same id; a row sent again by a resume too, as the same row of the same run)."""
        return f"{self.run_id}-{loop}-{row}"

    # -- pieces -------------------------------------------------------------------------------
    def _image_parts(self, req: PreparedRequest, sb: ScheduleBatch, j: int, t, i: int) -> list[bytes]:
        """The row's images as chat content parts (``imagerows.row_images``), from the image
        cache (built ahead by ``imageprefetch`` or now). Sets the request's image count, bytes,
        expected image tokens and expected image-cache hits."""
        prefetch = self._images()
        seed = self.prompts.for_loop(sb.loop).seed
        prefetch.at(sb, j, seed)
        parts, nbytes, expected, again = [], 0, 0, 0
        images = row_images(t, i, req.row, self.image_size)
        src = self._image_src
        assert src is not None  # made by _images()
        for image_id, w, h in images:
            part, size = src.part(seed, image_id, w, h)
            again += src.seen(seed, image_id, w, h)
            parts.append(part)
            nbytes += size
            if self._image_rule is not None:
                expected += self._image_rule(w, h)
        n = len(images)
        req.images, req.image_bytes, req.expected_image_cache_hits = n, nbytes, again
        trace_tokens = column_value(t, "image_tokens", i)
        req.expected_image_tokens = (
            trace_tokens if trace_tokens is not None else (expected if self._image_rule is not None else None)
        )
        return parts

    def _images(self) -> ImagePrefetch:
        """The image cache and its prefetch (made on the first image row)."""
        if self._prefetch is None:
            self._image_src = ImageParts(self.image_format, self.image_cache_mb << 20)
            self._image_rule = parse_rule(self.image_token_rule)
            self._prefetch = ImagePrefetch(self._image_src, self.image_size)
        return self._prefetch

    def _texts(self) -> TextPrefetch:
        """The text prefetch (made on the first text row)."""
        if self._text_prefetch is None:
            p = self.prompts
            assert p.tokenizer is not None  # callers check it first (see _text)
            self._text_prefetch = TextPrefetch(p.tokenizer, p.block_size, p.vocab, self._text_item)
        return self._text_prefetch

    def warm_up(self, sb: ScheduleBatch | None, n: int = WARM_ROWS, timeout_s: float = 30.0) -> tuple[int, int]:
        """Before the run is anchored: the images and prompt texts of the first ``n`` items of the
        first schedule batch, built and decoded by the prefetch children (started now), so the first
        requests due are not late by the children's start or by building them in the lead window.
        Returns (rows with images, texts decoded); (0, 0) when the batch needs neither."""
        try:
            return self._warm_up(sb, n, timeout_s)
        except Exception:  # (a row's problem is reported when preparation meets it)
            log.debug("warm-up stopped", exc_info=True)
            return 0, 0

    def _warm_up(self, sb: ScheduleBatch | None, n: int, timeout_s: float) -> tuple[int, int]:
        if sb is None:
            return 0, 0
        m = min(n, len(sb))
        batch = sb.batch  # (a batch without image columns has no row with images)
        columns = getattr(batch, "image_ids", None) is not None or getattr(batch, "num_images", None) is not None
        image_rows = [k for k in range(m) if image_count(batch, int(sb.idx[k]))] if columns else []
        text_rows = [k for k in range(m) if self._text_item(sb, k) is not None]
        texts = 0
        if text_rows and self.prompts.tokenizer:
            texts = self._texts().warm(sb, n, self._text(sb.loop).builder.seed, timeout_s)
        if image_rows:
            self._images().warm(sb, n, self.prompts.for_loop(sb.loop).seed)
        return len(image_rows), texts

    def _prompt_text(self, sb: ScheduleBatch, j: int, hash_ids, n_in: int, chat: bool, images: int) -> str:
        """The prompt text of item ``j``: made ahead by ``textprefetch``'s child, else now."""
        text = self._text(sb.loop)
        prefetch = self._texts()
        prefetch.at(sb, j, text.builder.seed)
        got = prefetch.take(sb, j)
        return got if got is not None else text.prompt_text(hash_ids, n_in, chat, images)

    def _text_item(self, sb: ScheduleBatch, k: int):
        """(hash ids, input_length, chat, images) of item ``k`` when ``prepare`` sends it as a text
        prompt of its own blocks (chat, text mode; not pooling or prefix growth), else None. Run by
        the prefetch thread."""
        t = cast("Trace", sb.batch)
        i = int(sb.idx[k])
        path = column_value(t, "endpoint", i)
        kind = endpoint_kind(path) if path else self.default_endpoint
        if kind in POOLING or _grows(t, kind, column_value(t, "session_id", i)) or not (kind == CHAT or self.text_mode):
            return None
        images = image_count(t, i) if kind == CHAT else 0
        return t.hash_ids(i), int(t.input_length[i]), kind == CHAT or bool(images), int(images)

    def _text(self, loop: int) -> TextPromptBuilder:
        if not self.prompts.tokenizer:
            raise ValueError("this row needs text (chat, score or rerank endpoint): pass --tokenizer PATH")
        return self.prompts.text_for_loop(loop)

    def _pooling(
        self, req: PreparedRequest, payload: PayloadBuilder, t: object, i: int, hash_ids, kind: str, loop: int
    ) -> None:
        n_in = req.input_length
        ids = self.prompts.for_loop(loop).prompt_ids(hash_ids, n_in)
        docs = column_value(t, "document_lengths", i)
        q = column_value(t, "query_length", i) or 0
        req.max_tokens = 0
        if kind == EMBEDDINGS:
            cuts: np.ndarray | list[int] = np.cumsum(docs)[:-1] if docs else []
            parts = np.split(ids, cuts) if docs else [ids]
            req.body = payload.embeddings_body([orjson.dumps(p, option=orjson.OPT_SERIALIZE_NUMPY) for p in parts])
            req.n_documents = len(parts)
            return
        if not docs:
            raise ValueError(f"row {req.row}: {kind} needs query_length and document_lengths in the trace")
        text = self._text(loop)
        query = text.decode(ids[:q])
        bounds = np.cumsum([q, *docs])
        documents = [text.decode(ids[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        body = payload.score_body if kind == SCORE else payload.rerank_body
        req.body = body(query, documents)
        req.n_documents = len(docs)
        req.expected_once = q + int(sum(docs))
        req.expected_per_doc = len(docs) * q + int(sum(docs))
