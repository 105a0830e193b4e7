"""What one numerics path produces for a config: digests of the target's logits and of a few texts.

Run it twice with different ISA levels or thread counts and compare the JSON: equal digests mean the
two paths give the same bits (docs/determinism.md, "Across machines"). For example

    .venv/bin/python scripts/numerics_probe.py > native.json
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python scripts/numerics_probe.py > avx2.json

Logits: the target's next-token logits after each prompt (one prefill), SHA-256 of their float32
bytes. Texts: greedy with k = 0 and 4, and seeded T = 0.8 with k = 4, ``--max-tokens`` each.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

import torch
from trispec.config import load_config
from trispec.engine.base import ForwardInput
from trispec.llm import SpeculativeLLM

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "Explain how a hash map works, step by step, in plain words.",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="YAML config (default: the built-in one)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    start = time.monotonic()
    llm = SpeculativeLLM.from_config(load_config(args.config))
    target = llm.engine.runner.target  # type: ignore[attr-defined]
    logits = {}
    for i, prompt in enumerate(PROMPTS):
        ids = llm.tokenizer.encode(prompt)
        target.add_sequence(10_000 + i, len(ids) + 1)
        row = target.forward([ForwardInput(10_000 + i, ids, 1)])[0][-1]
        target.free(10_000 + i)
        logits[prompt] = hashlib.sha256(row.float().contiguous().numpy().tobytes()).hexdigest()[:16]
    texts = {}
    for name, sampling in {
        "greedy k0": {"num_draft_tokens": 0},
        "greedy k4": {"num_draft_tokens": 4},
        "seeded T0.8 k4": {"num_draft_tokens": 4, "temperature": 0.8, "seed": 7},
    }.items():
        requests = [llm.request(p, max_tokens=args.max_tokens, **sampling) for p in PROMPTS]
        texts[name] = {r.prompt: r.text for r in llm.generate(requests)}
    print(
        json.dumps(
            {
                "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                "threads": torch.get_num_threads(),
                "logits_sha256": logits,
                "texts": texts,
                "seconds": round(time.monotonic() - start, 1),
            },
            indent=1,
            ensure_ascii=False,
        )
    )


if __name__ == "__main__":
    main()
