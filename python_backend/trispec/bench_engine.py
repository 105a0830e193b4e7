"""Engine micro-benchmark on SmolLM2-135M (``specdec-bench-engine``).

Prints, in one run: the fp32 1-token decode step, the 5-token verify step (one sequence, logits for
all 5) and their ratio; the 1-token draft step of the self-draft variants (bf16 copy, int8
weight-only); and greedy tokens/s of our engine vs HF transformers' ``generate`` on the same GGUF
weights in fp32. Every number is the median of ``--reps`` timed runs after warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trispec.engine.base import ForwardInput
from trispec.engine.torch_engine import TorchEngine

# A chat-formatted prompt in SmolLM2's tokenizer ("What is the capital of France?").
PROMPT = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]


def median_time(fn: Callable[[], object], reps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def step_ms(engine: TorchEngine, num_tokens: int, reps: int, context: list[int]) -> float:
    """Time of one forward of ``num_tokens`` new tokens (all logits) after ``context``; rolled back."""
    sid = 1_000_000
    engine.add_sequence(sid, len(context) + num_tokens)
    engine.forward([ForwardInput(sid, context, 1)])
    drafts = [(7 * i + 11) % engine.vocab_size for i in range(num_tokens)]

    def step() -> None:
        engine.forward([ForwardInput(sid, drafts, num_tokens)])
        engine.truncate(sid, len(context))

    try:
        return median_time(step, reps, warmup=3) * 1e3
    finally:
        engine.free(sid)


def greedy(engine: TorchEngine, prompt: list[int], new_tokens: int) -> list[int]:
    """Plain greedy decoding through ``engine.forward`` (prefill, then one token per step)."""
    sid = 2_000_000
    engine.add_sequence(sid, len(prompt) + new_tokens)
    try:
        out: list[int] = []
        logits = engine.forward([ForwardInput(sid, prompt, 1)])[0]
        for i in range(new_tokens):
            out.append(int(logits[-1].argmax()))
            if i + 1 < new_tokens:
                logits = engine.forward([ForwardInput(sid, out[-1:], 1)])[0]
        return out
    finally:
        engine.free(sid)


def hf_greedy_fn(path: Path, prompt: list[int], new_tokens: int) -> Callable[[], list[int]]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    ids = torch.tensor([prompt])

    def run() -> list[int]:
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=2,
            )
        return out[0, len(prompt) :].tolist()

    return run


def run(
    checkpoint: Path, *, threads: int, reps: int, new_tokens: int, with_hf: bool, log: Callable[[str], None]
) -> dict[str, Any]:
    torch.set_num_threads(threads)
    from trispec.engine.weights import load_checkpoint

    args, state_dict = load_checkpoint(checkpoint)
    res: dict[str, Any] = {"checkpoint": str(checkpoint), "threads": threads, "reps": reps}
    context = PROMPT * 2  # 32 tokens of context for the step timings

    target = TorchEngine.from_state_dict(args, state_dict, kv_cache_mb=64)
    res["decode_1tok_ms"] = step_ms(target, 1, reps * 4, context)
    log(f"target fp32   decode step (1 token) : {res['decode_1tok_ms']:8.2f} ms")
    res["verify_5tok_ms"] = step_ms(target, 5, reps * 4, context)
    log(f"target fp32   verify step (5 tokens): {res['verify_5tok_ms']:8.2f} ms")
    res["verify_decode_ratio"] = res["verify_5tok_ms"] / res["decode_1tok_ms"]
    log(f"verify / decode ratio               : {res['verify_decode_ratio']:8.2f}   (goal <= 1.3)")

    for name, kw in (("bf16", {"dtype": "bfloat16"}), ("int8", {"weight_quant": "int8"})):
        draft = TorchEngine.from_state_dict(args, state_dict, kv_cache_mb=16, **kw)
        res[f"draft_{name}_1tok_ms"] = step_ms(draft, 1, reps * 4, context)
        log(f"self-draft {name:5s} draft step (1 token) : {res[f'draft_{name}_1tok_ms']:8.2f} ms")
        del draft

    ours_tokens: list[int] = []

    def ours() -> None:
        ours_tokens[:] = greedy(target, PROMPT, new_tokens)

    t = median_time(ours, reps, warmup=1)
    res["ours_greedy_tok_s"] = new_tokens / t
    log(f"ours greedy ({new_tokens} new tokens, incl. prefill): {res['ours_greedy_tok_s']:8.2f} tok/s")
    if with_hf:
        hf = hf_greedy_fn(checkpoint, PROMPT, new_tokens)
        hf_tokens: list[int] = []

        def theirs() -> None:
            hf_tokens[:] = hf()

        t = median_time(theirs, reps, warmup=1)
        res["hf_greedy_tok_s"] = new_tokens / t
        res["ours_vs_hf"] = res["ours_greedy_tok_s"] / res["hf_greedy_tok_s"]
        same = next((i for i, (a, b) in enumerate(zip(ours_tokens, hf_tokens, strict=True)) if a != b), None)
        res["greedy_tokens_match"] = same is None
        log(f"HF generate  ({new_tokens} new tokens, incl. prefill): {res['hf_greedy_tok_s']:8.2f} tok/s")
        log(f"ours / HF                            : {res['ours_vs_hf']:8.2f}   (goal >= 1)")
        log(
            f"greedy tokens identical to HF        : {same is None}"
            + ("" if same is None else f" (first diff {same})")
        )
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="specdec-bench-engine", description=__doc__.split("\n")[0])
    p.add_argument(
        "--checkpoint", type=Path, default=None, help="GGUF file or HF dir (default: SmolLM2-135M)"
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=5, help="timed repetitions of each generate (x4 for steps)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--no-hf", action="store_true", help="skip the HF transformers comparison")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    a = p.parse_args(argv)
    if a.checkpoint is None:
        from trispec.checkpoints import smollm2_gguf

        a.checkpoint = smollm2_gguf()
    log = (lambda _s: None) if a.json else (lambda s: print(s, flush=True))
    res = run(
        a.checkpoint, threads=a.threads, reps=a.reps, new_tokens=a.new_tokens, with_hf=not a.no_hf, log=log
    )
    if a.json:
        print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
