"""The keys of the prefix cache: a full block of KV is known by a chained digest.

A block's digest is SHA-256 of its parent's digest and its token ids; the first block's parent is
the root, SHA-256 of the pool's namespace (what else decides the KV: the model, its dtype and
weights) and the request's cache salt. So two blocks share a digest only when the whole prefix up
to their end, the salt and the pool agree: a block's KV depends on every token before it, and a
request with another salt never finds another tenant's blocks (vLLM's ``cache_salt``, TensorRT-LLM's
``cache_salt_id`` mix it in at the root the same way).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence


def root_digest(namespace: bytes, cache_salt: str) -> bytes:
    """The parent of a sequence's first block: the pool and the salt (the empty salt is a salt too)."""
    salt = cache_salt.encode("utf-8")
    fields = (namespace, salt)
    return hashlib.sha256(b"".join(len(f).to_bytes(4, "little") + f for f in fields)).digest()


def block_digest(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The digest of one full block of ``tokens`` after the prefix whose last block is ``parent``."""
    return hashlib.sha256(parent + array("q", tokens).tobytes()).digest()


def chain(parent: bytes, token_ids: Sequence[int], block_size: int, first: int, count: int) -> list[bytes]:
    """The digests of blocks ``first .. first + count - 1`` of ``token_ids``, ``parent`` being the
    digest of block ``first - 1`` (or the root)."""
    out = []
    for b in range(first, first + count):
        parent = block_digest(parent, token_ids[b * block_size : (b + 1) * block_size])
        out.append(parent)
    return out
