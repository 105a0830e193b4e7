"""The sampler and the graph path on a CUDA device, compiled (not interpreted): what CI, on the CPU,
checks under the Triton interpreter, checked again with the kernels Triton compiles for the card and
with CUDA graphs captured and replayed. Run by the device command of docs/gpu.md (``-m device``);
skipped where no CUDA device is (``TRISPEC_DEVICE_TESTS=cpu`` runs them on the CPU, interpreted and
uncaptured, to check the tests themselves).

* the Triton perturbed argmax on the device picks the C kernel's tokens (tokens, not scores: the GPU's
  ``log`` is libdevice's, the C kernel's libm's, last bits apart) at the real vocabularies;
* the graph sampler on the device (kept sets of fixed width, the Triton argmax) picks the eager rule's
  tokens on the host, and its log-probabilities within float32 rounding;
* a captured static step replays the bits of the same step launched eagerly (tokens, sampled tokens,
  log-probabilities and the keys and values it writes), fused and unfused;
* rounds replayed from graphs emit, token for token, what the same rounds run uncaptured emit, greedy
  and sampled, drafted by a model.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest
import torch
from required_builds import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
triton()  # a failure where the test extra installs it, else a skip (required_builds.py)

if torch.cuda.is_available():
    DEVICE = torch.device("cuda")
elif os.environ.get("TRISPEC_DEVICE_TESTS") == "cpu":
    DEVICE = torch.device("cpu")
else:
    DEVICE = None
pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(DEVICE is None, reason="needs a CUDA device (docs/gpu.md, the device run)"),
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),
]
CAPTURE = DEVICE is not None and DEVICE.type == "cuda"


def rows(seed: int, n: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, vocab, generator=g) * 3
    x[0] = (x[0] * 2).round() / 2  # many exact ties
    x[2, ::3] = -math.inf
    return x


@pytest.mark.parametrize("vocab", [152064, 49152, 4099] if CAPTURE else [4099])
def test_the_compiled_argmax_picks_the_c_kernels_tokens(vocab: int) -> None:
    from trispec.sampling import KeptSet, find_kept_sets
    from trispec.sampling.coupled import perturbed_argmax
    from trispec.sampling.triton_argmax import triton_perturbed_argmax

    n = 48 if CAPTURE else 6
    x = rows(vocab, n, vocab)
    top_k = [(0, 40, 0, 5, 1, 0, 1000, 3)[i % 8] for i in range(n)]
    top_p = [(1.0, 1.0, 0.9, 0.5, 1.0, 0.3, 0.95, 1.0)[i % 8] for i in range(n)]
    kept = find_kept_sets(x, top_k, top_p)
    seeds = [(1, 2**63 + 5, 7, 2**64 - 1, 3, 9)[i % 6] + i for i in range(n)]
    positions = [(0, 11, 2**33, 5, 1, 400)[i % 6] + 3 * i for i in range(n)]
    expected = perturbed_argmax(x, kept, seeds, positions)  # the C kernel, on the host
    on_device = KeptSet(kept.threshold.to(DEVICE), kept.ties.to(DEVICE))
    got = triton_perturbed_argmax(x.to(DEVICE), on_device, seeds, positions)
    assert torch.equal(got.cpu(), expected)


def test_the_graph_sampler_on_the_device_picks_the_eager_rules_tokens() -> None:
    from trispec.logits_rules import log_probs_of
    from trispec.sampling import coupled_tokens, logits_to_probs
    from trispec.sampling.graph_sampler import SamplerMode, SamplingRows, choose_tokens
    from trispec.sampling_params import SamplingParams

    params = [
        SamplingParams(),
        SamplingParams(temperature=0.7, seed=3),
        SamplingParams(temperature=1.3, top_k=5, seed=2**64 - 1),
        SamplingParams(temperature=0.5, top_p=0.9, seed=11, return_log_probs=True),
        SamplingParams(temperature=0.9, top_k=40, top_p=0.8, seed=2**63 + 7),
        SamplingParams(return_log_probs=True),
        SamplingParams(temperature=0.8, top_p=0.95, seed=5),
    ]
    n, vocab = len(params), 152064 if CAPTURE else 96
    mode = SamplerMode(noise=True, kept=True, log_probs=True)
    for trial in range(4 if CAPTURE else 1):
        logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(trial)) * 4
        logits[trial % n, ::7] = -math.inf
        positions = [trial * 10 + i for i in range(n)]
        host = SamplingRows.allocate(n, torch.device("cpu"))
        host.stage(list(zip(params, positions)), 1)
        device_rows = SamplingRows.allocate(n, DEVICE)
        device_rows.upload(host)
        tokens, log_probs = choose_tokens(logits.to(DEVICE), logits.argmax(-1).to(DEVICE), device_rows, mode,
                                          flag_unfit=True, kernel="triton")  # fmt: skip
        assert tokens.tolist() == coupled_tokens(logits, params, positions), trial
        assert log_probs is not None
        for i, sp in enumerate(params):
            probs = None if sp.greedy else logits_to_probs(logits[i : i + 1], sp)
            expected = log_probs_of(logits[i : i + 1], sp, [int(tokens[i])], probs)[0]
            assert float(log_probs[i]) == pytest.approx(expected, rel=1e-5, abs=1e-5), (trial, i)


def tiny_engine(name: str, seed: int):  # the bench's tiny shapes: what scripts/triton_aot.py compiles
    from gpu_bench_plan import BLOCK_SIZE, Points, model_args
    from trispec.engine.torch_engine import TorchEngine

    p = Points.of(True)
    dtype = torch.bfloat16 if CAPTURE else torch.float32
    args = model_args(name, True, p.max_context)
    return TorchEngine.from_random(args, seed, dtype=dtype, device=DEVICE, kv_cache_mb=8,
                                   block_size=BLOCK_SIZE, max_context=p.max_context)  # fmt: skip


@pytest.mark.parametrize("fused", [False, True])
def test_a_captured_step_replays_the_bits_of_the_step_launched_eagerly(fused: bool) -> None:
    from gpu_bench_plan import Points
    from trispec.engine.base import ForwardInput
    from trispec.engine.gpu.cuda_graphs import SeqRows, StepGraphs
    from trispec.sampling.graph_sampler import SamplerMode
    from trispec.sampling_params import SamplingParams

    engine, sizes = tiny_engine("7b", 0), Points.of(True).sizes
    prompts = [[3, 5, 7, 11, 13] * 4, [2] * 9, list(range(30, 47))]
    for i, prompt in enumerate(prompts):
        engine.add_sequence(i, engine.max_context)
        engine.forward([ForwardInput(i, prompt, 0)])
        engine.blocks.append(i, 5)
    seqs = [
        SeqRows([1, 2, 3, 4, 5][: 5 - i], len(p), engine.blocks.block_table(i)) for i, p in enumerate(prompts)
    ]
    sp = SamplingParams(temperature=0.7, top_k=20, seed=17, return_log_probs=True)  # fits the device's width
    slots = torch.cat([torch.tensor(s.table).repeat_interleave(engine.block_size) for s in seqs])
    results = {}
    for capture in (False, True) if CAPTURE else (False,):
        for mode in (SamplerMode(), SamplerMode(noise=True, kept=True, log_probs=True)):
            log_probs = torch.zeros(max(sizes), 5, dtype=torch.int64, device=DEVICE)
            graphs = StepGraphs(engine, rows=5, logits=5, sizes=sizes, capture=capture, fused=fused,
                                out_log_probs=log_probs, flag_unfit=True)  # fmt: skip
            graphs.ensure_captured(4, mode)
            b_pad = graphs.stage(seqs)
            graphs.stage_sampling([(sp, len(p)) if mode.noise else None for p in prompts])
            graphs.upload(sampling=True)
            graphs.run(b_pad, mode)
            at = slots.to(DEVICE)
            kv = engine.kv.k_layers[-1][:, at].clone(), engine.kv.v_layers[0][:, at].clone()
            results[(capture, mode.noise)] = (graphs.buffers.out_tokens.clone(), log_probs.clone(), *kv)
    for noise in (False, True):
        eager, replayed = results[(False, noise)], results[(CAPTURE, noise)]
        assert all(torch.equal(a, b) for a, b in zip(eager, replayed)), noise
        assert (eager[0][:3] >= 0).all()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_rounds_replayed_from_graphs_emit_what_the_rounds_run_uncaptured_emit(temperature: float) -> None:
    import gpu_bench_generation as gen
    from trispec.drafters.model_drafter import ModelDrafter
    from trispec.runners.graph_round import GraphRound
    from trispec.sampling_params import SamplingParams

    target, draft = tiny_engine("7b", 0), tiny_engine("0.5b", 1)

    class Run:  # what Generation reads of the bench
        p = type("P", (), {"prompt": 16})()

    outputs = {}
    for capture in (False, True) if CAPTURE else (False,):
        graphs = GraphRound(target, ModelDrafter(draft), max_k=3, sizes=(1, 2, 4), capture=capture)
        sampling = SamplingParams(temperature=temperature, seed=99 if temperature else None)
        g = gen.Generation(graphs, graphs.drafter, gen.prompts(Run, 3, target.vocab_size), sampling)
        try:
            while len(g.output(0)) < 24:
                g.round(3)
        finally:
            g.free()
        outputs[capture] = [g.output(i) for i in range(3)]
    assert outputs[False] == outputs[CAPTURE] and len(outputs[False][0]) >= 24
