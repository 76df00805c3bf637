"""Multimodal hot paths: prints numbers, asserts nothing.

* building a chat request body with two 1024x1024 images already in the image cache (the cost
  in the lead window when the trace reuses images): lookups + joining the cached parts with the
  text of a 1,000-token prompt;
* generating a new image (pixels, PNG or JPEG encoding, base64 part), per size: the cost paid
  once per distinct (seed, id, size), in the lead window.

Run: ``.venv/bin/python bench/bench_multimodal.py``. Numbers are CPU-bound and vary with what else
runs on the machine; latencies are p50 / p99 over many calls, generation the median of 5.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from replayer.payload.body import PayloadBuilder
from replayer.payload.images import ImageParts, content_part, encode_image, image_pixels


def build_with_cached_images(fmt: str, n: int = 500) -> tuple[float, float, int]:
    parts = ImageParts(fmt)
    payload = PayloadBuilder("m", chat=True)
    text = " ".join(f"w{i % 3000}" for i in range(1000))
    for image_id in ("a", "b"):
        parts.part(0, image_id, 1024, 1024)  # built once: the cache holds them
    times = []
    body = b""
    for _ in range(n):
        t = time.perf_counter_ns()
        got = [parts.part(0, image_id, 1024, 1024)[0] for image_id in ("a", "b")]
        body = payload.image_body(text, got, 64)
        times.append(time.perf_counter_ns() - t)
    times.sort()
    return times[n // 2] / 1e3, times[int(n * 0.99)] / 1e3, len(body)


def generation(size: int, fmt: str, repeat: int = 5) -> dict[str, float]:
    px_t, enc_t, part_t, nbytes = [], [], [], 0
    for k in range(repeat):
        t0 = time.perf_counter()
        px = image_pixels(0, f"new-{fmt}-{size}-{k}", size, size)
        t1 = time.perf_counter()
        data = encode_image(px, fmt)
        t2 = time.perf_counter()
        content_part(data, fmt)
        t3 = time.perf_counter()
        px_t.append(t1 - t0)
        enc_t.append(t2 - t1)
        part_t.append(t3 - t2)
        nbytes = len(data)
    med = statistics.median
    return {
        "pixels_ms": med(px_t) * 1e3,
        "encode_ms": med(enc_t) * 1e3,
        "base64_part_ms": med(part_t) * 1e3,
        "total_ms": (med(px_t) + med(enc_t) + med(part_t)) * 1e3,
        "bytes": nbytes,
    }


def main() -> None:
    encode_image(np.zeros((8, 8, 3), np.uint8), "png")  # imports Pillow's codecs once
    for fmt in ("png", "jpeg"):
        p50, p99, size = build_with_cached_images(fmt)
        print(
            f"request with two cached 1024x1024 {fmt.upper()} images + 1,000-token text: "
            f"p50 {p50:.0f} us, p99 {p99:.0f} us (body {size / 1e6:.2f} MB)"
        )
    for fmt in ("png", "jpeg"):
        for size in (512, 1024, 2048):
            g = generation(size, fmt)
            print(
                f"new {size}x{size} {fmt.upper()}: pixels {g['pixels_ms']:.1f} ms + encode {g['encode_ms']:.1f} ms "
                f"+ base64 part {g['base64_part_ms']:.1f} ms = {g['total_ms']:.1f} ms ({g['bytes'] / 1e3:.0f} KB)"
            )


if __name__ == "__main__":
    main()
