"""The fused static step (engine/gpu/fused_step.py, its Triton kernels run by the interpreter on CPU)
against the unfused static step on the same weights: logits and argmax, the keys and values written
slot by slot, padding rows writing only to the trash block; qwen2 (QKV bias) and llama shapes, GQA 7
and 6, q_len 1 to 5 in a 5-row step with padding sequences, and the draft's 2-row step with one
logit row; float32 to float32 rounding, bfloat16 to bfloat16's; and the kernels each step issues
per layer (launch_count.py)."""

from __future__ import annotations

import pytest
import torch
from required_builds import triton
from tiny import (
    byte_tokenizer,
    reference_greedy,
    repeating_prompts,
    run_to_completion,
    stage_feeds,
    tiny_args,
    tiny_engine,
    tokens_of,
)
from trispec.config import SchedulerConfig
from trispec.detokenize import StopTextTracker
from trispec.drafters.model_drafter import ModelDrafter
from trispec.engine.base import ForwardInput
from trispec.engine.cpu import linear
from trispec.engine.gpu.cuda_graphs import StepGraphs
from trispec.engine.gpu.launch_count import LaunchCounter, per_layer
from trispec.engine.gpu.static_step import forward_static, static_attend
from trispec.engine.torch_engine import TorchEngine
from trispec.llm_engine import LLMEngine
from trispec.request import GenerationRequest
from trispec.runners.graph_round import GraphRound
from trispec.runners.torch_runner import TorchSpecRunner
from trispec.scheduler import Scheduler

triton()  # a failure where the test extra installs it, else a skip (required_builds.py)
# the interpreter turns loop bounds into ints through a deprecated numpy conversion
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning")

# 16 tokens: the next one opens block 3 (size 8)
PROMPTS = [[1, 2, 3], list(range(10, 26)), [5] * 8, [9, 8, 7, 6, 5, 4, 3], [3] * 12]
# q_len 3, 5, 1, 2, 4 in a 5-row step (k = 4); padded to 8 sequences
FEEDS = [[7, 8, 9], [4, 4, 4, 4, 4], [1], [2, 3], [6, 6, 6, 6]]
DRAFT_FEEDS = [[7, 8], [4], [2, 3]]  # the draft's first step: 2 rows, the last fed one's logits
MAX_CONTEXT = 64


def engine(arch: str, heads: int, dtype: torch.dtype = torch.float32) -> TorchEngine:
    args = tiny_args(arch, num_heads=heads, num_kv_heads=2)
    e = TorchEngine.from_random(args, 0, max_context=MAX_CONTEXT, dtype=dtype, num_blocks=256, block_size=8)
    for i, prompt in enumerate(PROMPTS):
        e.add_sequence(i, MAX_CONTEXT)
        e.forward([ForwardInput(i, prompt, 1)])
    return e


def step(
    e: TorchEngine,
    feeds: list[list[int]],
    fused: bool,
    *,
    rows: int = 5,
    logits: int = 5,
    kind: str = "torch",
) -> tuple[torch.Tensor, torch.Tensor, StepGraphs, list[str]]:
    """One static step (``StepGraphs``, not captured): float32 logits ``[B, logits, V]``, the argmax
    tokens, the graphs (staged slots) and the kernels it issued."""
    graphs = StepGraphs(e, rows=rows, logits=logits, sizes=(8,), capture=False, attention=kind, fused=fused)
    b_pad = stage_feeds(e, graphs, feeds)
    sb = graphs.buffers.prefix(b_pad)
    attend = static_attend(sb, e.block_size, e.args.head_dim**-0.5, kind)
    with torch.inference_mode(), LaunchCounter() as counter:
        out = forward_static(e.model, e.kv, sb, attend, fused=fused)
    return out.float().view(b_pad, logits, -1), sb.out_tokens.clone(), graphs, counter.names


def same_kv(a: TorchEngine, b: TorchEngine) -> bool:
    return torch.allclose(a.kv.k, b.kv.k, atol=1e-5) and torch.allclose(a.kv.v, b.kv.v, atol=1e-5)


def written_slots(e: TorchEngine, k: torch.Tensor, v: torch.Tensor) -> set[int]:
    changed = ((e.kv.k != k) | (e.kv.v != v)).any(-1).any(1).any(0)
    return set(changed.nonzero().flatten().tolist())


SHAPES = [pytest.param("qwen2", 14, id="qwen2-gqa7"), pytest.param("llama", 12, id="llama-gqa6")]


@pytest.mark.parametrize(("arch", "heads"), SHAPES)
def test_fused_step_matches_the_unfused_step(arch: str, heads: int) -> None:
    fused_e, plain_e = engine(arch, heads), engine(arch, heads)
    before = fused_e.kv.k.clone(), fused_e.kv.v.clone()
    logits, tokens, graphs, _ = step(fused_e, FEEDS, True)
    expected, expected_tokens, _, _ = step(plain_e, FEEDS, False)
    for i, feed in enumerate(FEEDS):
        assert torch.allclose(logits[i, : len(feed)], expected[i, : len(feed)], atol=1e-5, rtol=1e-4)
        assert tokens[i, : len(feed)].tolist() == expected_tokens[i, : len(feed)].tolist()
    # the same slots written with the same keys and values (float32 rounding)
    assert same_kv(fused_e, plain_e)
    BS = fused_e.block_size
    real = {slot for i, f in enumerate(FEEDS) for slot in graphs.host.slots[i * 5 : i * 5 + len(f)].tolist()}
    trash = set(range(fused_e.trash_block * BS, (fused_e.trash_block + 1) * BS))
    changed = written_slots(fused_e, *before)
    assert changed - trash == real and changed & trash  # padding rows wrote only to the trash block


def test_fused_draft_step_with_the_triton_attention() -> None:
    """The draft's first step shape (2 rows, logits of the last fed one: the final norm gathers
    rows), with the interpreted attention kernel in both steps."""
    fused_e, plain_e = engine("qwen2", 14), engine("qwen2", 14)
    logits, tokens, _, _ = step(fused_e, DRAFT_FEEDS, True, rows=2, logits=1, kind="triton")
    expected, expected_tokens, _, _ = step(plain_e, DRAFT_FEEDS, False, rows=2, logits=1, kind="triton")
    n = len(DRAFT_FEEDS)
    assert torch.allclose(logits[:n], expected[:n], atol=1e-5, rtol=1e-4)
    assert tokens[:n].tolist() == expected_tokens[:n].tolist()
    assert same_kv(fused_e, plain_e)


def test_fused_bf16_step_is_within_bf16_rounding_of_the_unfused_one() -> None:
    """In bfloat16 the two steps round in different places (the norm's sum, the QKV bias): the fused
    step is within a few bf16 steps of the unfused one, and no farther from float32 than it is."""
    bf16 = torch.bfloat16
    fused_e, plain_e, exact_e = (engine("qwen2", 14, d) for d in (bf16, bf16, torch.float32))
    before = fused_e.kv.k.clone(), fused_e.kv.v.clone()
    plain_before = plain_e.kv.k.clone(), plain_e.kv.v.clone()
    logits, _, _, _ = step(fused_e, FEEDS, True)
    expected, _, _, _ = step(plain_e, FEEDS, False)
    exact, _, _, _ = step(exact_e, FEEDS, False)
    for i, feed in enumerate(FEEDS):
        fused, plain, ref = logits[i, : len(feed)], expected[i, : len(feed)], exact[i, : len(feed)]
        assert (fused - plain).abs().max() <= 2**-5 * plain.abs().max()
        assert (fused - ref).abs().max() <= 2 * (plain - ref).abs().max()
    assert written_slots(fused_e, *before) == written_slots(plain_e, *plain_before)
    for new, old in ((fused_e.kv.k, plain_e.kv.k), (fused_e.kv.v, plain_e.kv.v)):
        assert (new.float() - old.float()).abs().max() <= 2**-5 * old.float().abs().max()


def test_kernels_per_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """What each step issues (bf16, as on the GPU): the unfused layer 16 kernels as counted here
    (on CUDA one more at one row: cuBLAS copies the QKV bias before the GEMM), the fused layer 9;
    split-KV attention adds its merge to both. The linears are plain ``F.linear`` as on CUDA: the
    CPU's oneDNN packing widens bf16 to float32 where the CPU lacks native bf16, two casts a GEMM."""
    monkeypatch.setattr(linear, "_onednn_linear", None)
    e = engine("qwen2", 14, torch.bfloat16)
    counts = {}
    for fused in (False, True):
        names = step(e, [[7]], fused, rows=1, logits=1, kind="triton")[3]  # a one-token decode
        e.truncate(0, e.cached_length(0) - 1)
        counts[fused] = per_layer(names, e.args.num_layers)
    assert counts == {False: (16.0, 9), True: (9.0, 3)}


def test_rounds_on_the_fused_step_emit_target_greedy() -> None:
    """``GraphRound(fused=True)``: the draft's first and next steps (its prologue advancing on the
    device) and the verify on the fused layers; the output is target-only greedy decoding's."""
    target = tiny_engine(0, max_context=64)
    drafter = ModelDrafter(tiny_engine(7, max_context=64))
    graphs = GraphRound(target, drafter, max_k=2, sizes=(2,), capture=False, fused=True)
    runner = TorchSpecRunner(target, drafter, graphs)
    config = SchedulerConfig(max_num_draft_tokens=2, default_num_draft_tokens=2, adaptive_speculation=False)
    scheduler = Scheduler(runner, config, encode=lambda text: [], eos_ids=frozenset(),
                          make_text_tracker=lambda stop: StopTextTracker(byte_tokenizer(), stop))  # fmt: skip
    llm = LLMEngine(scheduler, runner)
    prompts = repeating_prompts(2, seed=5)
    ids = [
        llm.add_request(GenerationRequest(prompt_token_ids=p, max_tokens=6, num_draft_tokens=2))
        for p in prompts
    ]
    outputs = run_to_completion(llm)
    assert runner.graph_rounds > 0 and runner.eager_rounds == 0
    for rid, prompt in zip(ids, prompts, strict=True):
        assert tokens_of(outputs[rid]) == reference_greedy(prompt, 6)


def test_an_embedding_id_outside_the_table_reads_a_zero_row() -> None:
    """The fused embedding load is bounds-checked: an id past the table (or negative) reads nothing
    and gives a zero row (and a zero norm), where an unchecked load would read other memory."""
    from trispec.engine.gpu.fused_kernels import add_rms_norm

    table = torch.randn(6, 32, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([0, 6, 5, -1, 1 << 40, 3])
    residual = torch.full((6, 32), float("nan"))
    normed = add_rms_norm(table, 1e-6, rows=ids, residual=residual)
    inside = torch.tensor([0, 2, 5])
    assert torch.equal(residual[inside], table[ids[inside]])
    assert torch.allclose(normed[inside], torch.nn.functional.rms_norm(table[ids[inside]], (32,), eps=1e-6))
    outside = torch.tensor([1, 3, 4])
    assert not residual[outside].any() and not normed[outside].any()
