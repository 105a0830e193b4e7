"""``PrefixIndex``: which blocks of a pool hold reusable KV, and under which keys.

A full block of verified tokens is found by its chained digest (``prefix_digest.py``). Every indexed
block is also listed under its parent's digest with its tokens, so that a request whose next tokens
only begin like a cached block can copy that block's first keys and values (a partial hit: a
conversation's next turn continues the previous turn's last, partly filled block). A partly filled
block is indexed only once its sequence has ended (its tokens no longer change).

The blocks under one parent are kept in a trie of their tokens: many conversations under one system
prompt leave thousands of blocks under the same parent, and finding the longest match is then a walk
of at most a block's tokens, not a scan of every sibling (4,000 requests of one prompt spent half
their time in that scan).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class _Entry:
    parent: bytes  # the digest of the block before it (or the root)
    tokens: tuple[int, ...]
    digest: bytes | None  # None: a partly filled block (found only through its parent)


class _TokenTrie:
    """A node: the blocks whose tokens begin with the path to it, and where each next token leads."""

    __slots__ = ("blocks", "next")

    def __init__(self) -> None:
        self.blocks: set[int] = set()
        self.next: dict[int, _TokenTrie] = {}


class PrefixIndex:
    def __init__(self) -> None:
        self._by_digest: dict[bytes, int] = {}
        self._entries: dict[int, _Entry] = {}
        self._children: dict[bytes, _TokenTrie] = {}  # by parent digest

    def __contains__(self, block: int) -> bool:
        return block in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, digest: bytes) -> int | None:
        """The full block with this digest."""
        return self._by_digest.get(digest)

    def digest_of(self, block: int) -> bytes | None:
        entry = self._entries.get(block)
        return None if entry is None else entry.digest

    def add_full(self, block: int, parent: bytes, digest: bytes, tokens: Sequence[int]) -> bool:
        """Index a full block; False (nothing changes) when its digest is indexed already (another
        sequence computed the same block at the same time) or the block is."""
        if digest in self._by_digest or block in self._entries:
            return False
        self._by_digest[digest] = block
        self._add(block, _Entry(parent, tuple(tokens), digest))
        return True

    def add_partial(self, block: int, parent: bytes, tokens: Sequence[int]) -> None:
        if block not in self._entries and tokens:
            self._add(block, _Entry(parent, tuple(tokens), None))

    def remove(self, block: int) -> None:
        entry = self._entries.pop(block, None)
        if entry is None:
            return
        if entry.digest is not None:
            del self._by_digest[entry.digest]
        root = node = self._children[entry.parent]
        node.blocks.discard(block)
        for token in entry.tokens:
            below = node.next[token]
            below.blocks.discard(block)
            if not below.blocks:  # nothing else passes through it, nor below it
                del node.next[token]
                break
            node = below
        if not root.blocks:
            del self._children[entry.parent]

    def longest_start(self, parent: bytes, tokens: Sequence[int]) -> tuple[int | None, int]:
        """The indexed block after ``parent`` whose tokens begin with the longest run of ``tokens``,
        and that run's length (0: none begins like them)."""
        node = self._children.get(parent)
        run = 0
        while node is not None and run < len(tokens):
            below = node.next.get(tokens[run])
            if below is None:
                break
            node, run = below, run + 1
        if run == 0 or node is None:
            return None, 0
        # any of them holds the run (the same tokens after the same parent: the same keys and values);
        # not min(): thousands of blocks may pass through one node
        return next(iter(node.blocks)), run

    def blocks(self) -> set[int]:
        return set(self._entries)

    def check(self) -> None:
        assert {e.digest: b for b, e in self._entries.items() if e.digest is not None} == self._by_digest
        assert {b for root in self._children.values() for b in root.blocks} == set(self._entries)
        for root in self._children.values():
            for block in root.blocks:  # every block is found along its own tokens
                node = root
                for token in self._entries[block].tokens:
                    node = node.next[token]
                    assert block in node.blocks

    def _add(self, block: int, entry: _Entry) -> None:
        self._entries[block] = entry
        node = self._children.setdefault(entry.parent, _TokenTrie())
        node.blocks.add(block)
        for token in entry.tokens:
            node = node.next.setdefault(token, _TokenTrie())
            node.blocks.add(block)
