"""The reference arm: Hugging Face ``generate(assistant_model=...)`` on the same draft/target pair and
the same prompt token ids, timed in the same benchmark run.

It runs in a child process (``python -m trispec.bench.hf_reference``, a JSON job on stdin, a JSON
result on stdout) so that its memory and threads never mix with ours. The pair is exported once with
``specdec-build``'s HF exporter, run as ``python -m trispec_build.hf_export`` (the weights exactly as
our loader reads them, fp32), into
``$SPECDEC_CACHE_DIR/hf-export``; transformers loads them in float32. Both arms are greedy, one request
at a time, with the end-of-sequence id disabled so that every prompt generates ``max_tokens`` (as our
arms do). Assisted generation drafts a constant ``k`` tokens per round (``num_assistant_tokens``,
schedule ``constant``, no confidence cut-off): the same rule as our fixed-k arms.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trispec.checkpoints import resolve_checkpoint
from trispec.config import ModelConfig, SpecDecConfig

# what trispec_build.hf_export writes
EXPORTED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json")


@dataclass(frozen=True)
class HFResult:
    plain_s: float
    assisted_s: float
    plain_token_ids: list[list[int]]
    assisted_token_ids: list[list[int]]
    transformers_version: str


def run_reference(
    config: SpecDecConfig, prompts: list[list[int]], *, max_tokens: int, k: int, threads: int
) -> HFResult:
    if config.drafter.model is None:
        raise ValueError("the Hugging Face reference needs a separate draft model (drafter.model)")
    job = {
        "target": _export_dir(config.target, "target"),
        "draft": _export_dir(config.drafter.model, "drafter.model"),
        "prompts": prompts,
        "max_tokens": max_tokens,
        "k": k,
        "threads": threads,
    }
    done = subprocess.run(
        [sys.executable, "-m", "trispec.bench.hf_reference"],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the Hugging Face reference failed:\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return HFResult(
        out["plain_s"], out["assisted_s"], out["plain"], out["assisted"], out["transformers_version"]
    )


def _export_dir(model: ModelConfig, field: str) -> dict[str, str]:
    """Where the export of ``model`` goes (keyed by the weights file), and what to export."""
    from trispec.checkpoints import cache_dir

    weights = resolve_checkpoint(model.checkpoint, f"{field}.checkpoint")
    stat = weights.stat()
    key = hashlib.sha256(f"{weights.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    folder = cache_dir() / "hf-export" / f"{weights.stem}-{key}"
    return {"dir": str(folder), "model": model.model_dump_json(), "field": field}


def _ensure_export(spec: dict[str, str]) -> Path:
    """Export through the build package's exporter, as its own process: runtime code does not import
    the build package."""
    folder = Path(spec["dir"])
    if not all((folder / name).exists() for name in EXPORTED_FILES):
        partial = folder.with_name(folder.name + ".partial")
        exporter = [sys.executable, "-m", "trispec_build.hf_export"]
        subprocess.run([*exporter, spec["model"], spec["field"], str(partial)], check=True)
        partial.rename(folder)
    return folder


def _child() -> int:
    job = json.loads(sys.stdin.read())
    target_dir, draft_dir = _ensure_export(job["target"]), _ensure_export(job["draft"])

    import torch
    import transformers

    torch.set_num_threads(job["threads"])
    load = transformers.AutoModelForCausalLM.from_pretrained
    target = load(target_dir, dtype=torch.float32).eval()
    draft = load(draft_dir, dtype=torch.float32).eval()
    for model in (target, draft):
        model.generation_config.eos_token_id = None  # fixed-length outputs, as our arms
        model.generation_config.pad_token_id = 0
    draft.generation_config.num_assistant_tokens = job["k"]
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0

    def generate(ids: list[int], max_tokens: int, assisted: bool) -> list[int]:
        x = torch.tensor([ids])
        extra = {"assistant_model": draft} if assisted else {}
        with torch.inference_mode():
            out = target.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=max_tokens,
                do_sample=False,
                **extra,
            )
        return out[0, len(ids) :].tolist()

    prompts, max_tokens = job["prompts"], job["max_tokens"]
    generate(prompts[0], 8, False)  # warm-up, untimed
    generate(prompts[0], 8, True)
    result: dict[str, object] = {"transformers_version": transformers.__version__}
    for name, assisted in (("plain", False), ("assisted", True)):
        start = time.perf_counter()
        result[name] = [generate(p, max_tokens, assisted) for p in prompts]
        result[f"{name}_s"] = time.perf_counter() - start
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(_child())
