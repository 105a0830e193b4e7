"""The same text whether a prefix was cached or not (issue 40), tested the way SGLang's deterministic
suite does: prompts cut from one long text at many lengths, batched at random, cold against warm,
token for token; greedy and seeded sampled, float32 and GGUF targets, with the draft model's pool
caching too. Under it, the fact that makes it hold: a position's keys and values are the same bits
whether computed in one prefill, in chunks, token by token (decode steps), in a verify pass or beside
other sequences; so a block computed for one request is what any other would have computed."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from gguf_files import random_gguf
from tiny import run_to_completion, spec_engine, tiny_args, tiny_engine, tokens_of
from trispec.drafters.model_drafter import ModelDrafter
from trispec.engine.base import ForwardInput
from trispec.engine.kv_cache import slots_of
from trispec.engine.torch_engine import TorchEngine
from trispec.request import GenerationRequest

VARIANTS = {
    "float32": {},
    "bfloat16": {"dtype": "bfloat16"},
    "int8": {"weight_quant": "int8"},
    "gguf": {"weight_quant": "gguf"},
}
_rng = random.Random(40)
TEXT = [_rng.randrange(256) for _ in range(700)]  # the long text prompts are cut from


def make_engine(variant: str, **kw: object) -> TorchEngine:
    kw.setdefault("num_blocks", 400)
    kw.setdefault("block_size", 8)
    if variant == "gguf":
        return TorchEngine.from_checkpoint(random_gguf(tiny_args(), 0), **VARIANTS[variant], **kw)
    return TorchEngine.from_random(tiny_args(), 0, **VARIANTS[variant], **kw)


def kv_bits(engine: TorchEngine, seq_id: int, length: int) -> torch.Tensor:
    slots = torch.tensor(slots_of(engine.blocks.block_table(seq_id), engine.block_size, range(length)))
    return torch.stack([engine.kv.k.index_select(2, slots), engine.kv.v.index_select(2, slots)])


def computed(
    engine: TorchEngine, feeds: list[int], companions: int = 0, logits: bool = False
) -> torch.Tensor:
    """The KV of TEXT[:45] fed, as a new sequence of ``engine``, in pieces of ``feeds`` tokens, each
    piece beside ``companions`` other new sequences feeding their own, asking for logits on every fed
    row (a verify pass) or none."""
    rng = random.Random(sum(feeds) + companions)
    first = max(engine.blocks.seq_ids(), default=-1) + 1
    engine.add_sequence(first, 100)
    for j in range(1, companions + 1):
        engine.add_sequence(first + j, 400)
    done = 0
    for n in feeds:
        inputs = [ForwardInput(first, TEXT[done : done + n], n if logits else 0)]
        for j in range(1, companions + 1):
            other = [rng.randrange(256) for _ in range(rng.randrange(1, 9))]
            inputs.append(ForwardInput(first + j, other, 1))
        engine.forward(inputs)
        done += n
    assert done == 45
    return kv_bits(engine, first, 45)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_positions_kv_is_the_same_bits_however_it_was_computed(variant: str) -> None:
    engine = make_engine(variant)
    one_prefill = computed(engine, [45])
    ways = {
        "chunks 5+17+23": computed(engine, [5, 17, 23]),
        "token by token (decode steps)": computed(engine, [1] * 45),
        "verify passes of 5 (logits on every row)": computed(engine, [5] * 9, logits=True),
        "beside 7 sequences, chunks of 9": computed(engine, [9] * 5, companions=7),
        "beside 3 sequences, token by token": computed(engine, [1] * 45, companions=3),
    }
    differing = [name for name, kv in ways.items() if not torch.equal(kv, one_prefill)]
    assert not differing, differing
    assert one_prefill.abs().sum() > 0


def test_the_kv_check_can_fail() -> None:
    """Sharp: torch's SDPA attention, which is not row-invariant, gives other bits token by token."""
    VARIANTS["sdpa"] = {"attention": "sdpa"}
    try:
        engine = make_engine("sdpa")
    finally:
        del VARIANTS["sdpa"]
    assert not torch.equal(computed(engine, [1] * 45), computed(engine, [45]))


# -- through the llm: cold vs warm, token for token -------------------------------------------------
LENGTHS = [5, 9, 16, 23, 64, 65, 170, 333]


def requests(sampled: bool, max_tokens: int = 16) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            prompt_token_ids=TEXT[:length],
            max_tokens=max_tokens,
            num_draft_tokens=(0, 2, 4)[i % 3],
            temperature=0.9 if sampled else 0.0,
            seed=100 + i if sampled else None,
        )
        for i, length in enumerate(LENGTHS)
    ]


def run(llm, batch: list[GenerationRequest], rng: random.Random | None = None) -> list[list[int]]:
    """Every request's tokens; with ``rng`` they are submitted in random groups while others run."""
    ids: list[tuple[int, int]] = []  # (index in batch, request id)
    outputs: dict[int, list] = {}
    order = list(range(len(batch)))
    if rng is not None:
        rng.shuffle(order)
    pending = list(order)
    while pending or llm.has_work():
        take = len(pending) if rng is None else rng.randrange(1, 4)
        for i in pending[:take]:
            ids.append((i, llm.add_request(batch[i])))
        pending = pending[take:]
        for _ in range(1 if rng is not None and pending else 10_000):
            if not llm.has_work():
                break
            for out in llm.step():
                outputs.setdefault(out.request_id, []).append(out)
    by_index = dict(ids)
    return [tokens_of(outputs[by_index[i]]) for i in range(len(batch))]


def build(variant: str, rule: str, caching: bool):
    target = make_engine(variant, prefix_caching=caching)
    drafter = ModelDrafter(make_engine("bfloat16", prefix_caching=caching))
    return spec_engine(target, drafter, sampling_rule=rule, max_prefill_tokens_per_step=96), target, drafter


@pytest.mark.parametrize(
    ("variant", "sampled", "rule"),
    [("float32", False, "coupled"), ("float32", True, "coupled"), ("gguf", True, "rejection")],
)
def test_cold_and_warm_give_the_same_tokens(variant: str, sampled: bool, rule: str) -> None:
    batch = requests(sampled)
    cold, _, _ = build(variant, rule, caching=False)
    expected = run(cold, batch)
    warm, target, drafter = build(variant, rule, caching=True)
    rng = random.Random(7)
    # warm up on some of the same prompts (shorter answers), then everything in random groups
    run(warm, [requests(sampled, max_tokens=6)[i] for i in rng.sample(range(len(LENGTHS)), 4)], rng)
    got = run(warm, batch, rng)
    assert got == expected
    stats = warm.stats
    assert stats.cached_prompt_tokens > sum(LENGTHS) // 3  # most of the text came from the cache
    assert target.kv_usage().hit_tokens == stats.cached_prompt_tokens
    assert drafter.engine.kv_usage().hit_tokens > 0  # and the draft model's pool reused its blocks
    # a second turn: the first turn's prompt and answer, then more text, hits the answer's blocks
    turn2 = [
        GenerationRequest(
            prompt_token_ids=[*r.prompt_token_ids, *answer, *TEXT[-9:]],
            max_tokens=8,
            temperature=r.temperature,
            seed=r.seed,
        )
        for r, answer in zip(batch[-4:], expected[-4:])
    ]
    before = stats.cached_prompt_tokens
    assert run(warm, turn2) == run(cold, turn2)
    assert stats.cached_prompt_tokens - before > sum(len(r.prompt_token_ids) for r in batch[-4:])
    target.blocks.check()
    drafter.engine.blocks.check()


def test_salted_requests_never_share_blocks() -> None:
    target = tiny_engine(0)
    llm = spec_engine(target, None)
    prompt = TEXT[:100]
    # 12 shared blocks of 8, and 3 tokens copied from the block the first request's answer began in
    for salt, cached in (
        (None, 0),
        (None, 99),
        ("tenant-a", 0),
        ("tenant-a", 99),
        ("tenant-b", 0),
        (None, 99),
    ):
        rid = llm.add_request(GenerationRequest(prompt_token_ids=prompt, max_tokens=2, cache_salt=salt))
        out = run_to_completion(llm)[rid]
        assert out[-1].cached_tokens == cached, salt


def test_only_uncached_tokens_count_against_the_prefill_budget_and_the_kv_room() -> None:
    """A cached prompt starts decoding in its first step whatever the prefill budget, and a second
    request of a prompt the running one holds is admitted beside it in a pool that could not hold two
    copies (its blocks are shared, not taken again)."""
    target = tiny_engine(0, num_blocks=30, block_size=8)  # 240 tokens
    llm = spec_engine(target, None, max_prefill_tokens_per_step=32, max_context=240)
    prompt = TEXT[:200]  # 25 blocks
    steps_to_first = []
    for _ in range(2):
        rid = llm.add_request(GenerationRequest(prompt_token_ids=prompt, max_tokens=4))
        steps = 0
        while True:
            steps += 1
            if any(o.request_id == rid and o.new_token_ids for o in llm.step()):
                break
        steps_to_first.append(steps)
        run_to_completion(llm)
    assert steps_to_first[0] >= 7 and steps_to_first[1] == 1  # 200 / 32 chunks, then none
    prefilled = llm.stats.prefill_tokens
    first = llm.add_request(GenerationRequest(prompt_token_ids=prompt, max_tokens=20))
    llm.step()
    second = llm.add_request(GenerationRequest(prompt_token_ids=[*prompt, 5], max_tokens=4))
    llm.step()
    assert llm.num_running == 2  # admitted beside it: 25 + 26 blocks would not fit 30
    outputs = run_to_completion(llm)
    assert outputs[first][-1].finished and outputs[second][-1].finished
    assert llm.stats.prefill_tokens - prefilled <= 2  # (the prompts' last tokens ride with decodes)
    target.blocks.check()


def test_a_draft_cache_starts_from_what_the_draft_pool_holds() -> None:
    """Admitted, a drafting sequence takes the draft pool's cached blocks of its prompt at once, and
    its draft cache counts as that far along: whether it starts drafting (adaptive k) weighs only the
    rest of the catch-up, not the whole prompt (where an earlier request drafted over the same
    system prompt, starting would otherwise look as dear as a cold prompt's)."""
    llm, target, drafter = build("float32", "coupled", caching=True)
    prompt = TEXT[:100]
    run(llm, [GenerationRequest(prompt_token_ids=prompt, max_tokens=8, num_draft_tokens=2)])
    assert drafter.engine.kv_usage().hit_tokens == 0
    # 12 full blocks of 8 and 4 tokens copied from the block the answer began in; a sequence that
    # never drafts takes none, and one of another tenant (cache salt) none of the first's
    for k, salt, expected in ((2, None, 100), (0, None, 0), (2, "tenant-b", 0)):
        llm.add_request(
            GenerationRequest(
                prompt_token_ids=[*prompt, 7, 8], max_tokens=4, num_draft_tokens=k, cache_salt=salt
            )
        )
        llm.step()
        (seq,) = llm.scheduler.running
        assert seq.draft_synced == expected
        assert (
            drafter.engine.cached_length(seq.seq_id) == expected
            if k
            else seq.seq_id not in drafter.engine.blocks
        )
        run_to_completion(llm)
    assert drafter.engine.kv_usage().hit_tokens == 100
    target.blocks.check()
    drafter.engine.blocks.check()


def test_a_prompt_longer_than_the_draft_context_takes_no_more_than_the_draft_holds() -> None:
    """A draft model with a shorter context than the target's: a prompt past it is admitted (its
    draft cache takes at most what fits, and it decodes plain), with the tokens of a run without a
    drafter."""
    target = make_engine("float32", prefix_caching=True)
    drafter = ModelDrafter(make_engine("bfloat16", prefix_caching=True, max_context=64))
    llm = spec_engine(target, drafter)
    short = GenerationRequest(prompt_token_ids=TEXT[:40], max_tokens=16, num_draft_tokens=2)
    long = GenerationRequest(prompt_token_ids=TEXT[:90], max_tokens=8, num_draft_tokens=2)
    got = run(llm, [short]) + run(llm, [long, long])
    plain = [replace(r, num_draft_tokens=0) for r in (short, long, long)]
    assert got == run(spec_engine(make_engine("float32"), None), plain)
    assert drafter.engine.kv_usage().hit_tokens > 0  # the short prompt's blocks served the long ones
    target.blocks.check()
    drafter.engine.blocks.check()
