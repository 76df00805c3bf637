"""Image columns of a trace: ``image_ids``, ``image_sizes``, ``num_images``, ``image_tokens``.

One value per row, checked here (the reader names file, row and field of every problem), and the
row rules between them (``check_image_rows``): a row's ``image_sizes`` has one size per image
(``len(image_ids)``, else ``num_images``); ``num_images`` equals ``len(image_ids)`` when both are
given. Ids are strings (integers are accepted and turned into strings): equal ids are the same
image. Sizes are ``"WxH"`` strings (or ``[W, H]`` pairs), each side in ``[1, MAX_SIDE]``.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import orjson

#: Largest image side accepted (pixels): bounds the memory one image takes to build (3 bytes a pixel).
MAX_SIDE = 8192
#: Most images one row may carry.
MAX_IMAGES = 64
#: Image columns (canonical names); their Arrow types are in ``model._OPTIONAL_TYPES``.
IMAGE_COLUMNS = ("image_ids", "image_sizes", "num_images", "image_tokens")
_SIZE = re.compile(r"^\s*(\d{1,6})\s*[xX]\s*(\d{1,6})\s*$")


def parse_image_size(v: Any) -> tuple[tuple[int, int] | None, str | None]:
    """``"WxH"`` (or ``[W, H]``) -> ((W, H), None), or (None, why not)."""
    if isinstance(v, str):
        m = _SIZE.match(v)
        if not m:
            return None, f"image size {v[:40]!r} is not WxH (e.g. 1024x768)"
        w, h = int(m.group(1)), int(m.group(2))
    elif (
        isinstance(v, (list, tuple, np.ndarray))
        and len(v) == 2
        and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v)
    ):
        w, h = int(v[0]), int(v[1])
    else:
        return None, f"image size {str(v)[:40]!r} is not WxH (e.g. 1024x768) nor a [W, H] pair"
    if not (1 <= w <= MAX_SIDE and 1 <= h <= MAX_SIDE):
        return None, f"image size {w}x{h} out of bounds: each side must be in 1..{MAX_SIDE} pixels"
    return (w, h), None


def _as_list(v: Any) -> tuple[list | None, str | None]:
    if isinstance(v, str):  # CSV cells (and JSONL strings) hold a JSON list
        try:
            v = orjson.loads(v)
        except orjson.JSONDecodeError:
            return None, f"expected a list, got string {v[:40]!r}"
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if not isinstance(v, (list, tuple)):
        return None, f"expected a list, got {type(v).__name__}"
    if len(v) > MAX_IMAGES:
        return None, f"{len(v)} images: at most {MAX_IMAGES} per row"
    return list(v), None


def image_value(name: str, v: Any) -> tuple[Any, str | None]:
    """One cell of image column ``name`` -> (value, None) or (None, error).

    ``image_ids`` -> list[str]; ``image_sizes`` -> list["WxH"] (normalised); ``num_images`` and
    ``image_tokens`` -> int >= 0 (``num_images`` at most ``MAX_IMAGES``)."""
    if name in ("num_images", "image_tokens"):
        if isinstance(v, float) and v != v:
            return None, None
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float, np.integer, np.floating))
            or (isinstance(v, (float, np.floating)) and not float(v).is_integer())
        ):
            return None, f"expected a whole number, got {v!r}"[:120]
        iv = int(v)
        if iv < 0:
            return None, f"{name} {iv} is not allowed: must be >= 0"
        if name == "num_images" and iv > MAX_IMAGES:
            return None, f"num_images {iv}: at most {MAX_IMAGES} per row"
        return iv, None
    lst, err = _as_list(v)
    if err is not None:
        return None, err
    assert lst is not None
    if name == "image_ids":
        out = []
        for j, x in enumerate(lst):
            if isinstance(x, str) and x:
                out.append(x)
            elif isinstance(x, (int, np.integer)) and not isinstance(x, bool):
                out.append(str(int(x)))
            else:
                return None, f"image_ids[{j}]: expected a non-empty string or an integer, got {x!r}"[:120]
        return out, None
    sizes = []
    for j, x in enumerate(lst):
        wh, err = parse_image_size(x)
        if err is not None:
            return None, f"image_sizes[{j}]: {err}"
        assert wh is not None
        sizes.append(f"{wh[0]}x{wh[1]}")
    return sizes, None


def check_image_rows(rows: np.ndarray, optional: dict[str, Any], probs) -> None:
    """Row rules: ``num_images`` agrees with ``image_ids``; ``image_sizes`` has one size per image."""
    ids, sizes, num = (optional.get(k) for k in ("image_ids", "image_sizes", "num_images"))
    if sizes is None and (ids is None or num is None):
        return
    bad = {(p.row, p.field) for p in probs.items if p.field in IMAGE_COLUMNS}
    for i in range(len(rows)):
        r = int(rows[i])
        n_ids = len(ids[i]) if ids is not None and ids[i] is not None else None
        n = num[i] if num is not None else None
        if n_ids is not None and n is not None and n != n_ids and (r, "num_images") not in bad:
            probs.add(r, "num_images", f"num_images {n} != {n_ids} image_ids: they must agree")
        count = n_ids if n_ids is not None else n
        s = sizes[i] if sizes is not None else None
        if s is not None and count is not None and len(s) != count and (r, "image_sizes") not in bad:
            probs.add(r, "image_sizes", f"{len(s)} image_sizes for {count} images: give one size per image")
        elif s is not None and s and count is None:
            probs.add(r, "image_sizes", "image_sizes without image_ids or num_images: which images are they?")
