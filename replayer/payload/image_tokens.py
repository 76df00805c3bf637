"""Expected image tokens per image: the rules servers use to turn an image into prompt tokens.

A rule maps an image's width and height (pixels) to the tokens one image adds to the prompt.
The replayer uses it for its expectation (``expected_image_tokens``, compared with the server's
``usage.prompt_tokens_details.image_tokens``), and the embedded simulator to count the tokens of
the images it decodes, so both sides share one definition:

* ``qwen2-vl``: Qwen2-VL's image processor (``smart_resize``): the image is resized so each side
  is a multiple of 28 (14-pixel patches merged 2x2) and its area lies within the released model's
  ``min_pixels`` 3,136 and ``max_pixels`` 12,845,056 (``preprocessor_config.json``); tokens =
  (H' / 28) * (W' / 28). A 1024x1024 image gives 37 * 37 = 1,369.
* ``llava``: LLaVA-1.5 (CLIP ViT-L/14 at 336 px): 576 tokens whatever the size.
* ``fixed:N``: N tokens per image.
* ``none``: no expectation (``expected_image_tokens`` stays unknown).
"""

from __future__ import annotations

import math
from collections.abc import Callable

QWEN2_VL_FACTOR = 28
QWEN2_VL_MIN_PIXELS = 56 * 56
QWEN2_VL_MAX_PIXELS = 12_845_056
LLAVA_TOKENS = 576
RULES = ("qwen2-vl", "llava", "fixed:N", "none")


def qwen2_vl_tokens(
    width: int,
    height: int,
    *,
    factor: int = QWEN2_VL_FACTOR,
    min_pixels: int = QWEN2_VL_MIN_PIXELS,
    max_pixels: int = QWEN2_VL_MAX_PIXELS,
) -> int:
    """Image tokens of a ``width`` x ``height`` image in Qwen2-VL (its ``smart_resize``, then one
    token per 28x28 area)."""
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return (h_bar // factor) * (w_bar // factor)


def parse_rule(text: str) -> Callable[[int, int], int] | None:
    """``--image-token-rule`` -> a function (width, height) -> tokens, or None for ``none``.
    Raises ValueError naming the accepted rules."""
    t = text.strip().lower()
    if t == "qwen2-vl":
        return qwen2_vl_tokens
    if t == "llava":
        return lambda w, h: LLAVA_TOKENS
    if t == "none":
        return None
    if t.startswith("fixed:"):
        try:
            n = int(t[6:])
        except ValueError:
            n = -1
        if n >= 0:
            return lambda w, h: n
    raise ValueError(f"unknown image token rule {text!r}: expected one of {', '.join(RULES)} (N >= 0)")
