"""``specdec-bench``: speculative vs plain decoding through the real in-flight batcher, in one run.

For each batch size, the same prompts run with plain decoding (k = 0, same loop), with each drafter
at a fixed k, and with the first drafter under adaptive speculation (the default). It prints
generated tokens/s, the speed-up over plain, acceptance and mean accepted length, and checks that
greedy outputs are identical to plain. Not a test: these machines are noisy; the ratios measured
in one run are what count.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

import torch

from trispec.checkpoints import cache_dir, smollm2_gguf
from trispec.config import SchedulerConfig
from trispec.detokenize import StopTextTracker
from trispec.drafters.base import Drafter
from trispec.drafters.model_drafter import ModelDrafter
from trispec.drafters.ngram import NgramDrafter
from trispec.engine.gguf_tokenizer import load_tokenizer_for_gguf
from trispec.engine.torch_engine import TorchEngine
from trispec.engine.weights import load_checkpoint
from trispec.llm_engine import LLMEngine
from trispec.request import GenerationRequest
from trispec.runners.torch_runner import TorchSpecRunner
from trispec.scheduler import Scheduler

PROMPTS = [
    "Explain why the sky is blue.",
    "Write a Python function that checks whether a number is prime.",
    "What are three tips for staying focused while studying?",
    "Summarise the plot of Romeo and Juliet in a few sentences.",
    "How do I reverse a list in Python?",
    "Give me a short recipe for tomato soup.",
    "What is the difference between a list and a tuple in Python?",
    "Describe the water cycle.",
]


def run(
    engine: LLMEngine, prompts: list[list[int]], k: int, max_tokens: int
) -> tuple[float, list[list[int]]]:
    ids = [
        engine.add_request(GenerationRequest(prompt_token_ids=p, max_tokens=max_tokens, num_draft_tokens=k))
        for p in prompts
    ]
    out: dict[int, list[int]] = {i: [] for i in ids}
    start = time.perf_counter()
    while engine.has_work():
        for o in engine.step():
            out[o.request_id].extend(o.new_token_ids)
    return time.perf_counter() - start, [out[i] for i in ids]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specdec-bench", description=__doc__)
    parser.add_argument("--batch-sizes", default="1,8", help="comma-separated")
    parser.add_argument("--num-draft-tokens", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--drafters", default="self-int8,self-bf16,ngram", help="the first also runs adaptive"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    gguf = smollm2_gguf()
    tokenizer = load_tokenizer_for_gguf(gguf, cache_dir())
    model_args, state_dict = load_checkpoint(gguf)
    target = TorchEngine.from_state_dict(model_args, state_dict, dtype="float32", kv_cache_mb=512)
    factories: dict[str, Callable[[], Drafter]] = {
        "self-bf16": lambda: ModelDrafter(
            TorchEngine.from_state_dict(model_args, state_dict, dtype="bfloat16")
        ),
        "self-int8": lambda: ModelDrafter(
            TorchEngine.from_state_dict(model_args, state_dict, weight_quant="int8")
        ),
        "ngram": lambda: NgramDrafter(model_args.vocab_size),
    }
    drafters = {name: factories[name]() for name in args.drafters.split(",")}
    chat = [
        tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": p}])) for p in PROMPTS
    ]

    def scheduler(drafter: Drafter | None, adaptive: bool = False) -> LLMEngine:
        runner = TorchSpecRunner(target, drafter)
        sched = Scheduler(
            runner,
            SchedulerConfig(max_batch_size=64, max_context=1024, adaptive_speculation=adaptive),
            encode=tokenizer.encode,
            make_text_tracker=lambda stop: StopTextTracker(tokenizer, stop),
            eos_ids=frozenset(),  # fixed-length outputs so every run does the same work
        )
        return LLMEngine(sched, runner)

    rows = []
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        prompts = [chat[i % len(chat)] for i in range(batch)]
        run(scheduler(None), prompts[:1], 0, 8)  # warm-up
        plain_s, plain_out = run(scheduler(None), prompts, 0, args.max_tokens)
        n_tokens = sum(len(o) for o in plain_out)
        rows.append({"batch": batch, "drafter": "plain", "tok_s": n_tokens / plain_s, "speedup": 1.0})
        runs = [(name, drafter, False) for name, drafter in drafters.items()]
        # the default: the first drafter, drafting only where measured throughput says it pays off
        first = next(iter(drafters))
        runs.append((f"{first}+adaptive", drafters[first], True))
        for name, drafter, adaptive in runs:
            sched = scheduler(drafter, adaptive)
            if adaptive:
                # a serving process learns once and keeps its measurements: learn on one untimed run
                run(sched, prompts, args.num_draft_tokens, args.max_tokens)
                sched.scheduler.stats = type(sched.stats)()
            spec_s, spec_out = run(sched, prompts, args.num_draft_tokens, args.max_tokens)
            rows.append(
                {
                    "batch": batch,
                    "drafter": name,
                    "k": args.num_draft_tokens,
                    "tok_s": n_tokens / spec_s,
                    "speedup": plain_s / spec_s,
                    "acceptance_rate": sched.stats.acceptance_rate,
                    "mean_accepted_length": sched.stats.mean_accepted_length,
                    "draft_time_share": sched.stats.draft_time_s / spec_s,
                    "identical_to_plain": spec_out == plain_out,
                }
            )
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print(
        f"SmolLM2-135M-Instruct fp32 target, {args.threads} threads, {args.max_tokens} tokens per request, "
        f"greedy, k={args.num_draft_tokens}"
    )
    header = ("batch", "drafter", "tok/s", "vs plain", "accept", "mean len", "draft %", "same")
    print("{:>5} {:<18} {:>8} {:>9} {:>7} {:>9} {:>8} {}".format(*header))
    for r in rows:
        extra = (
            f"{r['acceptance_rate']:>7.1%} {r['mean_accepted_length']:>9.2f} {r['draft_time_share']:>8.0%} "
            f"{'yes' if r['identical_to_plain'] else 'NO'}"
            if r["drafter"] != "plain"
            else ""
        )
        print(f"{r['batch']:>5} {r['drafter']:<18} {r['tok_s']:>8.1f} {r['speedup']:>8.2f}x {extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
