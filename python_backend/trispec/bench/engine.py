"""Engine micro-benchmark on SmolLM2-135M (``specdec-bench-engine``).

Prints, in one run: the fp32 1-token decode step, the 5-token verify step (one sequence, logits for
all 5) and their ratio, and for a GGUF checkpoint the same steps on its own blocks (``weights:
gguf``); the rate at which the decode step reads the weights, beside the rate ``torch.sum`` reads a
buffer larger than any cache (how close decoding runs to the memory's speed, which bounds it); the
1-token draft step of the self-draft variants (bf16 copy, int8 weight-only); and greedy tokens/s of
our engine (dense, and on the blocks) vs HF transformers' ``generate`` on the same GGUF weights in
fp32.

Every number is the median of the timed repetitions after warm-up. The things being compared are
timed *interleaved* (decode, verify, draft steps in turn; ours and HF's generate in turn) so that a
noisy neighbour on a small machine slows both sides alike instead of skewing a ratio.
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
from trispec.errors import ConfigError

# A chat-formatted prompt in SmolLM2's tokenizer ("What is the capital of France?").
PROMPT = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]


def interleaved_medians(fns: dict[str, Callable[[], object]], reps: int, warmup: int) -> dict[str, float]:
    """Median seconds of each function, the functions called in turn, ``reps`` rounds."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


# Bigger than any CPU cache here (the 2-core VMs report up to 105 MB of L3), small beside the models.
STREAM_PROBE_BYTES = 512 * 1024 * 1024


class StepTimer:
    """One sequence holding ``context``; ``step(n)`` forwards n new tokens (all logits), rolls back."""

    def __init__(self, engine: TorchEngine, context: list[int], max_new: int, seq_id: int) -> None:
        self.engine, self.context, self.sid = engine, context, seq_id
        engine.add_sequence(seq_id, len(context) + max_new)
        engine.forward([ForwardInput(seq_id, context, 1)])

    def step(self, n: int) -> Callable[[], None]:
        drafts = [(7 * i + 11) % self.engine.vocab_size for i in range(n)]

        def run() -> None:
            self.engine.forward([ForwardInput(self.sid, drafts, n)])
            self.engine.truncate(self.sid, len(self.context))

        return run

    def close(self) -> None:
        self.engine.free(self.sid)


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
    # No EOS: both sides generate exactly ``new_tokens`` tokens of plain argmax (min_new_tokens
    # would instead suppress EOS and make the two greedy sequences differ).
    model.generation_config.eos_token_id = None

    def run() -> list[int]:
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=new_tokens,
                pad_token_id=2,
            )
        return out[0, len(prompt) :].tolist()

    return run


def run(
    checkpoint: Path,
    *,
    threads: int,
    reps: int,
    new_tokens: int,
    with_hf: bool,
    log: Callable[[str], None],
) -> dict[str, Any]:
    torch.set_num_threads(threads)
    from trispec.engine.weights import load_checkpoint

    args, state_dict = load_checkpoint(checkpoint)
    res: dict[str, Any] = {"checkpoint": str(checkpoint), "threads": threads, "reps": reps}
    context = PROMPT * 2  # 32 tokens of context for the step timings

    target = TorchEngine.from_state_dict(args, state_dict, kv_cache_mb=64)
    bf16 = TorchEngine.from_state_dict(args, state_dict, kv_cache_mb=16, dtype="bfloat16")
    int8 = TorchEngine.from_state_dict(args, state_dict, kv_cache_mb=16, weight_quant="int8")
    # a GGUF checkpoint also runs on its own blocks (weights: gguf): the same values, fewer bytes
    blocks = None
    if getattr(state_dict, "has_blocks", False):
        blocks = TorchEngine.from_state_dict(args, state_dict, kv_cache_mb=64, weight_quant="gguf")
    engines = [e for e in (target, bf16, int8, blocks) if e is not None]
    timers = [StepTimer(e, context, 5, seq_id=1_000_000) for e in engines]
    probe = torch.ones(STREAM_PROBE_BYTES // 4)
    steps = {
        "decode_1tok": timers[0].step(1),
        "verify_5tok": timers[0].step(5),
        "draft_bf16_1tok": timers[1].step(1),
        "draft_int8_1tok": timers[2].step(1),
        "stream_probe": probe.sum,
    }
    if blocks is not None:
        steps["gguf_decode_1tok"], steps["gguf_verify_5tok"] = timers[3].step(1), timers[3].step(5)
    ms = {k: v * 1e3 for k, v in interleaved_medians(steps, reps * 4, warmup=3).items()}
    for t in timers:
        t.close()
    del bf16, int8, probe, steps  # the steps hold the probe
    stream_ms = ms.pop("stream_probe")
    res.update({f"{k}_ms": v for k, v in ms.items()})
    res["verify_decode_ratio"] = ms["verify_5tok"] / ms["decode_1tok"]
    res["decode_weights_gb_s"] = target.model.streamed_bytes / ms["decode_1tok"] / 1e6
    res["stream_probe_gb_s"] = STREAM_PROBE_BYTES / stream_ms / 1e6
    log(f"target fp32       decode step (1 token) : {ms['decode_1tok']:8.2f} ms")
    log(f"target fp32       verify step (5 tokens): {ms['verify_5tok']:8.2f} ms")
    log(f"verify / decode ratio                   : {res['verify_decode_ratio']:8.2f}    (goal <= 1.3)")
    log(f"decode step reads its weights at        : {res['decode_weights_gb_s']:8.2f} GB/s")
    log(
        f"torch.sum reads 512 MiB at              : {res['stream_probe_gb_s']:8.2f} GB/s (memory, to compare)"
    )
    log(f"self-draft bf16   draft step (1 token)  : {ms['draft_bf16_1tok']:8.2f} ms")
    log(f"self-draft int8   draft step (1 token)  : {ms['draft_int8_1tok']:8.2f} ms")
    if blocks is not None:
        res["gguf_verify_decode_ratio"] = ms["gguf_verify_5tok"] / ms["gguf_decode_1tok"]
        res["gguf_decode_weights_gb_s"] = blocks.model.streamed_bytes / ms["gguf_decode_1tok"] / 1e6
        log(f"target gguf       decode step (1 token) : {ms['gguf_decode_1tok']:8.2f} ms")
        log(f"target gguf       verify step (5 tokens): {ms['gguf_verify_5tok']:8.2f} ms")
        log(f"gguf decode step reads its blocks at    : {res['gguf_decode_weights_gb_s']:8.2f} GB/s")

    tokens: dict[str, list[int]] = {}

    def ours() -> None:
        tokens["ours"] = greedy(target, PROMPT, new_tokens)

    gens: dict[str, Callable[[], object]] = {"ours": ours}
    if blocks is not None:

        def ours_gguf() -> None:
            tokens["ours_gguf"] = greedy(blocks, PROMPT, new_tokens)

        gens["ours_gguf"] = ours_gguf
    if with_hf:
        hf = hf_greedy_fn(checkpoint, PROMPT, new_tokens)

        def theirs() -> None:
            tokens["hf"] = hf()

        gens["hf"] = theirs
    secs = interleaved_medians(gens, reps, warmup=1)
    res["ours_greedy_tok_s"] = new_tokens / secs["ours"]
    log(f"ours greedy   ({new_tokens} new tokens, incl. prefill): {res['ours_greedy_tok_s']:8.2f} tok/s")
    if blocks is not None:
        res["ours_gguf_greedy_tok_s"] = new_tokens / secs["ours_gguf"]
        res["gguf_tokens_match_dense"] = tokens["ours_gguf"] == tokens["ours"]
        tok_s = res["ours_gguf_greedy_tok_s"]
        log(f"ours gguf     ({new_tokens} new tokens, incl. prefill): {tok_s:8.2f} tok/s")
        log(f"gguf greedy tokens identical to dense   : {res['gguf_tokens_match_dense']}")
    if with_hf:
        res["hf_greedy_tok_s"] = new_tokens / secs["hf"]
        res["ours_vs_hf"] = res["ours_greedy_tok_s"] / res["hf_greedy_tok_s"]
        diff = [i for i, (a, b) in enumerate(zip(tokens["ours"], tokens["hf"], strict=True)) if a != b]
        res["greedy_tokens_match"] = not diff
        log(f"HF generate   ({new_tokens} new tokens, incl. prefill): {res['hf_greedy_tok_s']:8.2f} tok/s")
        log(f"ours / HF                               : {res['ours_vs_hf']:8.2f}    (goal >= 1)")
        if blocks is not None:
            res["ours_gguf_vs_hf"] = res["ours_gguf_greedy_tok_s"] / res["hf_greedy_tok_s"]
            log(f"ours gguf / HF                          : {res['ours_gguf_vs_hf']:8.2f}")
        log(
            f"greedy tokens identical to HF           : {not diff}"
            + (f" (first diff {diff[0]})" if diff else "")
        )
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="specdec-bench-engine", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", type=Path, default=None, help="GGUF or HF dir (default: SmolLM2-135M)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=5, help="timed generate runs (steps: 4x as many)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--no-hf", action="store_true", help="skip the HF transformers comparison")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    a = p.parse_args(argv)
    if a.threads < 1 or a.reps < 1 or a.new_tokens < 1:
        raise SystemExit("--threads, --reps and --new-tokens must be >= 1")
    if a.checkpoint is None:
        from trispec.checkpoints import smollm2_gguf

        a.checkpoint = smollm2_gguf()
    log = (lambda _s: None) if a.json else (lambda s: print(s, flush=True))
    try:
        res = run(
            a.checkpoint,
            threads=a.threads,
            reps=a.reps,
            new_tokens=a.new_tokens,
            with_hf=not a.no_hf,
            log=log,
        )
    except ConfigError as exc:
        raise SystemExit(f"config error: {exc}") from None
    if a.json:
        print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
