"""Prefix reuse on the TensorRT-LLM path: the executor reuses KV blocks itself; we report what it says
(``request_perf_metrics.kv_cache_metrics`` of a request's first target request) and pass the cache
salt as ``cache_salt_id``. The stand-in's block reuse is written from TensorRT-LLM's source
(``trtllm_standin_kv``), not from our cache: it reuses partly matched blocks, never keys the last
prompt token, and counts a lone last token's block as missed, as kvCacheManager.cpp does."""

from __future__ import annotations

from pathlib import Path

from test_trtllm_runtime import runner_over
from trispec.request import GenerationRequest
from trtllm_files import drain, engine_over
from trtllm_standin_kv import ReuseTree

TPB = 32


def metrics(tree: ReuseTree, tokens: list[int], salt: int | None = None, generated: int = 4) -> tuple:
    held, kv = tree.add_sequence(tokens, salt)
    tree.release(held, [*tokens, *range(900, 900 + generated)], salt)
    return (
        kv.num_reused_blocks,
        kv.num_missed_blocks,
        kv.num_total_allocated_blocks,
        kv.num_new_allocated_blocks,
        kv.kv_cache_hit_rate,
    )


def test_the_standin_reuses_blocks_as_tensorrt_llm_does() -> None:
    tree = ReuseTree(num_blocks=64, tokens_per_block=TPB)
    prompt = list(range(70))  # 3 context blocks; keys of its first 69 tokens: 32 + 32 + 5
    assert metrics(tree, prompt) == (0, 3, 3, 3, 0.0)
    # stored when it ended: the blocks of prompt + generated but the last token (32 + 32 + 9)
    assert metrics(tree, prompt) == (3, 0, 0, 0, 1.0)  # the third matched partly: a leaf, claimed
    # a prompt of 65 tokens: 64 keyed, then an empty key for the lone last token, always missed
    assert metrics(tree, list(range(65))) == (2, 1, 1, 1, 2 / 3)  # a never-used block: new
    # another salt id: nothing shared
    assert metrics(tree, prompt, salt=7)[:3] == (0, 3, 3)
    # a prefix that differs in the first block: nothing matched, the rest never searched
    assert metrics(tree, [5, *prompt[1:]])[:2] == (0, 3)


def test_a_partly_matched_block_others_hold_is_copied_into_a_fresh_one() -> None:
    tree = ReuseTree(num_blocks=64, tokens_per_block=TPB)
    metrics(tree, list(range(40)))  # stores 32 + 11 tokens
    held, _ = tree.add_sequence(list(range(40)), None)  # holds the stored blocks now
    _, kv = tree.add_sequence([*range(36), 99, 98], None)  # its second block starts like the stored one
    assert (kv.num_reused_blocks, kv.num_missed_blocks, kv.num_total_allocated_blocks) == (2, 0, 1)
    tree.release(held, list(range(41)), None)


def test_a_requests_reused_blocks_and_hit_rate_come_from_the_executor(
    tmp_path: Path, trtllm_bindings
) -> None:  # type: ignore[no-untyped-def]
    llm = engine_over(runner_over(tmp_path))
    prompt = "A shared context of a conversation, long enough for a few blocks. " * 2  # 132 bytes
    results = {}
    for name, salt in (("cold", None), ("warm", None), ("salted", "tenant-a"), ("salted again", "tenant-a")):
        rid = llm.add_request(
            GenerationRequest(prompt=prompt, max_tokens=4, num_draft_tokens=3, cache_salt=salt)
        )
        final = drain(llm)[rid][-1]
        results[name] = final
    cold, warm = results["cold"].kv_metrics, results["warm"].kv_metrics
    assert cold is not None and warm is not None
    assert (cold.reused_blocks, cold.missed_blocks, cold.hit_rate) == (0, 5, 0.0)  # 132 tokens: 5 blocks
    # the stand-in keyed the first prompt's tokens but the last; the second finds 4 full blocks and
    # the fifth partly (a leaf nobody holds): 5 reused, as TensorRT-LLM counts them
    assert (warm.reused_blocks, warm.missed_blocks, warm.hit_rate) == (5, 0, 1.0)
    # the executor reports blocks: the fifth (the prompt's last 3 keyed tokens) is the last it reused,
    # maybe in part, so cached_tokens counts the 4 whole ones before it
    assert results["warm"].cached_tokens == 128 and results["cold"].cached_tokens == 0
    assert results["salted"].kv_metrics.reused_blocks == 0  # type: ignore[union-attr]
    assert results["salted again"].kv_metrics.reused_blocks == 5  # type: ignore[union-attr]
    salts = {r.cache_salt_id for r in trtllm_bindings.Executor.enqueued}
    assert None in salts and len(salts) == 2  # one id for the salt, on draft and target requests
    # every later round re-sends the sequence: reused by the executor, not reported again
    asked = [r for r in trtllm_bindings.Executor.enqueued if r.output_config.return_perf_metrics]
    assert len(asked) == 4


def test_cached_tokens_count_no_token_of_a_partly_reused_block(tmp_path: Path, trtllm_bindings) -> None:  # type: ignore[no-untyped-def]
    """TensorRT-LLM's executor reports a request's reused blocks, not its reused tokens (executor.h
    ``Result.requestPerfMetrics``, types.h ``RequestPerfMetrics::KvCacheMetrics``; the token count,
    ``prepopulatedPromptLen``, stays in the batch manager). Its matching goes past a block only when
    it reused that block whole, so only the last reused block may be partly reused (kvCacheManager.cpp
    ``loadOrAllocateBlocks``: ``searchRoot = nullptr`` after a partial match). A prompt sharing 40
    tokens with an earlier one reuses 2 blocks: 32 tokens whole, 8 of the second; never 64."""
    llm = engine_over(runner_over(tmp_path))
    earlier = "".join(chr(65 + i % 26) for i in range(70))
    later = earlier[:40] + "z" * 30
    finals = []
    for prompt in (earlier, later):
        rid = llm.add_request(GenerationRequest(prompt=prompt, max_tokens=4, num_draft_tokens=3))
        finals.append(drain(llm)[rid][-1])
    kv = finals[1].kv_metrics
    assert (kv.reused_blocks, kv.missed_blocks) == (2, 1)  # the second block matched 8 tokens
    assert finals[1].cached_tokens == 32
