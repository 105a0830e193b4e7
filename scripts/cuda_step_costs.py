"""Step costs of the torch engine on random weights of real Qwen2.5 shapes, on CUDA where there is one
(the device check of issue 11: weights cannot travel to the GPU machine, shapes can).

    python3 scripts/cuda_step_costs.py qwen2.5-0.5b,qwen2.5-7b bfloat16

Prints one JSON line per model: milliseconds per forward of B sequences x n new tokens (``b8_n5``: 8
sequences, 5 tokens each, i.e. a k = 4 verify), medians of 20 interleaved rounds after 3 warm-ups, and
plain greedy tok/s (run0 is cold).
"""

import json
import sys
import time

import torch

sys.path.insert(0, "python_backend")
from trispec.bench.engine import greedy, interleaved_medians
from trispec.engine.args import ModelArgs
from trispec.engine.base import ForwardInput
from trispec.engine.torch_engine import TorchEngine

SHAPES = {
    "qwen2.5-0.5b": dict(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        head_dim=64,
        tie_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        head_dim=128,
        tie_embeddings=True,
    ),
    "qwen2.5-7b": dict(
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        head_dim=128,
        tie_embeddings=False,
    ),
}
names = sys.argv[1].split(",")
dtype = sys.argv[2] if len(sys.argv) > 2 else "bfloat16"
dev = "cuda" if torch.cuda.is_available() else "cpu"
out = {
    "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
    "torch": torch.__version__,
    "dtype": dtype,
}
print(json.dumps(out), flush=True)
CTX = 128


def batch_step(engine, sids, n):
    drafts = [(7 * i + 11) % engine.vocab_size for i in range(n)]

    def run():
        engine.forward([ForwardInput(s, drafts, n) for s in sids])
        for s in sids:
            engine.truncate(s, CTX)

    return run


for name in names:
    t0 = time.perf_counter()
    args = ModelArgs(
        arch="qwen2",
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        attention_bias=True,
        max_position_embeddings=4096,
        **SHAPES[name],
    )
    eng = TorchEngine.from_random(args, 0, dtype=dtype, device=dev, kv_cache_mb=2048, max_context=1024)
    load_s = time.perf_counter() - t0
    row = {"model": name, "load_s": round(load_s, 1)}
    for B in (1, 8, 32):
        sids = list(range(B))
        for s in sids:
            eng.add_sequence(s, CTX + 16)
            eng.forward([ForwardInput(s, [(13 * i + s) % 1000 for i in range(CTX)], 1)])
        med = interleaved_medians({f"b{B}_n{n}": batch_step(eng, sids, n) for n in (1, 3, 5, 9)}, 20, 3)
        row.update({k: round(v * 1e3, 3) for k, v in med.items()})
        for s in sids:
            eng.free(s)
    for rep in range(3):
        if dev == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        toks = greedy(eng, [(5 * i) % 1000 for i in range(64)], 64)
        g = time.perf_counter() - t
        row[f"greedy64_tok_s_run{rep}"] = round(64 / g, 1)
    sid = 3_000_000
    eng.add_sequence(sid, 200)
    eng.forward([ForwardInput(sid, list(range(64)), 1)])
    t = time.perf_counter()
    for i in range(64):
        eng.forward([ForwardInput(sid, [i + 5], 1)])
    row["decode64_no_truncate_ms_per_step"] = round((time.perf_counter() - t) / 64 * 1e3, 2)
    eng.free(sid)
    row["greedy_tokens_head"] = toks[:8]
    print(json.dumps(row), flush=True)
    del eng
    if dev == "cuda":
        torch.cuda.empty_cache()
