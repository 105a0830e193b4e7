"""Batch invariance: a token's logits are bit-identical whatever shares its forward pass.

Alone or with up to 31 other sequences of any length, verified together with any number of drafts,
its prompt prefilled in any chunks: the same bits, for float32, bfloat16, int8 and GGUF-block weights
(legacy types, and K-quants on the integer path), on the tiny test shape and on a SmolLM2-wide shape
whose long reductions (K = 1536) are where oneDNN's one-row path splits work across threads. On top of
that, through the llm: greedy speculation equals target-only decoding and a seeded sampled request gives
the same tokens alone and batched.

``test_isa_forced.py`` runs this file again with torch's, oneDNN's and our kernel's AVX2 code
forced, so a pass on an AVX-512 machine also covers AVX2 machines.
"""

from __future__ import annotations

import dataclasses
import os
import random

import pytest
import torch
from gguf_files import random_gguf
from required_builds import c_kernel
from tiny import (
    model_drafter,
    reference_greedy,
    run_to_completion,
    spec_engine,
    tiny_args,
    tiny_engine,
    tokens_of,
)
from trispec.drafters.model_drafter import ModelDrafter
from trispec.drafters.ngram import NgramDrafter
from trispec.engine import attention
from trispec.engine.base import ForwardInput
from trispec.engine.cpu import gguf_linear
from trispec.engine.torch_engine import TorchEngine
from trispec.request import GenerationRequest

# SmolLM2-135M's widths (hidden 576, MLP 1536, 9 heads of 64 over 3 KV heads), two layers
WIDE = tiny_args(
    hidden_size=576, intermediate_size=1536, num_heads=9, num_kv_heads=3, head_dim=64, vocab_size=2048
)
# widths of whole 256-blocks for K-quants (Q4_K_M's mix: every layer on the GGUF integer path)
K_WIDE = tiny_args(
    hidden_size=256, intermediate_size=768, num_heads=4, num_kv_heads=2, head_dim=64, vocab_size=512
)
SHAPES = {"tiny": tiny_args(), "wide": WIDE, "k": K_WIDE}
VARIANTS = {
    "float32": {},
    "bfloat16": {"dtype": "bfloat16"},
    "int8": {"weight_quant": "int8"},
    "gguf": {"weight_quant": "gguf"},  # the model written as a GGUF file in legacy types, its blocks
    "gguf-k": {"weight_quant": "gguf"},  # in K-quants (random blocks)
}


def engine(shape: str, variant: str) -> TorchEngine:
    args = SHAPES[shape]
    if variant.startswith("gguf"):
        path = random_gguf(args, 0, mix="k" if variant == "gguf-k" else "legacy")
        return TorchEngine.from_checkpoint(path, num_blocks=1200, block_size=8, **VARIANTS[variant])
    return TorchEngine.from_random(args, 0, num_blocks=1200, block_size=8, **VARIANTS[variant])


def test_forced_isa_took_effect() -> None:
    """In the forced-AVX2 run (test_isa_forced.py) torch and our kernel really run their AVX2 code."""
    expected = os.environ.get("SPECDEC_EXPECT_CPU_CAPABILITY")
    if expected is None:
        pytest.skip("only meaningful in the forced-ISA run")
    assert torch.backends.cpu.get_cpu_capability() == expected
    target = tiny_engine(0)
    assert isinstance(target.model.attention, attention.PagedAttention)
    assert target.model.attention.isa == 2
    assert gguf_linear._Q8_ISA in (0, 2, 256)  # the GGUF integer path's 256-bit copies


def test_cpu_engine_uses_the_invariant_kernel() -> None:
    # without it nothing below is guaranteed; the extension is built by `pip install -e .`
    assert isinstance(tiny_engine(0).model.attention, attention.PagedAttention)


@pytest.mark.parametrize("kind", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize(("features", "out_features"), [(576, 3072), (1536, 576)])
def test_every_row_of_a_linear_layer_is_the_same_bits_whatever_the_row_count(
    kind: str, features: int, out_features: int
) -> None:
    """Every row, not only the first: with AMX, oneDNN's bf16 GEMM changed about a fifth of the rows
    of a call from 33 rows on, and row 0 was not among them."""
    from trispec.engine.cpu.linear import DenseLinear, Int8Linear

    g = torch.Generator().manual_seed(4)
    weight = torch.randn(out_features, features, generator=g) * 0.05
    dtype = torch.float32 if kind == "float32" else torch.bfloat16
    layer = (
        Int8Linear.from_float(weight, None, dtype=dtype) if kind == "int8" else DenseLinear(weight.to(dtype))
    )
    x = torch.randn(70, features, generator=g).to(dtype)
    alone = torch.cat([layer(x[i : i + 1]) for i in range(len(x))])
    for rows in (2, 5, 16, 31, 32, 33, 40, 64, 70):
        assert torch.equal(layer(x[:rows]), alone[:rows]), f"{rows} rows"


class Probe:
    """A sequence whose next-token logits at one position are compared across scenarios."""

    def __init__(self, shape: str, variant: str, seed: int = 0) -> None:
        self.shape, self.variant = shape, variant
        rng = random.Random(seed)
        vocab = SHAPES[shape].vocab_size
        self.vocab = vocab
        self.prompt = [rng.randrange(vocab) for _ in range(37)]
        self.others = [[rng.randrange(vocab) for _ in range(rng.randrange(2, 120))] for _ in range(31)]
        self.rng = rng

    def logits(
        self, *, companions: int = 0, drafts: int = 0, chunks: tuple[int, ...] = (36,), companion_new: int = 1
    ) -> torch.Tensor:
        """Logits for the token after ``prompt[:37]``, computed in one pass that holds the last prompt
        token followed by ``drafts`` more tokens, next to ``companions`` other sequences that each
        feed ``companion_new`` new tokens (or their whole prompt, when shorter); the first 36 prompt
        tokens prefilled before, in ``chunks``."""
        e = engine(self.shape, self.variant)
        e.add_sequence(0, 200)
        done = 0
        for size in chunks:
            e.forward([ForwardInput(0, self.prompt[done : done + size], 0)])
            done += size
        assert done == 36
        inputs = [
            ForwardInput(0, [self.prompt[36], *[(7 * i + 3) % self.vocab for i in range(drafts)]], drafts + 1)
        ]
        for j, other in enumerate(self.others[:companions]):
            e.add_sequence(j + 1, 130)
            new = min(companion_new, len(other))
            if len(other) > new:
                e.forward([ForwardInput(j + 1, other[:-new], 0)])
            inputs.append(ForwardInput(j + 1, other[-new:], min(new, 2)))
        return e.forward(inputs)[0][0]


CASES = [(shape, v) for shape in ("tiny", "wide") for v in VARIANTS if v != "gguf-k"] + [("k", "gguf-k")]


def integer_path_copy(shape: str, variant: str) -> str:
    """The K-quant case is there for the GGUF integer path: every linear layer of its engine must run on
    it (else it would check the float path a second time). Returns the ISA copy they run; skips where
    the CPU has no integer path (no AVX2), saying so."""
    c_kernel("trispec.engine.cpu._gguf_linear")  # built: else the failure says so, not the skip below
    if gguf_linear._Q8_ISA == 0:
        pytest.skip("no GGUF integer path on this CPU (it needs AVX2): the K-quant layers would run float")
    layers = engine(shape, variant).model.linears()
    assert layers and all(isinstance(m, gguf_linear.GGUFLinear) and m.integer for m in layers), [
        type(m).__name__ + ("" if getattr(m, "integer", False) else " (not integer)") for m in layers
    ]
    assert {m.q8_isa for m in layers} == {gguf_linear._Q8_ISA}
    return gguf_linear.Q8_COPIES[gguf_linear._Q8_ISA]


@pytest.mark.parametrize(("shape", "variant"), CASES)
def test_logits_are_bit_identical_whatever_shares_the_pass(shape: str, variant: str) -> None:
    if variant == "gguf-k":
        integer_path_copy(shape, variant)
    probe = Probe(shape, variant)
    alone = probe.logits()
    scenarios = {
        "1 companion": probe.logits(companions=1),
        "7 companions, 5 new tokens each": probe.logits(companions=7, companion_new=5),
        "31 companions (32 rows)": probe.logits(companions=31),
        "31 companions prefilling": probe.logits(companions=31, companion_new=200),
        "k=1": probe.logits(drafts=1),
        "k=4": probe.logits(drafts=4),
        "k=8 with 7 companions": probe.logits(drafts=8, companions=7, companion_new=3),
        "prompt in chunks 5+31": probe.logits(chunks=(5, 31)),
        "prompt token by token": probe.logits(chunks=(1,) * 36),
    }
    differing = {
        name: float((got - alone).abs().max())
        for name, got in scenarios.items()
        if not torch.equal(got, alone)
    }
    assert not differing, differing
    assert torch.isfinite(alone).all()


def test_the_check_can_fail() -> None:
    """The comparison above is sharp: torch SDPA, which is not batch-invariant, fails it."""
    probe = Probe("wide", "float32")
    VARIANTS["sdpa"] = {"attention": "sdpa"}
    try:
        probe.variant = "sdpa"
        alone = probe.logits()
        batched = [probe.logits(companions=7, companion_new=5), probe.logits(drafts=4)]
    finally:
        del VARIANTS["sdpa"]
    assert any(not torch.equal(b, alone) for b in batched)


# -- through the llm ---------------------------------------------------------------------------
def prompts(n: int, seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randrange(3, 40))] for _ in range(n)]


# each takes the target engine (a self-draft catching up from its keys and values uses it)
DRAFTERS = {
    "model-bf16": lambda target: model_drafter(0, dtype="bfloat16"),
    "self-int8": lambda target: model_drafter(0, weight_quant="int8"),
    "self-int8-target-kv": lambda target: ModelDrafter(tiny_engine(0, weight_quant="int8"), target),
    "other-model": lambda target: model_drafter(7),
    "ngram": lambda target: NgramDrafter(tiny_args().vocab_size),
}


@pytest.mark.parametrize("k", [0, 1, 4, 8])
def test_greedy_speculation_equals_target_only(k: int) -> None:
    batch = prompts(12)
    expected = [reference_greedy(p, 32) for p in batch]
    for name, make in DRAFTERS.items():
        target = tiny_engine(0)
        llm = spec_engine(target, make(target))
        ids = [
            llm.add_request(GenerationRequest(prompt_token_ids=p, max_tokens=32, num_draft_tokens=k))
            for p in batch
        ]
        outputs = run_to_completion(llm)
        assert [tokens_of(outputs[i]) for i in ids] == expected, name


def seeded_run(make_drafter, batch: list[list[int]], ks: list[int], seed0: int = 11) -> list[list[int]]:
    target = tiny_engine(0)
    llm = spec_engine(target, make_drafter(target))
    ids = [
        llm.add_request(
            GenerationRequest(
                prompt_token_ids=p, max_tokens=32, num_draft_tokens=k, temperature=0.8, seed=seed0 + i
            )
        )
        for i, (p, k) in enumerate(zip(batch, ks))
    ]
    outputs = run_to_completion(llm)
    return [tokens_of(outputs[i]) for i in ids]


@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_seeded_sampling_alone_equals_batched_with_seven_others(drafter: str) -> None:
    batch = prompts(8, seed=5)
    ks = [4, 0, 1, 2, 3, 5, 6, 8]
    together = seeded_run(DRAFTERS[drafter], batch, ks)
    alone = seeded_run(DRAFTERS[drafter], batch[:1], ks[:1])
    assert together[0] == alone[0]
    # and a request in the middle of the batch, run alone
    assert together[5] == seeded_run(DRAFTERS[drafter], batch[5:6], ks[5:6], seed0=16)[0]
    assert len({tuple(t) for t in together}) == len(together)  # the requests really are different


def test_seeded_sampling_depends_on_the_seed() -> None:
    batch = prompts(1, seed=5)
    a = seeded_run(DRAFTERS["model-bf16"], batch, [4], seed0=1)
    b = seeded_run(DRAFTERS["model-bf16"], batch, [4], seed0=2)
    assert a != b


def test_wide_model_drafts_are_batch_invariant() -> None:
    """The draft model's own proposals (and their probabilities, which the rejection rule uses) do not
    depend on the batch either: checked on the wide shape, where oneDNN's one-row path differs."""
    from trispec.drafters.base import DraftRequest
    from trispec.sampling import SamplingParams, make_generator

    def propose(n_others: int) -> tuple[list[int], torch.Tensor]:
        drafter = ModelDrafter(engine("wide", "bfloat16"))
        rng = random.Random(9)
        seqs = [[rng.randrange(2048) for _ in range(rng.randrange(5, 60))] for _ in range(n_others + 1)]
        params = SamplingParams(temperature=0.8, seed=3, rule="rejection")
        requests = []
        for i, tokens in enumerate(seqs):
            drafter.add_sequence(i, 200)  # the proposal feeds the whole sequence: its cache is empty
            requests.append(
                DraftRequest(i, tokens, 4, params, make_generator(dataclasses.replace(params, seed=3 + i)))
            )
        first = drafter.propose(requests)[0]
        assert first.probs is not None
        return first.tokens, first.probs

    tokens_alone, probs_alone = propose(0)
    tokens_batched, probs_batched = propose(7)
    assert tokens_alone == tokens_batched
    assert torch.equal(probs_alone, probs_batched)
