"""The GGUF layer stack (``engine/cpu/gguf_stack.py``, ``csrc/gguf_stack.h``): every decoder layer of a
model on the integer path in one C call. It must give what the same layers give called one by one from
Python (within float rounding: RoPE and SiLU are its own code), and keep every promise the engine's
exactness rests on: the same bits in every Q8 ISA copy, whatever the thread count, whatever else shares
the forward, and a position's keys and values the same whichever step (prefill, verify, decode) wrote
them.
"""

from __future__ import annotations

import functools

import pytest
import torch
from gguf_files import random_gguf
from isa_copies import q8_copies, require_q8_copy
from required_builds import c_kernel
from tiny import tiny_args
from trispec.engine.base import ForwardInput
from trispec.engine.cpu.gguf_stack import GGUFLayerStack
from trispec.engine.torch_engine import TorchEngine

kernel = c_kernel("trispec.engine.cpu._gguf_linear")
pytestmark = pytest.mark.skipif(kernel.q8_level(2) == 0, reason="the GGUF kernel's integer path needs AVX2")

# every width a whole number of 256-blocks (K-quants), GQA, two layers; qwen2: q|k|v biases too
ARGS = {
    arch: tiny_args(arch, hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2, head_dim=64)
    for arch in ("llama", "qwen2")
}
IDS = [(11 * i + 5) % 256 for i in range(40)]


def engine(arch: str = "llama", **kw: object) -> TorchEngine:
    e = TorchEngine.from_checkpoint(
        random_gguf(ARGS[arch], 0, mix="k"), weight_quant="gguf", num_blocks=64, block_size=8, **kw
    )
    assert e.model.stack is not None, "every layer is on the integer path: the model runs as a stack"
    return e


def feed(e: TorchEngine, chunks: list[list[int]], seq: int = 0) -> torch.Tensor:
    """The chunks of one sequence forward by forward, all logits of each, concatenated."""
    e.add_sequence(seq, 64)
    return torch.cat([e.forward([ForwardInput(seq, c, len(c))])[0] for c in chunks])


@pytest.mark.parametrize("arch", list(ARGS))
def test_the_stack_gives_what_the_layers_give_one_by_one(arch: str) -> None:
    chunks = [IDS[:20], IDS[20:21], IDS[21:26], IDS[26:27]]
    stacked = engine(arch)
    ours = feed(stacked, chunks)
    by_layer = engine(arch)
    by_layer.model.stack = None  # Transformer.run_layers: GGUFLinear calls and torch ops
    theirs = feed(by_layer, chunks)
    scale = float(theirs.abs().max())
    assert float((ours - theirs).abs().max()) <= 1e-4 * scale
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    assert torch.allclose(
        stacked.kv.k, by_layer.kv.k, rtol=1e-5, atol=1e-5 * float(by_layer.kv.k.abs().max())
    )


@functools.cache
def run_on_copy(isa: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits, keys and values of a prefill, a verify and a decode step on the Q8 copy ``isa``."""
    e = engine()
    e.model.stack.isa = isa
    return feed(e, [IDS[:20], IDS[20:25], IDS[25:26]]), e.kv.k.clone(), e.kv.v.clone()


@pytest.mark.parametrize("isa", q8_copies(512, 256))
def test_each_q8_copy_gives_the_avx2_copys_bits(isa: int) -> None:
    """AVX-512 VNNI and AVX-VNNI against AVX2: a copy this CPU lacks is skipped, never stood in for."""
    require_q8_copy(isa)
    for got, expected in zip(run_on_copy(isa), run_on_copy(2)):
        assert torch.equal(got, expected)


@pytest.mark.parametrize("threads", [1, 3])
def test_the_thread_count_changes_no_bit(threads: int) -> None:
    chunks = [IDS[:17], IDS[17:22], IDS[22:23]]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        expected = feed(engine(), chunks)
        torch.set_num_threads(threads)
        assert torch.equal(feed(engine(), chunks), expected)
    finally:
        torch.set_num_threads(before)


def test_a_sequences_rows_do_not_depend_on_what_shares_the_forward() -> None:
    alone = engine()
    alone.add_sequence(0, 64)
    expected = [
        alone.forward([ForwardInput(0, IDS[:9], 9)])[0],
        alone.forward([ForwardInput(0, IDS[9:13], 4)])[0],
    ]
    shared = engine()
    for seq in (0, 1, 2):
        shared.add_sequence(seq, 64)
    first = shared.forward(
        [ForwardInput(1, IDS[20:31], 3), ForwardInput(0, IDS[:9], 9), ForwardInput(2, [7], 1)]
    )
    second = shared.forward([ForwardInput(2, IDS[30:35], 5), ForwardInput(0, IDS[9:13], 4)])
    assert torch.equal(first[1], expected[0]) and torch.equal(second[1], expected[1])


def test_a_positions_keys_are_the_same_whichever_step_wrote_them() -> None:
    """Prefill of 13 tokens at once, or 4 + a 5-token verify + 4 decode steps: the same cache bits and
    the same last logits."""
    one = engine()
    last_one = feed(one, [IDS[:13]])[-1]
    steps = engine()
    last_steps = feed(steps, [IDS[:4], IDS[4:9], *[[t] for t in IDS[9:13]]])[-1]
    slots = [one.blocks.block_table(0)[p // 8] * 8 + p % 8 for p in range(13)]
    slots_steps = [steps.blocks.block_table(0)[p // 8] * 8 + p % 8 for p in range(13)]
    for a, b in ((one.kv.k, steps.kv.k), (one.kv.v, steps.kv.v)):
        assert torch.equal(a[:, :, slots], b[:, :, slots_steps])
    assert torch.equal(last_one, last_steps)


def test_only_whole_integer_models_run_as_a_stack() -> None:
    legacy = TorchEngine.from_checkpoint(
        random_gguf(ARGS["llama"], 0, mix="legacy"), weight_quant="gguf", num_blocks=64, block_size=8
    )  # Q4_1 / Q5_1 layers stay on the float path
    assert legacy.model.stack is None
    dense = TorchEngine.from_checkpoint(random_gguf(ARGS["llama"], 0, mix="k"), num_blocks=64, block_size=8)
    assert dense.model.stack is None
    sdpa = TorchEngine.from_checkpoint(
        random_gguf(ARGS["llama"], 0, mix="k"),
        weight_quant="gguf",
        num_blocks=64,
        block_size=8,
        attention="sdpa",
    )
    assert sdpa.model.stack is None


def test_a_bad_plan_is_refused() -> None:
    e = engine()
    stack = e.model.stack
    assert isinstance(stack, GGUFLayerStack)
    good = stack.plan
    try:
        stack.plan = good[:-8]
        with pytest.raises(ValueError, match="bad plan"):
            feed(e, [IDS[:3]])
    finally:
        stack.plan = good


def test_a_position_past_the_rope_tables_is_refused() -> None:
    """The stack reads each row's RoPE row from the model's whole tables at its position (its
    attention length - 1): a position the tables do not reach is refused, not read past their end."""
    e = engine()
    e.model.cos, e.model.sin = e.model.cos[:8].contiguous(), e.model.sin[:8].contiguous()
    feed(e, [IDS[:8]])  # positions 0-7: within the tables
    with pytest.raises(ValueError, match="position past the RoPE tables"):
        e.forward([ForwardInput(0, IDS[8:9], 1)])
