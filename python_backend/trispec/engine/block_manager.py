"""``BlockManager``: the books of one paged KV pool, with a prefix cache. Pure bookkeeping, no tensors.

A sequence owns a block table (its blocks in order) and takes blocks only as its tokens arrive. Every
block is in exactly one state: free (empty), in use (held by one or more sequences: a reference
count), or cached (held by none, but its KV is indexed for reuse); free + cached + in use == the pool.

The prefix cache: once the runner says a sequence's first n tokens are verified (``seal``), each full
block among them is indexed by its chained digest (``prefix_digest.py``), and when the sequence ends
its last, partly filled block is kept too. A new sequence (or one catching up) takes the longest run
of indexed full blocks that continue its own (``match``), then copies the first keys and values of
the cached block whose tokens begin like its next ones (a partial hit: ``Match.copy``), all up to
its last token at most (whose logits it needs, so at least that token is computed). Full blocks are
shared read-only: a sequence writes only at positions past its length, and a shared block is always
full and before that length. Only verified tokens are sealed, so no cached block ever holds a draft's
KV, and a rollback (``truncate`` to a verified length) never cuts into a shared one. A block whose
last user lets go stays cached and is evicted least-recently-used, only when a block is needed and
none is free; a sequence's blocks are let go tail first, so its tail goes before the prefix others share.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trispec.engine.prefix_digest import chain, root_digest
from trispec.engine.prefix_index import PrefixIndex
from trispec.errors import CapacityError, ConfigError
from trispec.step import PrefixCacheReset


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Number of blocks needed to hold ``num_tokens`` tokens."""
    return -(-num_tokens // block_size)


@dataclass
class ContextBlocks:
    """What a sequence's context (its tokens at its first lookup) took from the pool, counted as
    TensorRT-LLM counts a request's ``kv_cache_metrics`` (kvCacheManager.cpp ``loadOrAllocateBlocks``:
    a matched block, full or partly, is reused; an unmatched one missed and taken by ``getFreeBlock``,
    which counts it new when it never held KV)."""

    blocks: int
    reused: int = 0
    reused_tokens: int = 0  # the tokens those blocks held for it (a partly reused one: the part)
    new: int = 0  # taken from the empty blocks
    recycled: int = 0  # taken by evicting a cached block

    @property
    def missed(self) -> int:
        return self.blocks - self.reused

    @property
    def taken(self) -> int:
        """Blocks taken from the pool for it so far (all of the missed ones once it is computed)."""
        return self.new + self.recycled


@dataclass
class _SeqBlocks:
    max_length: int  # the most tokens this sequence may ever hold (a cap, not a reservation)
    root: bytes  # the parent digest of its first block (pool and cache salt)
    length: int = 0
    table: list[int] = field(default_factory=list)
    # the digests of its leading full blocks whose tokens are verified (sealed or matched)
    digests: list[bytes] = field(default_factory=list)
    # the verified tokens in the block after those (kept for reuse when the sequence ends)
    tail: tuple[int, ...] = ()
    context: ContextBlocks | None = None

    @property
    def parent(self) -> bytes:
        return self.digests[-1] if self.digests else self.root


@dataclass(frozen=True)
class Match:
    """What ``match`` gave a sequence: its length now, and the keys and values the caller must copy
    (``copy_tokens`` slots from the start of block ``copy_from`` into block ``copy_to``)."""

    length: int
    copy_from: int = -1
    copy_to: int = -1
    copy_tokens: int = 0


@dataclass
class PrefixCounters:
    """Cumulative prefix-cache figures of one pool."""

    queried_tokens: int = 0  # tokens sequences lacked when they looked the cache up
    hit_tokens: int = 0  # of those, found cached
    evicted_blocks: int = 0  # cached blocks given to new tokens


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int, *, prefix_caching: bool = True, namespace: bytes = b""
    ) -> None:
        if num_blocks < 1:
            raise ConfigError("num_blocks", f"must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ConfigError("block_size", f"must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.namespace = namespace
        # A stack: the most recently freed block is reused first (it is likely still in cache).
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._refs = [0] * num_blocks
        self._cached: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self._index = PrefixIndex()
        self._seqs: dict[int, _SeqBlocks] = {}
        self.counters = PrefixCounters()

    # -- queries -------------------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        """Blocks new tokens may take: the empty ones and the cached ones (evicted on demand)."""
        return len(self._free) + len(self._cached)

    @property
    def empty_blocks(self) -> int:
        return len(self._free)

    @property
    def cached_blocks(self) -> int:
        """Blocks no sequence holds whose KV is kept for reuse."""
        return len(self._cached)

    @property
    def used_blocks(self) -> int:
        """Blocks held by at least one sequence."""
        return self.num_blocks - self.free_blocks

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def seq_ids(self) -> list[int]:
        return list(self._seqs)

    def length(self, seq_id: int) -> int:
        return self._get(seq_id).length

    def max_length(self, seq_id: int) -> int:
        return self._get(seq_id).max_length

    def block_table(self, seq_id: int) -> list[int]:
        return self._get(seq_id).table

    def context_blocks(self, seq_id: int) -> ContextBlocks | None:
        """What the sequence's context took from the pool (None: it never looked the cache up)."""
        return self._get(seq_id).context

    def blocks_to_grow(self, seq_id: int, length: int) -> int:
        """Blocks a sequence must still take to hold ``length`` tokens (all of them for one not
        registered yet)."""
        seq = self._seqs.get(seq_id)
        return max(blocks_for(length, self.block_size) - (len(seq.table) if seq else 0), 0)

    def room_for(self, lengths: Mapping[int, int]) -> bool:
        """Whether every sequence can grow to its length at once (within its own cap)."""
        for seq_id, length in lengths.items():
            seq = self._seqs.get(seq_id)
            if seq is not None and length > seq.max_length:
                return False
        return sum(self.blocks_to_grow(s, n) for s, n in lengths.items()) <= self.free_blocks

    def probe(self, token_ids: Sequence[int], cache_salt: str = "") -> tuple[int, int]:
        """What ``match`` would give a new sequence of these tokens in full blocks, changing nothing:
        (blocks found, how many of them no sequence holds now, i.e. would leave the free count)."""
        found = self._lookup(root_digest(self.namespace, cache_salt), token_ids, 0)
        return len(found), sum(1 for _, block in found if self._refs[block] == 0)

    # -- mutations -----------------------------------------------------------------------------
    def add(self, seq_id: int, max_length: int, cache_salt: str = "") -> None:
        """Register a sequence; it takes no block until tokens arrive."""
        if seq_id in self._seqs:
            raise ValueError(f"seq_id {seq_id} is already registered")
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        self._seqs[seq_id] = _SeqBlocks(max_length, root_digest(self.namespace, cache_salt))

    def match(self, seq_id: int, token_ids: Sequence[int]) -> Match:
        """Extend the sequence (its tokens ``token_ids``) with what the cache holds of it, leaving at
        least its last token to compute. Only a sequence whose blocks are all full and verified (a
        fresh one, one at a sealed block boundary) can take more."""
        seq = self._get(seq_id)
        bs = self.block_size
        first = seq.context is None
        if first:
            seq.context = ContextBlocks(blocks_for(len(token_ids), bs))
        limit = len(token_ids) - 1
        # (a draft cache one token behind, as after most rounds, has nothing worth looking up)
        if not self.prefix_caching or seq.length != len(seq.digests) * bs or limit - seq.length < 2:
            return Match(seq.length)
        before = seq.length
        for digest, block in self._lookup(seq.parent, token_ids, len(seq.table)):
            if self._refs[block] == 0:
                del self._cached[block]
            self._refs[block] += 1
            seq.table.append(block)
            seq.digests.append(digest)
        seq.length = len(seq.table) * bs
        match = self._partial(seq, token_ids[seq.length : min(seq.length + bs, limit)])
        self.counters.queried_tokens += len(token_ids) - before
        self.counters.hit_tokens += match.length - before
        if first:
            seq.context.reused = len(seq.table)  # type: ignore[union-attr]
            seq.context.reused_tokens = match.length  # type: ignore[union-attr]
        return match

    def seal(self, seq_id: int, token_ids: Sequence[int]) -> None:
        """The sequence's first ``len(token_ids)`` tokens are verified and are these: index every full
        block among them (one whose digest is indexed already, computed by another sequence at the
        same time, stays private) and remember the verified tokens of the block after them. Fewer
        tokens than it already holds verified (a draft pool matched further than the target's
        progress it is sealed with) change nothing: what it matched stays verified."""
        seq = self._get(seq_id)
        if not self.prefix_caching:
            return
        bs = self.block_size
        verified = min(len(token_ids), seq.length)
        full = verified // bs
        if full > len(seq.digests):
            parent = seq.parent
            for digest in chain(parent, token_ids, bs, len(seq.digests), full - len(seq.digests)):
                b = len(seq.digests)
                self._index.add_full(seq.table[b], parent, digest, token_ids[b * bs : (b + 1) * bs])
                seq.digests.append(digest)
                parent = digest
            seq.tail = ()
        # the tail is always the start of the block after the indexed ones (``free`` keys it there)
        start = len(seq.digests) * bs
        if verified - start > len(seq.tail):
            seq.tail = tuple(token_ids[start:verified])

    def append(self, seq_id: int, num_tokens: int) -> None:
        """Grow the sequence by ``num_tokens``, taking blocks as needed (free ones first, then the
        least recently used cached ones)."""
        seq = self._get(seq_id)
        new_length = seq.length + num_tokens
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        if new_length > seq.max_length:
            raise ValueError(f"seq {seq_id}: {new_length} tokens exceed its cap of {seq.max_length}")
        need = blocks_for(new_length, self.block_size) - len(seq.table)
        if need > self.free_blocks:
            raise CapacityError(
                f"sequence {seq_id} needs {need} more KV blocks for {new_length} tokens, "
                f"{self.free_blocks} of {self.num_blocks} are free"
            )
        for _ in range(need):
            self._grow(seq)
        seq.length = new_length

    def truncate(self, seq_id: int, length: int) -> None:
        """Keep the first ``length`` tokens; whole blocks past them are let go. Cutting into a full
        verified block makes it writable again, which only its sole holder may do."""
        seq = self._get(seq_id)
        if not 0 <= length <= seq.length:
            raise ValueError(f"seq {seq_id}: cannot truncate to {length} (length is {seq.length})")
        bs = self.block_size
        keep = blocks_for(length, bs)
        if length % bs and len(seq.digests) >= keep:
            block = seq.table[keep - 1]  # the last block kept, partly: its tail will be rewritten
            if self._refs[block] > 1:
                raise ValueError(f"seq {seq_id}: truncating to {length} would write into a shared block")
            self._index.remove(block)
        if len(seq.digests) > length // bs or length < len(seq.digests) * bs + len(seq.tail):
            seq.tail = ()
        del seq.digests[length // bs :]
        released = seq.table[keep:]
        del seq.table[keep:]
        for block in reversed(released):
            self._release(block)
        seq.length = length

    def free(self, seq_id: int) -> None:
        """Forget the sequence; its verified, partly filled last block is kept for reuse."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            raise ValueError(f"unknown seq_id {seq_id}")
        if seq.tail and len(seq.table) > len(seq.digests):
            tail_block = seq.table[len(seq.digests)]
            if self._refs[tail_block] == 1:
                self._index.add_partial(tail_block, seq.parent, seq.tail)
        for block in reversed(seq.table):
            self._release(block)

    def drop_cached(self) -> None:
        """Forget every cached block no sequence holds (they become empty): a cold cache."""
        for block in self._cached:
            self._index.remove(block)
            self._free.append(block)
        self._cached.clear()

    def check(self) -> None:
        """Raise ``AssertionError`` unless the books balance (tests and debugging)."""
        refs = [0] * self.num_blocks
        for seq in self._seqs.values():
            assert len(seq.table) == blocks_for(seq.length, self.block_size)
            assert len(seq.digests) <= seq.length // self.block_size
            assert len(seq.digests) * self.block_size + len(seq.tail) <= seq.length
            for block in seq.table:
                refs[block] += 1
        assert refs == self._refs, "reference counts differ from the block tables"
        free, cached = set(self._free), set(self._cached)
        used = {b for b in range(self.num_blocks) if refs[b]}
        assert len(free) == len(self._free) and not (free & cached) and not (free | cached) & used
        assert len(free) + len(cached) + len(used) == self.num_blocks
        indexed = self._index.blocks()
        assert cached <= indexed and not free & indexed
        self._index.check()

    # -- internals -----------------------------------------------------------------------------
    def _lookup(self, parent: bytes, token_ids: Sequence[int], first: int) -> list[tuple[bytes, int]]:
        """The indexed full blocks continuing a prefix from block ``first`` (parent: the digest before
        it), at most up to all but the last token."""
        if not self.prefix_caching:
            return []
        found = []
        for b in range(first, (len(token_ids) - 1) // self.block_size):
            (parent,) = chain(parent, token_ids, self.block_size, b, 1)
            block = self._index.find(parent)
            if block is None:
                break
            found.append((parent, block))
        return found

    def _partial(self, seq: _SeqBlocks, next_tokens: Sequence[int]) -> Match:
        """A fresh block for the sequence holding the first keys and values of the cached block that
        begins like ``next_tokens`` (copied by the caller), if any does."""
        source, run = self._index.longest_start(seq.parent, next_tokens) if next_tokens else (None, 0)
        if source is None or self.free_blocks - (self._refs[source] == 0) < 1:
            return Match(seq.length)  # none begins alike, or no block to copy into
        # held while a block is taken, so that taking one cannot evict the source
        if self._refs[source] == 0:
            del self._cached[source]
        self._refs[source] += 1
        target = self._grow(seq)
        self._release(source)
        seq.length += run
        return Match(seq.length, source, target, run)

    def _grow(self, seq: _SeqBlocks) -> int:
        recycled = not self._free
        block = self._take()
        seq.table.append(block)
        context = seq.context
        if context is not None and len(seq.table) <= context.blocks:
            if recycled:
                context.recycled += 1
            else:
                context.new += 1
        return block

    def _take(self) -> int:
        if self._free:
            block = self._free.pop()
        else:
            block, _ = self._cached.popitem(last=False)
            self._index.remove(block)
            self.counters.evicted_blocks += 1
        self._refs[block] = 1
        return block

    def _release(self, block: int) -> None:
        self._refs[block] -= 1
        if self._refs[block]:
            return
        if block in self._index:
            self._cached[block] = None  # the most recently used end
        else:
            self._free.append(block)

    def _get(self, seq_id: int) -> _SeqBlocks:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise ValueError(f"unknown seq_id {seq_id}")
        return seq

    # -- an operator's reset (specdec's reset_prefix_cache) ------------------------------------------
    def reset_prefix_cache(self) -> PrefixCacheReset:
        """Empty the prefix cache: every cached block no sequence holds becomes empty, and the blocks
        running sequences hold leave the index (each stays its holder's, its keys and values
        untouched; let go, it becomes empty). A sequence admitted after this finds nothing cached
        before it. The running ones go on indexing the blocks they fill from now on (their
        digests are kept, so they never index again what they held), and the counters stay totals."""
        emptied = len(self._cached)
        self.drop_cached()
        held = self._index.blocks()  # what is left indexed is in use
        for block in held:
            self._index.remove(block)
        return PrefixCacheReset(emptied, len(held))
