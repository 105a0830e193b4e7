"""Predicted outputs on the ``edit`` workload ("rewrite this code, keeping it otherwise unchanged"), one
request at a time, in one run: plain decoding, the config's own drafter under adaptive k, and the
request's prediction (the code it is asked to rewrite) at k 8. Greedy, ``max_tokens`` tokens each
with the end id ignored, so every arm makes the same tokens (checked); decode-only tokens/s (from the
first token on) and each arm's ratio to plain.

    .venv/bin/python scripts/bench_prediction.py [--config YAML] [--prompts 4] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import re
import time

from trispec.bench import workloads
from trispec.config import load_config
from trispec.llm import SpeculativeLLM

ARMS = (
    ("plain", {"num_draft_tokens": 0}),
    ("drafter-adaptive", {}),
    ("prediction-k8", {"num_draft_tokens": 8}),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=None, help="the pair's YAML (default: the built-in one)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    llm = SpeculativeLLM.from_config(load_config(args.config))
    prompts = workloads.load("edit", args.prompts, seed=0)
    rows: dict[str, list[tuple[float, bool, float]]] = {name: [] for name, _ in ARMS}
    for _ in range(args.repeats):
        for prompt in prompts:
            text = llm.tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}])
            code = re.search(r"```python\n(.*)\n```", prompt.text, re.S)
            assert code is not None
            plain: list[int] | None = None
            for name, fields in ARMS:
                extra = {"prediction": code.group(1)} if name.startswith("prediction") else {}
                ids, rate, acceptance = _decode(llm, text, args.max_tokens, {**fields, **extra})
                plain = ids if plain is None else plain
                rows[name].append((rate, ids == plain, acceptance))
    base = sum(r[0] for r in rows["plain"]) / len(rows["plain"])
    for name, measured in rows.items():
        rate = sum(r[0] for r in measured) / len(measured)
        acceptance = sum(r[2] for r in measured) / len(measured)
        same = all(r[1] for r in measured)
        ratio = rate / base
        print(f"{name:18s} {rate:6.1f} tok/s  {ratio:5.2f}x plain  acceptance {acceptance:.2f}  same {same}")


def _decode(
    llm: SpeculativeLLM, prompt: str, max_tokens: int, fields: dict
) -> tuple[list[int], float, float]:
    request = llm.request(prompt, max_tokens=max_tokens, temperature=0.0, end_id=-1, **fields)
    ids: list[int] = []
    first = started = ended = 0.0
    acceptance = 0.0
    for _, out in llm.stream([request]):
        if out.new_token_ids and not started:
            started, first = time.perf_counter(), len(out.new_token_ids)
        ids += out.new_token_ids
        if out.finished:
            ended, acceptance = time.perf_counter(), out.stats.acceptance_rate
    return ids, (len(ids) - first) / (ended - started), acceptance


if __name__ == "__main__":
    main()
