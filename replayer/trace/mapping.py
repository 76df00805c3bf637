"""Reading options: the column mapping (:func:`parse_mapping`), resolved options (``_Opts``),
source column names (``_src``) and synthesised hash ids for sources without prefix information.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replayer.trace.model import _OPTIONAL, _REQUIRED, SYNTH_ID_BASE

# --------------------------------------------------------------------------------------------
# Reading options and column mapping


_ALL_FIELDS = (*_REQUIRED, *_OPTIONAL)
_AZURE_MAP = {
    "timestamp": "TIMESTAMP",
    "input_length": "ContextTokens",
    "output_length": "GeneratedTokens",
    "hash_ids": "",
    "num_images": "NumImages",
}


def parse_mapping(text: str | dict[str, str] | None) -> dict[str, str]:
    """``"timestamp=ts,input_length=prompt_len"`` -> ``{"timestamp": "ts", ...}`` (canonical -> source).

    Keys must be canonical field names (``timestamp``, ``input_length``, ``output_length``,
    ``hash_ids``, ``request_id``, ``session_id``, ``model``, ``priority``, ``extra_body``,
    ``turn``, ``parent_request_id``, ``think_time_s``, ``endpoint``, ``query_length``,
    ``document_lengths``, ``image_ids``, ``image_sizes``, ``num_images``, ``image_tokens``); an empty value for ``hash_ids`` (``hash_ids=``) means "no prefix
    information: synthesise unique ids".
    Raises ValueError naming the bad entry.
    """
    if text is None:
        return {}
    items = (
        text.items()
        if isinstance(text, dict)
        else (part.split("=", 1) if "=" in part else (part, None) for part in text.split(",") if part.strip())
    )
    out: dict[str, str] = {}
    for k, v in items:
        k = k.strip()
        if v is None:
            raise ValueError(f"--map entry {k!r}: expected FIELD=COLUMN")
        if k not in _ALL_FIELDS:
            raise ValueError(f"--map entry {k!r}: not a trace field (one of {', '.join(_ALL_FIELDS)})")
        v = v.strip()
        if not v and k != "hash_ids":
            raise ValueError(f"--map entry {k!r}: empty column name (only hash_ids may be empty)")
        out[k] = v
    return out


@dataclass(frozen=True)
class _Opts:
    fmt: str  # resolved format, one of FORMATS
    block_size: int | None
    strict: bool
    mapping: dict[str, str]
    time_unit: str | None  # None: the format's default (Parquet: metadata)
    allow_float_time: bool


def _src(opts: _Opts, name: str) -> str:
    """Source column/key of canonical field ``name`` ('' = absent by request)."""
    return opts.mapping.get(name, name)


def map_hint(name: str, present: list[str]) -> str:
    """How to name the source of a missing required field ``name``: ``--map`` with the closest of
    the ``present`` columns (or keys), and for ``hash_ids`` the synthesised ids."""
    import difflib

    if name == "hash_ids":
        return "; without prefix information, --map hash_ids= synthesises unique ids (no prefix sharing)"
    taken = set(_REQUIRED)
    close = difflib.get_close_matches(name, [c for c in present if c not in taken], n=1, cutoff=0.5)
    return f"; name its column with --map {name}={close[0] if close else 'COLUMN'}"


def _synth_hash(il: np.ndarray, il_ok: np.ndarray, bs: int, start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unique ids for rows without prefix information: block k of the file -> SYNTH_ID_BASE + start + k."""
    lengths = np.where(il_ok, (il + (bs - 1)) // bs, 0).astype(np.int64)
    vals = SYNTH_ID_BASE + start + np.arange(int(lengths.sum()), dtype=np.int64)
    return lengths, vals, il_ok.copy()
