"""Greedy exactness on the real SmolLM2-135M-Instruct (fp32 target): speculative output equals the
target's own greedy output token for token, for a draft model (int8) and n-gram, k in {1, 4, 8}.

Each drafter runs every prompt once, the k's in turn (prompt i with k = KS[(i + d) % 3] for the d-th
drafter), all batched in flight together: each drafter meets every k on a third of the prompts, and
every prompt meets two of the k's. (Every drafter on every pair made this file a fifth of
the suite's test time. A bf16 draft model ran too until 2026-11-28: a draft's precision changes what
it proposes, never what is accepted; test_batch_invariance.py runs bf16 drafts on tiny models.)"""

from __future__ import annotations

import pytest
import torch
from trispec.checkpoints import cache_dir, smollm2_gguf
from trispec.config import SchedulerConfig
from trispec.detokenize import StopTextTracker
from trispec.drafters.model_drafter import ModelDrafter
from trispec.drafters.ngram import NgramDrafter
from trispec.drafters.suffix import SuffixDrafter
from trispec.engine.base import ForwardInput
from trispec.engine.torch_engine import TorchEngine
from trispec.gguf_tokenizer import load_tokenizer_for_gguf
from trispec.llm_engine import LLMEngine
from trispec.request import GenerationRequest
from trispec.runners.torch_runner import TorchSpecRunner
from trispec.scheduler import Scheduler
from trispec.tokenizer import Tokenizer

pytestmark = pytest.mark.real_model

MAX_TOKENS = 64
KS = (1, 4, 8)
# each drafter one k per prompt, in turn from its own offset
KS_IN_TURN = {"self-int8": 0, "ngram": 2, "suffix": 1}
PROMPTS = [
    "The capital of France is",
    "Write a Python function that returns the factorial of n.\n\ndef factorial(n):",
    "Once upon a time, in a small village by the sea,",
    "List three benefits of regular exercise:\n1.",
    "Translate to French: 'Good morning, how are you?'",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Question: What is 12 times 12?\nAnswer:",
    "Explain photosynthesis in one paragraph.",
    "import numpy as np\n\n# create a 3x3 identity matrix\n",
    "My favourite season is autumn because",
    "SELECT name, age FROM users WHERE",
    "Here is a haiku about the ocean:\n",
    "To make a cup of tea, first",
    "The three primary colours are red,",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "In 1969, astronauts landed on",
    "A recipe for pancakes:\nIngredients:\n-",
    "Dear hiring manager, I am writing to apply for",
    "The largest planet in our solar system is",
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return load_tokenizer_for_gguf(smollm2_gguf(), cache_dir())


@pytest.fixture(scope="module")
def target() -> TorchEngine:
    return TorchEngine.from_checkpoint(smollm2_gguf(), dtype="float32", kv_cache_mb=256, max_context=512)


@pytest.fixture(scope="module")
def prompt_ids(tokenizer: Tokenizer) -> list[list[int]]:
    return [tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def reference(target: TorchEngine, prompt_ids: list[list[int]]) -> list[list[int]]:
    """Target-only greedy: all prompts batched, one token per forward, no scheduler involved."""
    ids = range(1000, 1000 + len(prompt_ids))
    for seq_id, prompt in zip(ids, prompt_ids):
        target.add_sequence(seq_id, len(prompt) + MAX_TOKENS)
    logits = target.forward([ForwardInput(s, p, 1) for s, p in zip(ids, prompt_ids)])
    outputs: list[list[int]] = [[] for _ in prompt_ids]
    for _ in range(MAX_TOKENS):
        next_tokens = [int(torch.argmax(row[-1])) for row in logits]
        for out, token in zip(outputs, next_tokens):
            out.append(token)
        logits = target.forward([ForwardInput(s, [t], 1) for s, t in zip(ids, next_tokens)])
    for seq_id in ids:
        target.free(seq_id)
    return outputs


def smollm2_engine(
    target: TorchEngine, drafter: object, tokenizer: Tokenizer, config: SchedulerConfig
) -> LLMEngine:
    # adaptive speculation chooses by measured time: these tests are about every k's exactness
    config = config.model_copy(update={"adaptive_speculation": False})
    runner = TorchSpecRunner(target, drafter)  # type: ignore[arg-type]
    scheduler = Scheduler(
        runner,
        config,
        encode=tokenizer.encode,
        make_text_tracker=lambda stop: StopTextTracker(tokenizer, stop),
        eos_ids=frozenset(),  # run every token even past an end-of-turn token
    )
    return LLMEngine(scheduler, runner)


def _self_draft(**kw: object) -> ModelDrafter:
    return ModelDrafter(TorchEngine.from_checkpoint(smollm2_gguf(), kv_cache_mb=128, max_context=512, **kw))


@pytest.fixture(scope="module")
def drafters(target: TorchEngine) -> dict[str, object]:
    # ModelDrafter serves both the "self" and the "model" kinds; they differ only in where the draft
    # engine's weights come from. SmolLM2 has no smaller sibling, so both use its weights here.
    return {
        "self-int8": _self_draft(weight_quant="int8"),
        "ngram": NgramDrafter(target.vocab_size),
        "suffix": SuffixDrafter(target.vocab_size),
    }


def k_in_turn(drafter_name: str, n: int) -> int:
    """The k of a drafter's n-th request: the k's in turn from the drafter's own offset."""
    return KS[(n + KS_IN_TURN[drafter_name]) % len(KS)]


@pytest.mark.parametrize("drafter_name", ["self-int8", "ngram"])
def test_smollm2_greedy_exact(
    drafter_name: str,
    target: TorchEngine,
    drafters: dict[str, object],
    tokenizer: Tokenizer,
    prompt_ids: list[list[int]],
    reference: list[list[int]],
) -> None:
    """Every prompt once, k in {1, 4, 8} in turn, all 20 requests batched in flight together."""
    drafter = drafters[drafter_name]
    llm = smollm2_engine(target, drafter, tokenizer, SchedulerConfig(max_context=512, max_batch_size=80))
    cases = {}
    for i, prompt in enumerate(prompt_ids):
        k = k_in_turn(drafter_name, i)
        request = GenerationRequest(prompt_token_ids=prompt, max_tokens=MAX_TOKENS, num_draft_tokens=k)
        cases[llm.add_request(request)] = (i, k)
    tokens: dict[int, list[int]] = {rid: [] for rid in cases}
    while llm.has_work():
        for out in llm.step():
            tokens[out.request_id].extend(out.new_token_ids)
    mismatches = [cases[rid] for rid in cases if tokens[rid] != reference[cases[rid][0]]]
    assert not mismatches, f"(prompt, k) pairs {mismatches} differ from target-only greedy"
    assert llm.stats.accepted_tokens > 0
    if drafter_name != "ngram":
        # a lower-precision copy of the target agrees on most tokens: long accepted runs were exercised
        assert llm.stats.acceptance_rate > 0.7
        assert llm.stats.accepted_per_position[7] > 0
    assert target.kv_usage().used_blocks == 0


SAMPLED = [{"temperature": 0.7, "top_p": 0.9}, {"temperature": 1.0, "top_k": 40}]


def test_smollm2_seeded_sampling_gives_the_plain_text_whatever_k_drafter_or_batch(
    target: TorchEngine, drafters: dict[str, object], tokenizer: Tokenizer, prompt_ids: list[list[int]]
) -> None:
    """Same seed, same text (the coupled rule): 8 prompts x 2 settings sampled plain (k = 0, no
    drafter), then all 16 batched with each drafter (k = 1, 4, 8 in turn), and one request alone with
    k = 4: every text is the plain one."""

    def run(
        drafter_name: str | None, cases: list[tuple[int, int, int]]
    ) -> dict[tuple[int, int, int], list[int]]:
        drafter = drafters[drafter_name] if drafter_name else None
        llm = smollm2_engine(target, drafter, tokenizer, SchedulerConfig(max_context=512, max_batch_size=64))
        requests = {
            llm.add_request(
                GenerationRequest(
                    prompt_token_ids=prompt_ids[i],
                    max_tokens=32,
                    num_draft_tokens=k,
                    seed=100 + i,
                    **SAMPLED[j],
                )
            ): (i, j, k)
            for i, j, k in cases
        }
        tokens: dict[int, list[int]] = {rid: [] for rid in requests}
        while llm.has_work():
            for out in llm.step():
                tokens[out.request_id].extend(out.new_token_ids)
        if drafter_name and len({i for i, _, _ in cases}) > 1:  # drafts were accepted: not an empty check
            assert llm.stats.accepted_tokens > 0, drafter_name
        return {requests[rid]: tokens[rid] for rid in requests}

    settings = [(i, j) for i in range(8) for j in range(len(SAMPLED))]
    plain = {(i, j): t for (i, j, _), t in run(None, [(i, j, 0) for i, j in settings]).items()}
    assert all(len(t) == 32 for t in plain.values())
    for drafter_name in ("self-int8", "ngram", "suffix"):
        cases = [(i, j, k_in_turn(drafter_name, i + j)) for i, j in settings]
        for (i, j, k), tokens in run(drafter_name, cases).items():
            assert tokens == plain[i, j], (drafter_name, i, j, k)
        alone = run(drafter_name, [(3, j, 4) for j in range(len(SAMPLED))])
        assert all(tokens == plain[i, j] for (i, j, _), tokens in alone.items()), drafter_name
