"""Token ids -> hash ids, and image identities, under a secret key (no content is kept).

A prompt's token ids are cut into blocks of ``block_size``. Block k's digest is a keyed BLAKE2b
over the previous block's digest and the block's token ids (uint32 little-endian; a partial last
block also hashes its length and a marker, so it never equals a full block's digest). Chaining
makes a digest stand for the whole prefix up to its block: two prompts share their first k
digests exactly when they share their first k full blocks of tokens, which is what a prefix
cache sees. Each digest is then mapped to a compact integer in order of first appearance (0, 1,
2, ...), the hash ids of the canonical trace schema.

Why keyed: token ids of a known prompt (a system prompt, a template) could otherwise be hashed by
anyone and looked up in the trace. With a random 32-byte key kept apart from the trace, the ids
say which prompts share prefixes and nothing about what the prefixes are. The compact ids carry
no digest at all; the digest -> id table lives only in the proxy's memory (~150 bytes per
distinct block).
"""

from __future__ import annotations

import hashlib
import secrets

import numpy as np

KEY_BYTES = 32
_DIGEST = 16  # 128-bit digests: a collision needs ~2**64 blocks


class HashKeyError(ValueError):
    """A ``--hash-key-file`` that cannot be read or holds too short a key."""


def load_key(path: str | None) -> bytes:
    """The hashing key: the bytes of ``path`` (at least 16, at most 64 used; whitespace at the
    ends dropped, so a hex or base64 line in a file works), or a fresh random key when ``path`` is
    None (the capture's ids then cannot be matched with another capture's)."""
    if path is None:
        return secrets.token_bytes(KEY_BYTES)
    try:
        with open(path, "rb") as f:
            key = f.read().strip()
    except OSError as e:
        raise HashKeyError(f"--hash-key-file {path}: cannot read: {e.strerror or e}") from None
    if len(key) < 16:
        raise HashKeyError(f"--hash-key-file {path}: the key must be at least 16 bytes, got {len(key)}")
    return hashlib.blake2b(key, digest_size=KEY_BYTES).digest() if len(key) > 64 else key


def _token_bytes(tokens) -> tuple[bytes, int]:
    """Token ids as little-endian bytes and the width of one: uint32 (every tokenizer's ids fit),
    or uint64 for a prompt holding a negative or larger value (which no tokenizer gives)."""
    a = np.asarray(tokens, dtype=np.int64)
    if a.size and (int(a.min()) < 0 or int(a.max()) > 0xFFFFFFFF):
        return a.astype("<u8").tobytes(), 8
    return a.astype("<u4").tobytes(), 4


class BlockHasher:
    """Keyed chained block digests and their compact ids (see the module docstring).

    ``hash_ids(tokens)`` -> the row's hash ids; ``digests(tokens)`` -> the raw digests (for the
    work that is done off the event loop: mapping to ids must happen in one place, in order).
    Not thread-safe for ``ids_for``: call it from one thread."""

    def __init__(self, key: bytes, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self._key = key
        self._ids: dict[bytes, int] = {}

    @property
    def distinct_blocks(self) -> int:
        return len(self._ids)

    def digests(self, tokens) -> list[bytes]:
        """The chained keyed digest of each block of ``tokens`` (the last one partial or full)."""
        bs = self.block_size
        raw, w = _token_bytes(tokens)
        n = len(raw) // w
        out: list[bytes] = []
        prev = b""
        for start in range(0, n, bs):
            end = min(start + bs, n)
            h = hashlib.blake2b(prev, key=self._key, digest_size=_DIGEST)
            h.update(raw[w * start : w * end])
            if end - start < bs:  # a partial block: its length and a marker, so it is its own id
                h.update(b"partial" + (end - start).to_bytes(4, "little"))
            prev = h.digest()
            out.append(prev)
        return out

    def ids_for(self, digests: list[bytes]) -> list[int]:
        """Compact ids of ``digests``: each new digest gets the next integer."""
        ids = self._ids
        out = []
        for d in digests:
            i = ids.get(d)
            if i is None:
                i = ids[d] = len(ids)
            out.append(i)
        return out

    def fresh_id(self) -> int:
        """A compact id shared with nothing (a block past the tokens that were hashed)."""
        i = len(self._ids)
        self._ids[secrets.token_bytes(_DIGEST + 1)] = i  # (never a digest: another length)
        return i

    def hash_ids(self, tokens) -> list[int]:
        return self.ids_for(self.digests(tokens))


def content_hash(key: bytes, data: bytes | str) -> str:
    """A keyed 64-bit identity of some content (an image's data or URL), as 16 hex digits: equal
    images get equal hashes within one capture (same key), and the bytes are not kept."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, key=key, digest_size=8, person=b"image").hexdigest()
