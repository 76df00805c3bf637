"""The simulator's images: decode chat image parts, count their tokens, cache their encodings.

An ``image_url`` content part holding a base64 data URL is decoded with Pillow (a part that is
not a decodable image is a 400, as vLLM answers); its tokens come from the decoded size by the
configured rule (``replayer.payload.image_tokens``; with no flags the rule is the replayer's default, so a
replay against the simulator shows no image-token mismatch). The encoder cache is an LRU keyed by
the image's content (a hash of its decoded pixels, as vLLM hashes image content), bounded in
images: a hit skips the simulated encoder time. Its queries and hits are exported as vLLM's
``vllm:mm_cache_queries`` / ``vllm:mm_cache_hits`` (counted in items). Decoding is memoised per
data URL (a small LRU), so a repeated image is decoded once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from replayer.payload.image_tokens import parse_rule

_DECODED_KEEP = 1024  # data URLs whose decode result is kept


class ImageError(ValueError):
    """A content part that is not a usable image (the request is answered 400)."""


@dataclass(frozen=True, slots=True)
class DecodedImage:
    content_hash: int  # 62-bit hash of the decoded pixels (mode, size, bytes)
    width: int
    height: int
    tokens: int


class SimImages:
    """Decoding, token counting and the encoder cache of the simulator."""

    def __init__(self, rule: str = "qwen2-vl", cache_images: int = 1024) -> None:
        self.rule = parse_rule(rule) or (lambda w, h: 0)
        self.cache_images = cache_images
        self._cache: OrderedDict[int, None] = OrderedDict()
        self._decoded: OrderedDict[bytes, DecodedImage] = OrderedDict()
        self.queries = 0
        self.hits = 0

    def decode(self, url: object) -> DecodedImage:
        """The image of a ``data:image/...;base64,`` URL. Raises ImageError."""
        if not isinstance(url, str) or not url.startswith("data:image/") or ";base64," not in url:
            raise ImageError("the sim takes images only as data:image/...;base64, URLs")
        key = hashlib.blake2b(url.encode("ascii", "replace"), digest_size=16).digest()
        got = self._decoded.get(key)
        if got is not None:
            self._decoded.move_to_end(key)
            return got
        from PIL import Image, UnidentifiedImageError

        try:
            raw = base64.b64decode(url.split(";base64,", 1)[1], validate=True)
            with Image.open(io.BytesIO(raw)) as src:
                pixels = np.asarray(src.convert("RGB"))
        except (binascii.Error, UnidentifiedImageError, OSError, ValueError) as e:
            raise ImageError(f"image could not be decoded: {e}") from None
        h, w = pixels.shape[:2]
        digest = hashlib.blake2b(b"RGB%dx%d" % (w, h) + pixels.tobytes(), digest_size=8).digest()
        got = DecodedImage(int.from_bytes(digest, "big") >> 2, w, h, int(self.rule(w, h)))
        self._decoded[key] = got
        if len(self._decoded) > _DECODED_KEEP:
            self._decoded.popitem(last=False)
        return got

    def lookup(self, img: DecodedImage) -> bool:
        """Encoder-cache lookup (and insert) of an image by content: True on a hit."""
        self.queries += 1
        if img.content_hash in self._cache:
            self._cache.move_to_end(img.content_hash)
            self.hits += 1
            return True
        if self.cache_images:
            self._cache[img.content_hash] = None
            if len(self._cache) > self.cache_images:
                self._cache.popitem(last=False)
        return False

    @staticmethod
    def token_ids(img: DecodedImage) -> np.ndarray:
        """Stand-in token ids of the image's placeholder tokens, from its content (so the prefix
        cache sees the same image as the same tokens, and different images as different ones)."""
        return np.int64(img.content_hash) + np.arange(img.tokens, dtype=np.int64)
