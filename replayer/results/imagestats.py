"""The summary's multimodal part: images sent, their bytes, image tokens (server and expected).

The server's count is the truth (``usage.prompt_tokens_details.image_tokens``); the expectation
(the trace's ``image_tokens`` or ``--image-token-rule``) is kept apart and a difference is counted
(``image_token_mismatches``), never replaced. A count the server did not report is unknown: left
out of ``image_tokens_server`` (None when no request reported one), never 0; text tokens
(prompt - image) only where both are known. Folded batch by batch and mergeable, like
``fold.SummaryFold``, of which it is a part.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

#: results columns this part reads
COLUMNS = ("images", "image_bytes", "expected_image_tokens", "image_tokens", "text_tokens", "expected_image_cache_hits")
_COUNTS = (
    "image_requests",
    "images_sent",
    "image_bytes_sent",
    "image_tokens_server",
    "image_tokens_reported",
    "image_tokens_expected",
    "image_tokens_expected_known",
    "image_token_mismatches",
    "text_tokens_server",
    "image_requests_completed",
    "expected_image_cache_hits",
)


def _f64(col) -> np.ndarray:
    return col.to_numpy(zero_copy_only=False).astype(np.float64)


class ImageFold:
    """Counts over the rows with images (``images > 0``)."""

    def __init__(self) -> None:
        self.n = dict.fromkeys(_COUNTS, 0)
        self.seen = False  # a batch had image columns and some row images

    def add(self, t: pa.Table | pa.RecordBatch, was_sent: np.ndarray, ok: np.ndarray) -> None:
        if "images" not in t.schema.names:
            return
        images = _f64(t.column("images"))
        mm = np.nan_to_num(images) > 0
        if not mm.any():
            return
        self.seen = True
        n = self.n
        sent = mm & was_sent
        n["image_requests"] += int(sent.sum())
        n["images_sent"] += int(images[sent].sum())
        n["image_bytes_sent"] += int(np.nansum(_f64(t.column("image_bytes"))[sent]))
        if "expected_image_cache_hits" in t.schema.names:
            n["expected_image_cache_hits"] += int(np.nansum(_f64(t.column("expected_image_cache_hits"))[sent]))
        done = mm & ok
        n["image_requests_completed"] += int(done.sum())
        server = _f64(t.column("image_tokens"))[done]
        expected = _f64(t.column("expected_image_tokens"))[done]
        known = ~np.isnan(server)
        n["image_tokens_server"] += int(server[known].sum())
        n["image_tokens_reported"] += int(known.sum())
        e_known = ~np.isnan(expected)
        n["image_tokens_expected"] += int(expected[e_known].sum())
        n["image_tokens_expected_known"] += int(e_known.sum())
        both = known & e_known
        n["image_token_mismatches"] += int((server[both] != expected[both]).sum())
        text = _f64(t.column("text_tokens"))[done]
        n["text_tokens_server"] += int(np.nansum(text))

    def merge(self, other: "ImageFold") -> None:
        for k, v in other.n.items():
            self.n[k] += v
        self.seen |= other.seen

    def result(self) -> dict:
        """The summary's multimodal keys ({} when no row had images)."""
        if not self.seen:
            return {}
        n = self.n
        reported = n["image_tokens_reported"]
        return {
            "image_requests": n["image_requests"],
            "images_sent": n["images_sent"],
            "image_bytes_sent": n["image_bytes_sent"],
            # server-counted, over the completed image requests that reported them (None: none did)
            "image_tokens_server": n["image_tokens_server"] if reported else None,
            "image_tokens_reported": reported,
            "image_tokens_unknown": n["image_requests_completed"] - reported,
            "text_tokens_server": n["text_tokens_server"] if reported else None,
            "image_tokens_expected": n["image_tokens_expected"] if n["image_tokens_expected_known"] else None,
            "image_token_mismatches": n["image_token_mismatches"],
            # images sent again (an encoder cache keyed by content could serve them; the server's
            # own count, where it exports one, is server_image_cache_hits)
            "expected_image_cache_hits": n["expected_image_cache_hits"],
        }
