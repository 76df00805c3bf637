"""Rows that carry images, and the check before a run that they can be sent.

Images travel as content parts of a chat message (``/v1/chat/completions``) beside the text of
the row's token blocks; a token-id endpoint (``/v1/completions`` with token ids, embeddings) has
no place for them, so a trace with images sent there is refused before anything is sent, with
the flags that work. (Sending the text alone would measure another workload and call it this one.)
"""

from __future__ import annotations

import pyarrow.parquet as pq

from replayer.core.endpoints import CHAT, endpoint_kind
from replayer.trace import parse_mapping

#: Columns that give a row images.
IMAGE_COUNT_COLUMNS = ("image_ids", "num_images")


class ImageEndpointError(ValueError):
    """Rows with images would go to an endpoint that cannot take them."""


def image_count(batch, i: int) -> int:
    """Images of row ``i`` of a trace batch (``image_ids``, else ``num_images``; 0 without)."""
    ids = getattr(batch, "image_ids", None)
    if ids is not None and ids[i] is not None:
        return len(ids[i])
    num = getattr(batch, "num_images", None)
    return (num[i] or 0) if num is not None else 0


def row_images(batch, i: int, row: int, default_size: str) -> list[tuple[str, int, int]]:
    """(image id, width, height) of each image of row ``i`` of a trace batch (``row``: its global
    trace row): ids from ``image_ids`` (equal ids = the same image) or, with only ``num_images``,
    ids of the row's own (``#row<row>.<k>``: each image new); sizes from ``image_sizes``, else
    ``default_size`` (``WxH``)."""
    n = image_count(batch, i)
    if not n:
        return []
    ids = getattr(batch, "image_ids", None)
    ids = ids[i] if ids is not None else None
    sizes = getattr(batch, "image_sizes", None)
    sizes = sizes[i] if sizes is not None else None
    out = []
    for k in range(n):
        w, h = (sizes[k] if sizes else default_size).split("x")
        out.append((ids[k] if ids is not None else f"#row{row}.{k}", int(w), int(h)))
    return out


def may_have_images(source, mapping: str | None) -> bool:
    """Whether the trace may carry image columns, without reading its rows (a loaded trace: the
    columns; Parquet: the schema; other sources: assume it may)."""
    trace = getattr(source, "trace", None)
    if trace is not None:
        return any(getattr(trace, c, None) is not None for c in IMAGE_COUNT_COLUMNS)
    files = getattr(source, "files", None)
    if files:
        m = parse_mapping(mapping)
        names = pq.read_schema(files[0]).names
        return any(m.get(c, c) in names for c in IMAGE_COUNT_COLUMNS)
    return True


def check_image_endpoints(batches, trace: str, endpoint: str) -> int:
    """Raise ImageEndpointError when a row with images goes to an endpoint other than chat (the
    row's ``endpoint``, else ``endpoint``); returns the number of rows with images."""
    default = endpoint_kind(endpoint)
    rows = bad = 0
    first = None
    for batch in batches:
        eps = getattr(batch, "endpoint", None)
        for i in range(len(batch)):
            if image_count(batch, i):
                rows += 1
                kind = endpoint_kind(eps[i]) if eps is not None and eps[i] else default
                if kind != CHAT:
                    bad += 1
                    first = first or (int(batch.source_row[i]), kind)
    if bad:
        assert first is not None  # set with the first bad row
        raise ImageEndpointError(
            f"{trace}: {bad} rows carry images (image_ids / num_images; first: row {first[0]}) but would go to "
            f"{first[1]}, which takes token ids and no images. Images are sent as image content parts of a chat "
            "message beside the text of the row's blocks: pass --endpoint /v1/chat/completions --prompt-mode text "
            "--tokenizer PATH (a local tokenizer of the target's model); the server counts the image tokens (usage)"
        )
    return rows
