"""TensorRT-LLM engines from one YAML: export HF dirs, convert checkpoints, ``trtllm-build`` both.

For TensorRT-LLM <= 1.2.x (the last releases with ``trtllm-build``). For each of target and draft:
  1. ``python <examples>/models/core/<llama|qwen>/convert_checkpoint.py --model_dir <hf> --output_dir
     <checkpoint> --dtype <dtype> --tp_size <tp>`` (+ weight-only flags);
  2. ``trtllm-build --checkpoint_dir <checkpoint> --output_dir <engine>`` with paged KV, paged context
     FMHA (KV-block reuse between rounds needs it), input-padding removal, the gemm plugin and the
     limits; the target also ``--speculative_decoding_mode draft_tokens_external --max_draft_len K``.
Each step logs to its own file under ``<engines_dir>/logs``; ``--dry-run`` prints the commands and
writes ``<engines_dir>/build_plan.json`` without running anything.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from trispec.config import SpecDecConfig
from trispec.config_trtllm import TrtllmConfig
from trispec.engine.args import Arch

# TensorRT-LLM's example folder per architecture (0.19+ layout first, then the older one)
CONVERT_SCRIPTS: dict[Arch, tuple[str, ...]] = {
    "llama": ("models/core/llama/convert_checkpoint.py", "llama/convert_checkpoint.py"),
    "qwen2": ("models/core/qwen/convert_checkpoint.py", "qwen/convert_checkpoint.py"),
}


class BuildError(RuntimeError):
    """A build step cannot run or failed (the message is one line)."""


@dataclass(frozen=True)
class BuildStep:
    name: str  # e.g. "convert target"
    command: list[str]
    log: str
    output: str

    def shell(self) -> str:
        return shlex.join(self.command)


def roles(config: SpecDecConfig) -> list[str]:
    """The engines this config needs: the target, and a draft engine for a model or self draft."""
    return ["target", "draft"] if config.drafter.kind in ("model", "self") else ["target"]


def convert_script(examples_dir: Path, arch: Arch) -> Path:
    candidates = [examples_dir / rel for rel in CONVERT_SCRIPTS[arch]]
    return next((c for c in candidates if c.is_file()), candidates[0])


def plan(config: SpecDecConfig, archs: dict[str, Arch], hf_dirs: dict[str, Path]) -> list[BuildStep]:
    trt = config.trtllm
    assert trt is not None
    steps = []
    logs = trt.engines_dir / "logs"
    for role in roles(config):
        checkpoint = trt.engines_dir / "checkpoints" / role
        engine = trt.target_engine_dir if role == "target" else trt.draft_engine_dir
        convert = [
            sys.executable,
            str(convert_script(trt.examples_dir, archs[role])),
            "--model_dir", str(hf_dirs[role]),
            "--output_dir", str(checkpoint),
            "--dtype", trt.dtype,
            "--tp_size", str(trt.tp_size),
        ]  # fmt: skip
        quant = weight_only(config, role, trt)
        if quant is not None:
            convert += ["--use_weight_only", "--weight_only_precision", quant]
        steps.append(
            BuildStep(f"convert {role}", convert, str(logs / f"convert_{role}.log"), str(checkpoint))
        )
        build = [
            "trtllm-build",
            "--checkpoint_dir", str(checkpoint),
            "--output_dir", str(engine),
            "--gemm_plugin", trt.dtype,
            "--kv_cache_type", "paged",
            "--use_paged_context_fmha", "enable",
            "--remove_input_padding", "enable",
            "--max_batch_size", str(trt.max_batch_size),
            "--max_input_len", str(trt.max_input_len),
            "--max_seq_len", str(trt.max_seq_len),
            # explicit: left out, trtllm-build raises it to max_batch_size * (max_draft_len + 1) for
            # a draft-tokens target, and the context limit would differ between the two engines
            "--max_num_tokens", str(trt.max_num_tokens),
        ]  # fmt: skip
        if role == "target":
            build += [
                "--speculative_decoding_mode",
                "draft_tokens_external",
                "--max_draft_len",
                str(trt.max_draft_len),
            ]
        elif trt.draft_logits:
            # sampled requests are verified against the draft's logits (1.x also asks at run time)
            build += ["--gather_generation_logits"]
        steps.append(BuildStep(f"build {role}", build, str(logs / f"build_{role}.log"), str(engine)))
    return steps


def weight_only(config: SpecDecConfig, role: str, trt: TrtllmConfig) -> str | None:
    if role == "draft" and config.drafter.kind == "self":
        return "int8"  # a self-draft is the target's own weights, int8 weight-only
    return trt.weight_only


def write_plan(path: Path, steps: list[BuildStep]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"steps": [asdict(s) for s in steps]}, indent=2) + "\n")


def check_tensorrt_llm(examples_dir: Path, archs: dict[str, Arch]) -> None:
    """Fail with one line unless TensorRT-LLM (<= 1.2.x, with trtllm-build) can run the plan."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        raise BuildError(
            "TensorRT-LLM is not installed: building engines needs tensorrt_llm 1.2.x with trtllm-build "
            "(NVIDIA GPU, CUDA); --dry-run prints the plan without it"
        )
    if shutil.which("trtllm-build") is None:
        raise BuildError(
            "trtllm-build is not on PATH: this TensorRT-LLM has no engine builder (releases after 1.2.x are "
            "PyTorch-backend only; docs/tensorrt-llm.md: the LLM-API files specdec-build writes for those)"
        )
    for arch in set(archs.values()):
        script = convert_script(examples_dir, arch)
        if not script.is_file():
            raise BuildError(f"trtllm.examples_dir: {script} not found (TensorRT-LLM's examples folder)")


def run(steps: list[BuildStep]) -> None:
    """Run the steps in order, each with a live progress line and its own log file."""
    from rich.console import Console

    console = Console(stderr=True)
    for index, step in enumerate(steps, 1):
        log = Path(step.log)
        log.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        with log.open("w") as out, console.status(f"[{index}/{len(steps)}] {step.name} (log: {log})"):
            out.write(f"$ {step.shell()}\n")
            out.flush()
            code = subprocess.run(step.command, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
        took = time.monotonic() - start
        if code != 0:
            raise BuildError(f"{step.name} failed (exit {code}) after {took:.0f} s; see {log}")
        console.print(f"[{index}/{len(steps)}] {step.name}: done in {took:.0f} s -> {step.output}")
