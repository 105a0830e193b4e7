"""``specdec-bench-sampling``: what sampling costs over greedy decoding, in one process.

1. End to end (``--config``, default the built-in SmolLM2 pair): the same prompts generated greedy and
   sampled (seeded, end id ignored, so every run produces the same number of tokens), in alternating
   order, at one request with k = 0, and at 8 requests together with k = 0 and k = 4 (adaptive k as
   configured); the median tok/s of each and the ratio sampled / greedy per point.
2. With ``--same-text DRAFTER``: the coupled rule's cost in acceptance against the rejection rule's, on
   the same texts: the target's own sampled text of HumanEval and ShareGPT prompts (seeded), both
   models teacher-forced over it, and per position the coupled rule's outcome (the draft's perturbed
   argmax with the same noise equals the target's token) against the p/q test's acceptance
   probability (sum of min(p, q)); expected tokens per round at k = ``--k`` from every position.
3. The sampler alone, per row (``--rows``): the coupled rule (the kept set without a sort, then the
   perturbed argmax with keyed noise) at vocabularies 49,152 and 151,936 and batch 1, 8, 32, beside
   the previous full-sort sampler's sort and an argmax (what greedy pays); and the keyed noise of one
   decode step (batch 8, k 8: 72 target rows + 64 draft rows) against that step's time.

Not a test: ratios measured in one run on a quiet machine are what count.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

PROMPTS = [
    "Write a Python function that returns the factorial of n.\n\ndef factorial(n):",
    "Explain photosynthesis in one paragraph.",
    "Once upon a time, in a small village by the sea,",
    "List three benefits of regular exercise:\n1.",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "Dear hiring manager, I am writing to apply for",
    "SELECT name, age FROM users WHERE",
    "What is the difference between a list and a tuple in Python?",
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specdec-bench-sampling",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", type=Path, help="the pair's YAML (default: the built-in SmolLM2 config)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="runs of each setting per point, alternating")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--points", default="1x0,8x0,8x4", help="requests x k, comma-separated")
    p.add_argument("--rows", action="store_true", help="also time the sampler alone, per row")
    p.add_argument("--no-end-to-end", action="store_true", help="skip the end-to-end points")
    p.add_argument("--same-text", metavar="DRAFTER", help="coupled vs rejection acceptance on the same texts")
    p.add_argument("--k", type=int, default=4, help="--same-text: draft tokens per round")
    p.add_argument("--num-prompts", type=int, default=6, help="--same-text: prompts per workload")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    return p


def _emit(args: argparse.Namespace, row: dict[str, Any], text: str) -> None:
    print(json.dumps(row) if args.json else text, flush=True)


def _tok_s(llm: Any, prompts: list[str], k: int, max_tokens: int, settings: dict[str, Any]) -> float:
    """One run of ``prompts`` together: generated tokens per second."""
    requests = [
        llm.request(p, max_tokens=max_tokens, num_draft_tokens=k, end_id=-1, **settings) for p in prompts
    ]
    start = time.perf_counter()
    results = llm.generate(requests)
    elapsed = time.perf_counter() - start
    assert sum(len(r.token_ids) for r in results) == len(prompts) * max_tokens
    return len(prompts) * max_tokens / elapsed


def end_to_end(args: argparse.Namespace) -> None:
    from trispec.config import load_config
    from trispec.llm import SpeculativeLLM

    llm = SpeculativeLLM.from_config(load_config(args.config))
    sampled = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    greedy: dict[str, Any] = {"temperature": 0.0}
    for point in args.points.split(","):
        n, k = (int(v) for v in point.split("x"))
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
        # warm-up: kernels, and adaptive k's first measurements
        _tok_s(llm, prompts, k, args.max_tokens, greedy)
        _tok_s(llm, prompts, k, args.max_tokens, {**sampled, "seed": 1})
        tok_s: dict[str, list[float]] = {"greedy": [], "sampled": []}
        for r in range(args.repeats):  # alternating: g s s g g s ...
            for name in ["greedy", "sampled"] if r % 2 == 0 else ["sampled", "greedy"]:
                settings = greedy if name == "greedy" else {**sampled, "seed": 1000 + r}
                tok_s[name].append(_tok_s(llm, prompts, k, args.max_tokens, settings))
        # medians: a run another process slowed down moves a mean, not a median
        g, s = statistics.median(tok_s["greedy"]), statistics.median(tok_s["sampled"])
        row = {"section": "end_to_end", "requests": n, "k": k, "greedy_tok_s": round(g, 2)}
        row |= {"sampled_tok_s": round(s, 2), "sampled_vs_greedy": round(s / g, 4), "settings": sampled}
        row |= {"runs": {name: [round(t, 2) for t in v] for name, v in tok_s.items()}}
        text = f"{n} requests, k {k}: greedy {g:.1f} tok/s, sampled {s:.1f} tok/s (medians): {s / g:.3f}x"
        _emit(args, row, text)


def _time(fn: Callable[[], object], repeat: int = 20) -> float:
    fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _coupled(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    from trispec.sampling.coupled import perturbed_argmax
    from trispec.sampling.kept_set import find_kept_sets

    n = scaled.shape[0]
    kept = find_kept_sets(scaled, [top_k] * n, [top_p] * n)
    return perturbed_argmax(scaled, kept, list(range(n)), [7] * n)


def sampler_rows(args: argparse.Namespace) -> None:
    from trispec.sampling.coupled import scaled_logits

    g = torch.Generator().manual_seed(0)
    for vocab in (49152, 151936):
        for batch in (1, 8, 32):
            # logits shaped like a language model's: a few high, a long low tail
            logits = torch.randn(batch, vocab, generator=g) * 2.5
            logits += torch.rand(batch, vocab, generator=g).pow(20) * 25
            scaled = scaled_logits(logits, [args.temperature] * batch)
            sort = functools.partial(torch.sort, scaled, dim=-1, descending=True, stable=True)
            us = {
                "argmax": _time(functools.partial(logits.argmax, dim=-1)),
                "coupled_topk_topp": _time(functools.partial(_coupled, scaled, args.top_k, args.top_p)),
                "coupled_topp": _time(functools.partial(_coupled, scaled, 0, args.top_p)),
                "coupled_full_vocab": _time(functools.partial(_coupled, scaled, 0, 1.0)),
                "full_sort": _time(sort, 3),
            }
            per_row = {name: round(t / batch * 1e6, 1) for name, t in us.items()}
            row = {"section": "sampler_per_row_us", "vocab": vocab, "batch": batch, **per_row}
            _emit(args, row, f"vocab {vocab}, batch {batch}: us per row {per_row}")


def noise_share_of_a_step(args: argparse.Namespace) -> None:
    """The keyed noise of one decode step on the default model, batch 8, k 8, against the step."""
    from trispec.config import load_config
    from trispec.llm import SpeculativeLLM
    from trispec.sampling.coupled import perturbed_argmax, scaled_logits
    from trispec.sampling.kept_set import find_kept_sets

    llm = SpeculativeLLM.from_config(load_config(args.config))
    requests = [
        llm.request(PROMPTS[i], max_tokens=48, num_draft_tokens=8, end_id=-1, temperature=1.0, seed=i)
        for i in range(8)
    ]
    engine = llm.engine
    engine.scheduler.controller = None  # every step drafts its 8
    for r in requests:
        engine.add_request(r)
    step_s = []
    while engine.has_work():
        start = time.perf_counter()
        outputs = engine.step()
        elapsed = time.perf_counter() - start
        if outputs and all(len(o.new_token_ids) for o in outputs) and len(outputs) == 8:
            step_s.append(elapsed)
    step = statistics.median(step_s[2:])
    target = llm.engine.runner.target
    rows = torch.randn(72 + 64, target.vocab_size, generator=torch.Generator().manual_seed(1)) * 3
    scaled = scaled_logits(rows, [1.0] * rows.shape[0])
    kept = find_kept_sets(scaled, [0] * rows.shape[0], [1.0] * rows.shape[0])
    noise = _time(lambda: perturbed_argmax(scaled, kept, list(range(rows.shape[0])), [5] * rows.shape[0]))
    row = {"section": "noise_share", "step_ms": round(step * 1e3, 2), "noise_ms": round(noise * 1e3, 3)}
    row["noise_share"] = round(noise / step, 4)
    text = f"decode step batch 8 k 8: {step * 1e3:.1f} ms; noise of its 136 rows: {noise * 1e3:.2f} ms"
    _emit(args, row, text)


def _rounds(accept: list[float], k: int) -> float:
    """Mean expected tokens per round over the rounds that start at each position: ``accept`` per
    position is an outcome (1/0, the coupled rule: a round stops at the first miss) or a probability
    (the p/q test: the chance the round gets past it)."""
    starts = range(len(accept) - k + 1)
    total = 0.0
    for t in starts:
        tokens, alive = 1.0, 1.0
        for a in accept[t : t + k]:
            alive *= a
            tokens += alive
        total += tokens
    return total / max(len(starts), 1)


def same_text(args: argparse.Namespace) -> None:
    from trispec.bench.arms import Arm
    from trispec.bench.closed_loop import run_closed_loop
    from trispec.bench.harness import Bench
    from trispec.bench.workloads import load_workloads
    from trispec.config import load_config
    from trispec.engine.base import ForwardInput
    from trispec.sampling.coupled import perturbed_argmax, scaled_logits
    from trispec.sampling.kept_set import find_kept_sets

    config = load_config(args.config)
    sampling = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    bench = Bench(config, 1, 1024 + args.max_tokens, args.k, sampling, seed=0)
    draft = bench.drafters.engine(args.same_text)
    if draft is None:
        raise SystemExit("--same-text: name a drafter with a model (e.g. model-int8)")
    loads = load_workloads(["humaneval", "sharegpt"], bench.tokenizer, args.num_prompts, 0, 0, 1024)
    plain = Arm("plain", None, 0, False)
    for load in loads:
        seeds = bench._seeds_of(load.name, len(load.prompts))
        texts = run_closed_loop(
            bench.engine(plain, load.name), load.prompts, concurrency=1, max_tokens=args.max_tokens,
            num_draft_tokens=0, sampling=sampling, seeds=seeds,
        ).token_ids  # fmt: skip
        coupled, rejection = [], []
        for i, (prompt, text, seed) in enumerate(zip(load.prompts, texts, seeds, strict=True)):
            rows = {}
            for name, engine in (("p", bench.target), ("q", draft)):
                engine.add_sequence(10_000 + i, len(prompt) + len(text))
                fed = [*prompt, *text[:-1]]
                logits = engine.forward([ForwardInput(10_000 + i, fed, len(text))])[0]
                engine.free(10_000 + i)
                scaled = scaled_logits(logits, [args.temperature] * len(text))
                kept = find_kept_sets(scaled, [args.top_k] * len(text), [args.top_p] * len(text))
                rows[name] = (scaled, kept)
            positions = list(range(len(text)))
            drafts = perturbed_argmax(*rows["q"], [seed] * len(text), positions).tolist()
            outcome = [float(d == x) for d, x in zip(drafts, text, strict=True)]
            p, q = (torch.softmax(s.masked_fill(~k.mask(s), -torch.inf), dim=-1) for s, k in rows.values())
            overlap = torch.minimum(p, q).sum(dim=-1).tolist()
            coupled.append(_rounds(outcome, args.k))
            rejection.append(_rounds(overlap, args.k))
        c, r = statistics.mean(coupled), statistics.mean(rejection)
        row = {"section": "same_text", "workload": load.name, "drafter": args.same_text, "k": args.k}
        row |= {"coupled_tokens_per_round": round(c, 3), "rejection_tokens_per_round": round(r, 3)}
        row |= {"coupled_vs_rejection": round(c / r, 4), "settings": sampling, "prompts": len(texts)}
        text = (
            f"{load.name}: tokens per round at k {args.k}: coupled {c:.3f}, rejection {r:.3f} ({c / r:.3f}x)"
        )
        _emit(args, row, text)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    if not args.no_end_to_end:
        end_to_end(args)
    if args.same_text:
        same_text(args)
    if args.rows:
        sampler_rows(args)
        noise_share_of_a_step(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
