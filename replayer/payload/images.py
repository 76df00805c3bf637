"""Synthetic images for multimodal replay: one deterministic image per (seed, image id, size).

Why deterministic: a server's multimodal (encoder) cache and its prefix cache key images by their
content, so the replay must send the very same image wherever the trace says "same id" and a
different one everywhere else. The pixels come from a keyed BLAKE2b of (seed, id, size) feeding
PCG64's raw 64-bit stream (a fixed algorithm, the same on every machine), laid out as a mosaic of
16-pixel tiles of random colours plus a diagonal colour ramp of random slopes (wrapping mod 256):
structure at two scales that an encoder cannot collapse (not a flat colour), cheap to build with
numpy, and quick to encode as PNG (its Sub filter turns a ramp into a constant).
PNG is lossless, so its pixels are the same wherever it is decoded; the encoded bytes are those of
the installation's zlib (PNG) or Pillow's libjpeg (JPEG), the same across its processes.

``ImageParts`` keeps each image as the JSON text of its chat content part
(``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``) in an LRU bounded
in bytes, so a request reusing an image only joins bytes.
"""

from __future__ import annotations

import base64
import hashlib
import io
import struct
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

IMAGE_KEY = b"replayer.image.v1"
FORMATS = ("png", "jpeg")
TILE = 16


def image_seed(seed: int, image_id: str, width: int, height: int) -> int:
    """The 64-bit seed of an image (keyed BLAKE2b: the same in every process and machine)."""
    msg = f"{int(seed)}\x00{image_id}\x00{int(width)}x{int(height)}".encode()
    return int.from_bytes(hashlib.blake2b(msg, digest_size=8, key=IMAGE_KEY).digest(), "big")


def image_pixels(seed: int, image_id: str, width: int, height: int) -> np.ndarray:
    """The image's RGB pixels, uint8[height, width, 3]."""
    bg = np.random.PCG64(image_seed(seed, image_id, width, height))
    gh, gw = -(-height // TILE), -(-width // TILE)
    n = gh * gw * 3
    tiles = bg.random_raw(-(-n // 8) + 1).view(np.uint8)
    a, b = (1 + (int(x) & 7) for x in tiles[-8:-6])  # ramp slopes 1..8, from the extra last word
    colors = tiles[:n].reshape(gh, gw, 3)
    mosaic = np.repeat(colors[:, np.arange(width) // TILE], TILE, axis=0)[:height]
    ramp = np.arange(height, dtype=np.uint8)[:, None] * np.uint8(b) + np.arange(width, dtype=np.uint8)[
        None, :
    ] * np.uint8(a)  # uint8: wraps mod 256
    mosaic += ramp[:, :, None]
    return mosaic


def _png_chunk(tag: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))


def encode_png(pixels: np.ndarray) -> bytes:
    """PNG bytes of RGB ``pixels`` (8-bit, not interlaced): every row with PNG's Sub filter (each
    byte minus the same channel of the pixel to its left, mod 256), deflated at zlib level 1.

    Written here rather than by Pillow, whose encoder tries every filter on every row: for these
    images (tiles plus a ramp) Sub is the right filter anyway (a ramp's rows become a constant and
    the rows of a tile row become nearly equal), and the whole encoding costs ~4x less (a 1024x1024
    image: ~15 ms rather than ~60; ~70 KB rather than ~34 KB). Lossless: any decoder gives back
    ``pixels`` exactly."""
    h, w, _ = pixels.shape
    flat = pixels.reshape(h, w * 3)
    raw = np.empty((h, 1 + w * 3), np.uint8)
    raw[:, 0] = 1  # filter type Sub
    raw[:, 1:4] = flat[:, :3]
    np.subtract(flat[:, 3:], flat[:, :-3], out=raw[:, 4:])  # uint8: wraps mod 256, as PNG's Sub
    return b"".join(
        (
            b"\x89PNG\r\n\x1a\n",
            _png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)),
            _png_chunk(b"IDAT", zlib.compress(raw.data, 1)),
            _png_chunk(b"IEND", b""),
        )
    )


def encode_image(pixels: np.ndarray, fmt: str) -> bytes:
    """PNG (``encode_png``: lossless) or JPEG (Pillow, quality 90) bytes of ``pixels``."""
    if fmt == "png":
        return encode_png(pixels)
    if fmt != "jpeg":
        raise ValueError(f"image format {fmt!r}: expected one of {', '.join(FORMATS)}")
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def image_bytes(seed: int, image_id: str, width: int, height: int, fmt: str = "png") -> bytes:
    """The encoded image file of (seed, id, size)."""
    return encode_image(image_pixels(seed, image_id, width, height), fmt)


def content_part(data: bytes, fmt: str) -> bytes:
    """The chat content part (JSON text) carrying ``data`` as a base64 data URL."""
    return b"".join(
        (
            b'{"type":"image_url","image_url":{"url":"data:image/',
            fmt.encode(),
            b";base64,",
            base64.b64encode(data),
            b'"}}',
        )
    )


def build_part(key: tuple[int, str, int, int], fmt: str) -> tuple[bytes, int]:
    """(content part, encoded size) of the image ``key`` = (seed, id, width, height)."""
    data = image_bytes(*key, fmt)
    return content_part(data, fmt), len(data)


class ImageParts:
    """Content parts of synthetic images, cached (LRU bounded to ``cache_bytes`` of part text).

    ``part(seed, id, w, h)`` -> (part JSON bytes, encoded image bytes); ``built`` counts images
    built (cache misses, here or ahead), ``hits`` parts served from the cache."""

    def __init__(self, fmt: str = "png", cache_bytes: int = 256 << 20) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"image format {fmt!r}: expected one of {', '.join(FORMATS)}")
        self.fmt = fmt
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[tuple, tuple[bytes, int]] = OrderedDict()
        self._held = 0
        self.built = 0
        self.hits = 0
        self.waits = 0  # parts waited for while another thread built them
        self._lock = threading.Lock()
        self._building: dict[tuple, Future] = {}
        self._seen: OrderedDict[tuple, None] = OrderedDict()  # images sent before (expected cache hits)

    #: images remembered for ``seen`` (an LRU: the expectation of a cache of that many images)
    SEEN_IMAGES = 1_000_000

    def seen(self, seed: int, image_id: str, width: int, height: int) -> bool:
        """Whether this image was sent before in the run (then a server's encoder cache, if large
        enough, should hit it); remembers it."""
        key = (seed, image_id, width, height)
        if key in self._seen:
            self._seen.move_to_end(key)
            return True
        self._seen[key] = None
        if len(self._seen) > self.SEEN_IMAGES:
            self._seen.popitem(last=False)
        return False

    def part(self, seed: int, image_id: str, width: int, height: int) -> tuple[bytes, int]:
        """The image's content part and encoded size: from the cache, else built now (or, when
        another thread is building it, waited for). Thread-safe (``replayer.payload.imageprefetch``
        builds ahead in a thread)."""
        key = (seed, image_id, width, height)
        with self._lock:
            got = self._cache.get(key)
            if got is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return got
            fut = self._building.get(key)
            mine = fut is None
            if fut is None:
                fut = self._building[key] = Future()
        if not mine:
            self.waits += 1
            return fut.result()
        return self._build(key, fut)

    def build_ahead(
        self,
        seed: int,
        image_id: str,
        width: int,
        height: int,
        build: Callable[[tuple, str], tuple[bytes, int]] | None = None,
    ) -> bool:
        """Build the image into the cache unless it is there or being built (False then).
        ``build(key, fmt)`` -> (part, size) builds it elsewhere (``imageprefetch``: in a process
        of its own); default :func:`build_part`, here."""
        key = (seed, image_id, width, height)
        with self._lock:
            if key in self._cache or key in self._building:
                return False
            fut = self._building[key] = Future()
        self._build(key, fut, build)
        return True

    def _build(self, key: tuple, fut: Future, build=None) -> tuple[bytes, int]:
        try:
            got = (build or build_part)(key, self.fmt)
        except BaseException as e:
            with self._lock:
                del self._building[key]
            fut.set_exception(e)
            raise
        with self._lock:
            self.built += 1
            self._cache[key] = got
            self._held += len(got[0])
            while self._held > self.cache_bytes and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                self._held -= len(old[0])
            del self._building[key]
        fut.set_result(got)
        return got
