"""KV block reuse as TensorRT-LLM's executor does it, for the stand-in (tests only, never shipped; it
imports nothing of ours). TRT = NVIDIA/TensorRT-LLM, cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp
unless said otherwise; a function name to grep there on every behaviour:

* blocks of reusable KV form a radix tree: a block is a child of the block before it, keyed by its
  tokens (``KVCacheBlock::addNextBlock``); the root's children are keyed by the cache salt id too (the
  salt is mixed into the root: TRT-LLM PR #13793; ``LlmRequest::getCacheSaltID``);
* a new request (``WindowBlockManager::addSequence``, block reuse on) keys the blocks of its first
  ``inputLength - 1`` tokens ("Ignore last token because it can't be recovered"), the last one partial,
  plus an empty key when ``inputLength % tokensPerBlock == 1``; its context takes
  ``ceil(inputLength / tokensPerBlock)`` blocks (``loadOrAllocateBlocks``): walking down the tree, a
  key that matches a child exactly reuses it, else the child sharing the longest run of leading tokens
  is reused partially (``findMatchingBlock`` with ``enable_partial_reuse`` and ``copy_on_partial_reuse``,
  both on by default: a partly matched block that others hold or that has children is copied into a
  fresh block, which ``getFreeBlock`` takes); after a partial match or a miss nothing more is matched.
  Each reused block counts in ``mReusedBlocks``, each block not matched takes a free block
  (``getFreeBlock``) and counts in ``mMissedBlocks``;
* ``getFreeBlock`` counts every block it hands out in ``mAllocTotalBlocks`` and, if that block never
  held tokens, in ``mAllocNewBlocks``; a block that held reusable KV leaves the tree with everything
  below it (``freeChildren``);
* per request (``KVCacheManager::addSequence``): the four counts' increase while its context was
  placed, as ``RequestPerfMetrics.kv_cache_metrics`` (num_total_allocated_blocks,
  num_new_allocated_blocks, num_reused_blocks, num_missed_blocks); the hit rate is reused / (reused +
  missed), 0 when nothing was reused (llmRequest.h ``getKVCacheHitRatePerRequest``);
* when a request ends its blocks are stored for reuse (``storeBlocksForReuse``): the blocks of its
  tokens, prompt and generated, but the last ("Only (length - 1) tokens of the sequence have their
  kv-state recorded"), the last one partial; a key already in the tree keeps the block it has
  (``storeBlocks``); blocks nobody holds go back to the free queue, the oldest reused first.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class _Block:
    block_id: int
    tokens: tuple[int, ...] | None = None  # None: never held KV
    refs: int = 0
    parent: _Block | None = None
    children: dict[object, _Block] = field(default_factory=dict)


@dataclass
class KvCacheMetrics:
    """``tensorrt_llm.bindings.executor.KvCacheMetrics`` (pybind/executor/request.cpp)."""

    num_total_allocated_blocks: int = 0
    num_new_allocated_blocks: int = 0
    num_reused_blocks: int = 0
    num_missed_blocks: int = 0
    kv_cache_hit_rate: float = 0.0


def _chop(tokens: list[int], usable: int, per_block: int) -> list[tuple[int, ...]]:
    """``chopVectorIntoBlocks(vec, usableSize, elementsPerBlock, allowPartial=true)``."""
    return [tuple(tokens[i : min(i + per_block, usable)]) for i in range(0, usable, per_block)]


class ReuseTree:
    def __init__(self, num_blocks: int, tokens_per_block: int) -> None:
        self.tokens_per_block = tokens_per_block
        # the free queue: blocks never used come first (made when taken: a GPU holds millions), then
        # those let go, in that order; getFreeBlock takes from the front
        self.never_used = num_blocks
        self.free: deque[_Block] = deque()
        self.root = _Block(-1)
        self.counts = KvCacheMetrics()

    def add_sequence(self, tokens: list[int], salt_id: int | None) -> tuple[list[_Block], KvCacheMetrics]:
        """Place a new request's context; its blocks and its kv_cache_metrics."""
        per_block, length = self.tokens_per_block, len(tokens)
        keys = _chop(tokens, length - 1, per_block)
        if length % per_block == 1:
            keys.append(())
        before = KvCacheMetrics(**vars(self.counts))
        held: list[_Block] = []
        node: _Block | None = self.root
        for bi in range(-(-length // per_block)):
            key = keys[bi] if bi < len(keys) else ()
            match, partial = (
                self._find(node, key, salt_id, top=bi == 0) if node is not None else (None, False)
            )
            if match is None:
                block = self._get_free_block()
                self.counts.num_missed_blocks += 1
                node = None
            else:
                block = match
                if partial and (match.refs or match.children):
                    block = self._get_free_block()  # copied: the original stays where it is
                elif match in self.free:
                    self.free.remove(match)
                node = None if partial else match
                self.counts.num_reused_blocks += 1
            block.refs += 1
            held.append(block)
        now = self.counts
        metrics = KvCacheMetrics(
            num_total_allocated_blocks=now.num_total_allocated_blocks - before.num_total_allocated_blocks,
            num_new_allocated_blocks=now.num_new_allocated_blocks - before.num_new_allocated_blocks,
            num_reused_blocks=now.num_reused_blocks - before.num_reused_blocks,
            num_missed_blocks=now.num_missed_blocks - before.num_missed_blocks,
        )
        reused, missed = metrics.num_reused_blocks, metrics.num_missed_blocks
        metrics.kv_cache_hit_rate = reused / (reused + missed) if reused else 0.0
        return held, metrics

    def release(self, held: list[_Block], tokens: list[int], salt_id: int | None) -> None:
        """The request ended with ``tokens`` (prompt and generated): store, then let its blocks go."""
        keys = _chop(tokens, len(tokens) - 1, self.tokens_per_block)
        parent = self.root
        for i, (key, block) in enumerate(zip(keys, held)):
            tree_key = (salt_id, key) if i == 0 else key
            existing = parent.children.get(tree_key)
            if existing is None:
                if block.parent is None and block is not parent:
                    block.tokens, block.parent = key, parent
                    parent.children[tree_key] = block
                    existing = block
                else:
                    break
            if len(key) < self.tokens_per_block:
                break
            parent = existing
        for block in held:
            block.refs -= 1
            if block.refs == 0 and block not in self.free:
                self.free.append(block)

    def _find(
        self, node: _Block, key: tuple[int, ...], salt_id: int | None, top: bool
    ) -> tuple[_Block | None, bool]:
        """``findMatchingBlock``: an exact child (partial when the block is not full), else the child
        sharing the longest run of leading tokens."""
        if not key or not node.children:
            return None, False
        exact = node.children.get((salt_id, key) if top else key)
        if exact is not None:
            return exact, len(exact.tokens or ()) < self.tokens_per_block
        best, best_len = None, 0
        for tree_key, child in node.children.items():
            if top and tree_key[0] != salt_id:
                continue
            shared = 0
            for a, b in zip(child.tokens or (), key):
                if a != b:
                    break
                shared += 1
            if shared > best_len:
                best, best_len = child, shared
        return best, best is not None

    def _get_free_block(self) -> _Block:
        if self.never_used:
            self.never_used -= 1
            block = _Block(self.never_used)
        else:
            block = self.free.popleft()
        self.counts.num_total_allocated_blocks += 1
        if block.tokens is None:
            self.counts.num_new_allocated_blocks += 1
        if block.parent is not None:  # held reusable KV: it and its subtree leave the tree
            self._detach(block)
        block.tokens = ()  # it holds this request's KV from now on
        return block

    def _detach(self, block: _Block) -> None:
        parent = block.parent
        if parent is not None:
            for key, child in list(parent.children.items()):
                if child is block:
                    del parent.children[key]
        block.parent = None
        for child in list(block.children.values()):
            self._detach(child)
        block.children.clear()
