"""A self-draft catches its cache up from the target's keys and values (``ModelDrafter(kv_source=)``):
no prompt is fed through the draft model again, outputs stay the target's. Under the rejection rule
seeded sampled requests keep feeding their own (what a copy brings depends on how the target's
prefill was chunked, which depends on the batch, and their draws depend on the drafts); under the
coupled rule they take the copy too: their output does not depend on the drafts."""

from __future__ import annotations

import pytest
from tiny import reference_greedy, run_to_completion, spec_engine, tiny_engine, tokens_of
from trispec.drafters.base import DraftRequest
from trispec.drafters.model_drafter import ModelDrafter
from trispec.engine.base import ForwardInput
from trispec.request import GenerationRequest
from trispec.sampling import make_generator
from trispec.sampling_params import SamplingParams

PROMPT = [(11 * i + 5) % 256 for i in range(30)]


def first_proposal(shared: bool, sampling: SamplingParams) -> int:
    """Catch-up tokens the first proposal after a prefill reports (the target holds the prompt)."""
    target = tiny_engine(0)
    drafter = ModelDrafter(tiny_engine(0, weight_quant="int8"), target if shared else None)
    target.add_sequence(0, 64)
    target.forward([ForwardInput(0, PROMPT, 0)])
    drafter.add_sequence(0, 64)
    request = DraftRequest(0, [*PROMPT, 9], 4, sampling, make_generator(sampling))
    (proposal,) = drafter.propose([request])
    assert len(proposal.tokens) == 4
    return proposal.catch_up_tokens


def test_the_draft_cache_takes_the_targets_prompt_instead_of_feeding_it() -> None:
    greedy = SamplingParams()
    assert first_proposal(shared=False, sampling=greedy) == len(PROMPT) - 1
    assert first_proposal(shared=True, sampling=greedy) == 0
    # a seeded sampled request: the copy under the coupled rule, its own feed under the rejection rule
    assert first_proposal(shared=True, sampling=SamplingParams(temperature=0.8, seed=3)) == 0
    by_rejection = SamplingParams(temperature=0.8, seed=3, rule="rejection")
    assert first_proposal(shared=True, sampling=by_rejection) == len(PROMPT) - 1


def test_no_draft_while_the_target_has_not_seen_the_prompt() -> None:
    """The first round feeds the whole prompt to the target: a self-draft on the target's KV drafts
    nothing then (rather than feed the prompt itself), and takes the prompt from the target next."""
    target = tiny_engine(0)
    drafter = ModelDrafter(tiny_engine(0, weight_quant="int8"), target)
    target.add_sequence(0, 64)
    drafter.add_sequence(0, 64)
    greedy = SamplingParams()
    (first,) = drafter.propose([DraftRequest(0, PROMPT, 4, greedy, None)])
    assert first.tokens == [] and drafter.engine.cached_length(0) == 0
    target.forward([ForwardInput(0, PROMPT, 1)])  # the verify pass of that round
    (second,) = drafter.propose([DraftRequest(0, [*PROMPT, 9], 4, greedy, None)])
    assert len(second.tokens) == 4 and second.catch_up_tokens == 0


def test_a_draft_engine_of_another_geometry_is_refused() -> None:
    from tiny import tiny_args
    from trispec.engine.torch_engine import TorchEngine

    other = TorchEngine.from_random(tiny_args(num_kv_heads=1), 0, num_blocks=32, block_size=8)
    with pytest.raises(ValueError, match="KV geometry"):
        ModelDrafter(other, tiny_engine(0))


@pytest.mark.parametrize("k", [1, 4])
def test_outputs_stay_the_targets(k: int) -> None:
    prompts = [[(7 * i + j) % 256 for i in range(3 + 5 * j)] for j in range(6)]
    target = tiny_engine(0)
    llm = spec_engine(target, ModelDrafter(tiny_engine(0, weight_quant="int8"), target))
    ids = [
        llm.add_request(GenerationRequest(prompt_token_ids=p, max_tokens=24, num_draft_tokens=k))
        for p in prompts
    ]
    outputs = run_to_completion(llm)
    assert [tokens_of(outputs[i]) for i in ids] == [reference_greedy(p, 24) for p in prompts]
    assert llm.scheduler.stats.draft_tokens > 0


def seeded_tokens(prompts: list[list[int]], seeds: list[int], sampling_rule: str) -> list[int]:
    """The last request's tokens, sampled with its seed after the others; prompts longer than the
    prefill budget, so how the target's prefill of it is chunked depends on who else is prefilling."""
    target = tiny_engine(0)
    llm = spec_engine(
        target,
        ModelDrafter(tiny_engine(0, weight_quant="int8"), target),
        max_prefill_tokens_per_step=24,
        sampling_rule=sampling_rule,
    )
    ids = [
        llm.add_request(
            GenerationRequest(
                prompt_token_ids=p, max_tokens=32, num_draft_tokens=3, temperature=0.9, seed=seed
            )
        )
        for p, seed in zip(prompts, seeds)
    ]
    return tokens_of(run_to_completion(llm)[ids[-1]])


@pytest.mark.parametrize("sampling_rule", ["coupled", "rejection"])
def test_a_seeded_request_samples_the_same_alone_and_batched(sampling_rule: str) -> None:
    prompts = [[(13 * i + 7 * j) % 256 for i in range(40 + 9 * j)] for j in range(5)]
    alone = seeded_tokens(prompts[-1:], [9], sampling_rule)
    assert seeded_tokens(prompts, [5, 6, 7, 8, 9], sampling_rule) == alone
    assert seeded_tokens(prompts[2:], [7, 8, 9], sampling_rule) == alone
