"""Same seed, same text — whatever k, drafter or batch (the coupled sampling rule, sampling/coupled.py).

Every sampled request of a batch is run once plain and alone (k = 0, no drafter): that is the text its
seed promises. Then the same requests, batched together, with each drafter kind (a different model, an
int8 self-draft on the target's KV, suffix decoding, n-gram lookup, a model with suffix beside it) at
k = 1, 4, 8 and under adaptive k: every request's tokens must be the plain ones, and the drafters must
have had drafts accepted (else the check would be empty). Under the rejection rule the same swap of k
changes the text: the check can tell the rules apart."""

from __future__ import annotations

import pytest
from tiny import TINY_VOCAB, repeating_prompts, run_to_completion, spec_engine, tiny_engine, tokens_of
from trispec.drafters.model_drafter import ModelDrafter
from trispec.drafters.ngram import NgramDrafter
from trispec.drafters.suffix import SuffixDrafter
from trispec.drafters.with_suffix import WithSuffix
from trispec.engine.torch_engine import TorchEngine
from trispec.request import GenerationRequest

SETTINGS = [
    {"temperature": 0.7, "top_k": 40},
    {"temperature": 1.0, "top_p": 0.9},
    {"temperature": 0.7, "top_k": 20, "top_p": 0.95},
    {"temperature": 1.0},
]
PROMPTS = repeating_prompts(8, seed=4)
MAX_TOKENS = 20


def requests(k: int | None) -> list[GenerationRequest]:
    """Each prompt under each setting, each with its own seed."""
    return [
        GenerationRequest(
            prompt_token_ids=p, max_tokens=MAX_TOKENS, num_draft_tokens=k, seed=100 * i + j, **s
        )
        for i, p in enumerate(PROMPTS)
        for j, s in enumerate(SETTINGS)
    ]


def make_drafter(kind: str, target: TorchEngine) -> object:
    if kind == "model":  # another model: it disagrees with the target often
        return ModelDrafter(tiny_engine(9))
    if kind == "self":  # the target's weights in int8, catching up from the target's KV
        return ModelDrafter(tiny_engine(0, weight_quant="int8"), target)
    if kind == "suffix":
        return SuffixDrafter(TINY_VOCAB)
    if kind == "ngram":
        return NgramDrafter(TINY_VOCAB)
    return WithSuffix(ModelDrafter(tiny_engine(0, dtype="bfloat16")), SuffixDrafter(TINY_VOCAB))


def generate(
    batch: list[GenerationRequest], drafter: str | None, **config: object
) -> tuple[list[list[int]], object]:
    target = tiny_engine(0, num_blocks=1024)
    llm = spec_engine(target, make_drafter(drafter, target) if drafter else None, max_batch_size=64, **config)
    ids = [llm.add_request(r) for r in batch]
    outputs = run_to_completion(llm)
    return [tokens_of(outputs[i]) for i in ids], llm.stats


@pytest.fixture(scope="module")
def plain_alone() -> list[list[int]]:
    return [generate([r], None)[0][0] for r in requests(0)]


@pytest.mark.parametrize("drafter", ["model", "self", "suffix", "ngram", "with_suffix"])
def test_every_k_gives_the_plain_text_batched(drafter: str, plain_alone: list[list[int]]) -> None:
    for k in (1, 4, 8):
        tokens, stats = generate(requests(k), drafter, max_num_draft_tokens=8)
        assert tokens == plain_alone, (drafter, k)
        assert stats.accepted_tokens > 0, (drafter, k)  # type: ignore[attr-defined]


def test_adaptive_k_and_requests_alone_give_the_plain_text(plain_alone: list[list[int]]) -> None:
    tokens, stats = generate(requests(8), "self", adaptive_speculation=True, max_num_draft_tokens=8)
    assert tokens == plain_alone
    assert stats.accepted_tokens > 0  # type: ignore[attr-defined]
    for i in (0, 13, 30):  # a few requests alone, drafted
        assert generate([requests(4)[i]], "model")[0][0] == plain_alone[i]


def test_under_the_rejection_rule_k_changes_the_text() -> None:
    """The same comparison under the rejection rule: seeded texts depend on k there."""
    by_k = [generate(requests(k), "model", sampling_rule="rejection")[0] for k in (0, 4)]
    assert by_k[0] != by_k[1]
