"""llama.cpp on the same GGUF files, in the same run (``specdec-bench --anchor-llamacpp PATH``).

Users who run a small model locally already have llama.cpp: its plain decoding is the speed ours is
read against, not our own plain arm. PATH is a ``llama-bench`` binary (``scripts/llamacpp_anchor.sh``
builds one into the cache directory); it runs on the config's target and draft files with the bench's
thread count: prompt processing of ``PROMPT_TOKENS`` tokens (the time to a first token) and plain
decoding of ``--max-tokens`` tokens, each the mean of ``REPETITIONS`` runs.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

PROMPT_TOKENS = 111  # the measured prompt (a HumanEval prompt of that length)
REPETITIONS = 3


@dataclass(frozen=True)
class Anchor:
    model: Path
    prompt_tok_s: float  # llama-bench pp<PROMPT_TOKENS>
    decode_tok_s: float  # llama-bench tg<n>
    n_gen: int
    build: str

    def row(self, role: str) -> dict[str, object]:
        return {
            "row": "llamacpp",
            "role": role,
            "model": self.model.name,
            "pp_tokens": PROMPT_TOKENS,
            "pp_tok_s": round(self.prompt_tok_s, 3),
            "tg_tokens": self.n_gen,
            "tg_tok_s": round(self.decode_tok_s, 3),
            "build": self.build,
        }


def run_llama_bench(binary: Path, model: Path, *, threads: int, n_gen: int) -> Anchor:
    """One llama-bench run of ``model``: pp and tg at depth 0."""
    command = [
        str(binary), "-m", str(model), "-t", str(threads), "-r", str(REPETITIONS),
        "-p", str(PROMPT_TOKENS), "-n", str(n_gen), "-o", "jsonl",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({done.returncode}): {done.stderr[-2000:]}")
    pp = tg = None
    build = ""
    for line in done.stdout.splitlines():
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        build = str(r.get("build_commit", ""))
        if r.get("n_prompt") and not r.get("n_gen"):
            pp = float(r["avg_ts"])
        elif r.get("n_gen") and not r.get("n_prompt"):
            tg = float(r["avg_ts"])
    if pp is None or tg is None:
        raise RuntimeError(f"llama-bench printed no pp/tg results: {done.stdout[-2000:]}")
    return Anchor(model, pp, tg, n_gen, build)
