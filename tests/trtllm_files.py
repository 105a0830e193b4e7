"""What the TensorRT-LLM tests (``test_trtllm_*.py``) share: the files they write (a target/draft pair
of stand-in engine directories, a Hugging Face folder of tiny random weights, a YAML config for
``engine.kind: trtllm``) and an LLM engine over a runner, drained to its outputs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from safetensors.torch import save_file
from tiny import TINY_VOCAB, ascii_tokenizer, byte_tokenizer, tiny_args
from trispec.engine.random_weights import random_state_dict
from trispec.runners.trtllm_engines import read_engine
from trtllm_standin_engine import engine_config, write_engine

BIN = Path(sys.executable).parent


def engines(tmp: Path, draft: dict | None = None, target: dict | None = None, k: int = 4):
    d = tmp / "draft"
    t = tmp / "target"
    for path, overrides, mode, draft_len in ((d, dict(draft or {}), 1, 0), (t, dict(target or {}), 2, 8)):
        # as trtllm-build would write them from one --max_seq_len (see engine_config)
        mode = overrides.pop("build_config.speculative_decoding_mode", mode)
        draft_len = overrides.pop("build_config.max_draft_len", draft_len)
        config = engine_config(spec_mode=mode, max_draft_len=draft_len)
        for dotted, value in overrides.items():
            node = config
            *parents, leaf = dotted.split(".")
            for key in parents:
                node = node[key]
            node[leaf] = value
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(config))
    return read_engine(d), read_engine(t)


# -- 2. the build, dry run -----------------------------------------------------------------------------
def write_hf(folder: Path, arch: str, seed: int) -> Path:
    """A tiny HF checkpoint (safetensors, config.json, tokenizer.json)."""
    args = tiny_args(arch)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(random_state_dict(args, seed), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(args.to_hf_config()))
    ascii_tokenizer().backend.save(str(folder / "tokenizer.json"))
    return folder


def trtllm_yaml(tmp: Path, drafter: str, trtllm: str = "", scheduler: str = "") -> Path:
    path = tmp / "pair.yaml"
    path.write_text(
        "engine: {kind: trtllm}\ntarget: {checkpoint: {path: target}}\n"
        f"drafter: {drafter}\n"
        f"trtllm: {{engines_dir: out, kv_cache: {{gib: 1}}{trtllm}}}\n"
        f"scheduler: {{max_num_draft_tokens: 4, default_num_draft_tokens: 4{scheduler}}}\n"
    )
    return path


def engine_over(runner):  # type: ignore[no-untyped-def]
    from trispec.config import SchedulerConfig
    from trispec.detokenize import StopTextTracker
    from trispec.llm_engine import LLMEngine
    from trispec.scheduler import Scheduler

    tok = byte_tokenizer()
    sched = Scheduler(
        runner,
        SchedulerConfig(adaptive_speculation=False),
        encode=tok.encode,
        make_text_tracker=lambda stop: StopTextTracker(tok, stop),
        eos_ids=frozenset(),
    )
    return LLMEngine(sched, runner)


def drain(llm) -> dict:  # type: ignore[no-untyped-def]
    outputs: dict[int, list] = {}
    while llm.has_work():
        for out in llm.step():
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


def stand_in_runner(tmp: Path, *, target_draft_len: int = 8, ngram: bool = False, num_draft_tokens: int = 8):
    from trispec.drafters.ngram import NgramDrafter
    from trispec.runners.trtllm_executor import TrtllmExecutor
    from trispec.runners.trtllm_runner import TrtllmSpecRunner

    t = write_engine(tmp / "t", vocab_size=TINY_VOCAB, seed=0, spec_mode=2, max_draft_len=target_draft_len)
    d = write_engine(tmp / "d", vocab_size=TINY_VOCAB, seed=7)
    target = TrtllmExecutor(t, kv_cache_tokens=4096)
    if ngram:
        return TrtllmSpecRunner(
            target, read_engine(t), drafter=NgramDrafter(TINY_VOCAB), kv_tokens=4096, num_draft_tokens=8
        )
    draft = TrtllmExecutor(d, kv_cache_tokens=4096, gather_generation_logits=True)
    return TrtllmSpecRunner(
        target,
        read_engine(t),
        draft=draft,
        draft_info=read_engine(d),
        kv_tokens=4096,
        num_draft_tokens=num_draft_tokens,
    )
