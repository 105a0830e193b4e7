"""The static step (engine/gpu/static_step.py) on CPU: the same logits as ``TorchEngine.forward`` for
ragged rows, padding that writes only to the trash block, the Triton kernel (interpreted) in place of
the torch reference, and no host sync or length-dependent shape under ``torch.compile``."""

from __future__ import annotations

import pytest
import torch
from required_builds import triton
from tiny import stage_feeds, tiny_engine
from trispec.engine.base import ForwardInput
from trispec.engine.gpu.cuda_graphs import SeqRows, StepGraphs
from trispec.engine.gpu.static_step import StaticBatch, forward_static, static_attend
from trispec.engine.torch_engine import TorchEngine

# the interpreter turns loop bounds into ints through a deprecated numpy conversion
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning")

PROMPTS = [[1, 2, 3], list(range(10, 26)), [5] * 8]  # 16 tokens: the next one opens block 3 (size 8)
FEEDS = [[7, 8, 9], [4, 4, 4, 4, 4], [1]]  # q_len 3, 5, 1 in a 5-row step
MAX_CONTEXT = 64


def engines(arch: str = "qwen2") -> tuple[TorchEngine, TorchEngine]:
    """Two engines with the same weights and the same prompts cached."""
    pair = (tiny_engine(0, arch, max_context=MAX_CONTEXT), tiny_engine(0, arch, max_context=MAX_CONTEXT))
    for engine in pair:
        for i, prompt in enumerate(PROMPTS):
            engine.add_sequence(i, MAX_CONTEXT)
            engine.forward([ForwardInput(i, prompt, 1)])
    return pair


def staged(
    engine: TorchEngine, feeds: list[list[int]], rows: int = 5, sizes=(1, 2, 4)
) -> tuple[StepGraphs, int]:
    graphs = StepGraphs(engine, rows=rows, logits=rows, sizes=sizes, capture=False)
    return graphs, stage_feeds(engine, graphs, feeds)


def static_logits(engine: TorchEngine, graphs: StepGraphs, b_pad: int, kind: str = "torch") -> torch.Tensor:
    sb = graphs.buffers.prefix(b_pad)
    attend = static_attend(sb, engine.block_size, engine.args.head_dim**-0.5, kind)
    with torch.inference_mode():
        return forward_static(engine.model, engine.kv, sb, attend).float()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_static_step_matches_the_eager_forward(arch: str) -> None:
    engine, reference = engines(arch)
    graphs, b_pad = staged(engine, FEEDS)
    assert b_pad == 4  # three sequences, one padding sequence
    logits = static_logits(engine, graphs, b_pad).view(b_pad, 5, -1)
    expected = reference.forward([ForwardInput(i, f, len(f)) for i, f in enumerate(FEEDS)])
    for i, feed in enumerate(FEEDS):
        assert torch.allclose(logits[i, : len(feed)], expected[i], atol=1e-5, rtol=1e-4)
        assert graphs.buffers.out_tokens[i, : len(feed)].tolist() == expected[i].argmax(-1).tolist()
    # the keys and values it wrote are the eager forward's, slot by slot
    for i in range(len(FEEDS)):
        assert engine.blocks.block_table(i) == reference.blocks.block_table(i)
    used = engine.blocks.num_blocks * engine.block_size
    assert torch.allclose(engine.kv.k[:, :, :used], reference.kv.k[:, :, :used], atol=1e-5)


def test_padding_rows_write_only_to_the_trash_block() -> None:
    engine, _ = engines()
    before_k, before_v = engine.kv.k.clone(), engine.kv.v.clone()
    graphs, b_pad = staged(engine, FEEDS)
    static_logits(engine, graphs, b_pad)
    BS = engine.block_size
    written = {
        slot for i, f in enumerate(FEEDS) for slot in graphs.host.slots[i * 5 : i * 5 + len(f)].tolist()
    }
    trash = set(range(engine.trash_block * BS, (engine.trash_block + 1) * BS))
    changed = ((engine.kv.k != before_k) | (engine.kv.v != before_v)).any(-1).any(1).any(0)
    changed_slots = set(changed.nonzero().flatten().tolist())
    assert changed_slots - trash == written  # every real row wrote its slot, nothing else but trash
    assert changed_slots & trash  # the padding rows did write (to the trash block)


def test_static_step_with_the_triton_kernel_matches_the_reference() -> None:
    triton()  # a failure where the test extra installs it, else a skip (required_builds.py)
    engine, twin = engines()
    graphs, b_pad = staged(engine, FEEDS)
    twin_graphs, _ = staged(twin, FEEDS)
    kernel = static_logits(engine, graphs, b_pad, "triton").view(b_pad, 5, -1)
    reference = static_logits(twin, twin_graphs, b_pad, "torch").view(b_pad, 5, -1)
    for i, feed in enumerate(FEEDS):
        assert torch.allclose(kernel[i, : len(feed)], reference[i, : len(feed)], atol=1e-4, rtol=1e-4)


def test_compiled_step_has_no_host_sync_and_no_length_dependent_shape() -> None:
    """``fullgraph=True`` fails on ``.item()``/``.tolist()`` and data-dependent branches; the backend
    below also refuses a device transfer inside the graph (a ``.cpu()``); ``fail_on_recompile`` fails
    if a second step with other lengths, block tables and positions needed another graph."""
    engine, _ = engines()
    graphs = StepGraphs(engine, rows=5, logits=5, sizes=(4,), capture=False)
    sb = graphs.buffers.prefix(4)
    attend = static_attend(sb, engine.block_size, engine.args.head_dim**-0.5, "torch")
    captured: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        captured.append(gm)
        return gm.forward

    @torch.compile(backend=backend, fullgraph=True, dynamic=False)
    def step(sb: StaticBatch) -> torch.Tensor:
        return forward_static(engine.model, engine.kv, sb, attend)

    for round_, feeds in enumerate([FEEDS, [[3], [2, 2], [9, 9, 9, 9]], [[1, 2, 3, 4, 5], [6], [7]]]):
        seqs = []
        for i, feed in enumerate(feeds):
            start = engine.cached_length(i)
            engine.blocks.append(i, len(feed))
            seqs.append(SeqRows(feed, start, engine.blocks.block_table(i)))
        graphs.stage(seqs)
        graphs.upload()
        with torch.inference_mode(), torch.compiler.set_stance("fail_on_recompile" if round_ else "default"):
            step(sb)
    assert len(captured) == 1
    assert not [n for n in captured[0].graph.nodes if moves_to_host(n)]


def moves_to_host(node: torch.fx.Node) -> bool:
    if node.op != "call_method":
        return False
    if node.target in ("item", "tolist", "cpu", "numpy"):
        return True
    devices = [*node.args[1:], *node.kwargs.values()]
    return node.target == "to" and any(isinstance(a, (str, torch.device)) for a in devices)
