"""What a request's prompt found in the prefix cache (``cached_tokens``, TensorRT-LLM's per-request
``kv_cache_metrics``) counts only what other requests computed (issue 54, item 4): a sequence
preempted in the middle of its prefill gives its blocks back and, re-admitted, finds the blocks it
computed itself in the cache; those were never cache hits of its prompt."""

from __future__ import annotations

import random

from tiny import tiny_engine
from trispec.runners.torch_runner import TorchSpecRunner
from trispec.sampling_params import SamplingParams
from trispec.step import KVCacheMetrics, SeqStep, StepPlan

_rng = random.Random(4)
PROMPT = [_rng.randrange(256) for _ in range(40)]  # 5 blocks of 8
SAMPLING = SamplingParams()


def prefill_and_decode(runner: TorchSpecRunner, computed: int, chunks: list[int]) -> None:
    """Feed sequence 0's prompt from ``computed`` on in ``chunks`` (the last: the rest and a decode)."""
    for feed_to in chunks:
        result = runner.run(StepPlan([SeqStep(0, PROMPT, computed, feed_to, 0, SAMPLING)]))
        computed = result.results[0].num_computed
        assert result.results[0].error is None


def test_a_sequence_preempted_mid_prefill_counts_no_block_it_computed_itself_as_cached() -> None:
    runner = TorchSpecRunner(tiny_engine(0))
    assert runner.add(0, 64, SAMPLING, drafts=False, token_ids=PROMPT).cached == 0
    prefill_and_decode(runner, 0, [20])  # two full blocks and half the third computed
    runner.preempt(0)
    readmitted = runner.add(0, 64, SAMPLING, drafts=False, token_ids=PROMPT)
    assert readmitted.cached == 20  # its own two blocks and the start of the third: not computed again
    prefill_and_decode(runner, 20, [40])
    metrics = runner.kv_cache_metrics(0)
    assert metrics is not None
    # cold when it came: nothing reused, its 5 blocks missed; taken from the pool: 3, then 3 more
    # (a copy of the half-filled third block, and the last two)
    assert metrics == KVCacheMetrics(
        reused_blocks=0, missed_blocks=5, alloc_new_blocks=6, alloc_total_blocks=6, cached_tokens=0
    )
    runner.free(0)
    # a later request of the same prompt does find those blocks: a hit, counted as one
    assert runner.add(1, 64, SAMPLING, drafts=False, token_ids=PROMPT).cached == 39
    assert runner.kv_cache_metrics(1).cached_tokens == 39  # type: ignore[union-attr]
