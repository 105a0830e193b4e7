"""Files for TensorRT-LLM >= 1.3 (PyTorch backend only, no engines): hand the whole loop to it.

* ``extra_llm_api_options.yaml`` for ``trtllm-serve <target> --extra_llm_api_options <file>`` (and
  ``trtllm-bench``): a draft-target ``speculative_config``;
* ``model.yaml`` for Triton's LLM-API model (``triton_backend/all_models/llmapi/tensorrt_llm/1/``):
  every top-level key but ``triton_config`` is an ``LLM()`` argument, and the model itself reads
  ``triton_config.decoupled`` and ``triton_config.max_batch_size`` (its model.py; without that block
  it fails to load).

What TensorRT-LLM then does is its own loop (newest ``tensorrt_llm/llmapi/llm_args.py``
``DecodingBaseConfig`` and the two-model sampler): k is fixed per server (``max_draft_len``), or set
per batch size by ``draft_len_schedule`` (a static table, mutually exclusive with the next);
``max_concurrency`` turns speculation off above that many requests in the batch (written here from
``trtllm.max_concurrency``); non-greedy requests are verified by rejection sampling when the drafter
gives its logits (draft-target does) and by token matching otherwise. There is still no per-request
k, no off switch per request, and no goodput-driven choice: our runner (``engine.kind: trtllm``) is
the way to keep those, on TensorRT-LLM engines (<= 1.2.x).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from trispec.config import SpecDecConfig


def speculative_config(config: SpecDecConfig, draft_hf: Path) -> dict[str, object]:
    trt = config.trtllm
    assert trt is not None
    spec: dict[str, object] = {
        "decoding_type": "DraftTarget",
        "max_draft_len": config.scheduler.default_num_draft_tokens or trt.max_draft_len,
        # speculative_model_dir: the 1.2.x name, still accepted (as an alias) by newer releases
        "speculative_model_dir": str(draft_hf),
    }
    if trt.max_concurrency is not None:
        spec["max_concurrency"] = trt.max_concurrency
    return spec


def write(config: SpecDecConfig, hf_dirs: dict[str, Path], out_dir: Path) -> list[Path]:
    """Write both files (only when the config has a draft model: n-gram drafting in TensorRT-LLM's
    own loop is a different decoding type); returns what was written."""
    trt = config.trtllm
    assert trt is not None
    if "draft" not in hf_dirs:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = speculative_config(config, hf_dirs["draft"])
    options = {"speculative_config": spec, "disable_overlap_scheduler": True}
    header = (
        "# TensorRT-LLM >= 1.3 (PyTorch backend), written by specdec-build:\n"
        f"#   trtllm-serve {hf_dirs['target']} --extra_llm_api_options <this file>\n"
        "# k fixed per server; speculation off above max_concurrency requests in the batch.\n"
    )
    extra = out_dir / "extra_llm_api_options.yaml"
    extra.write_text(header + yaml.safe_dump(options, sort_keys=False))
    model = {
        # read by Triton's llmapi model itself, not passed to LLM()
        "triton_config": {"max_batch_size": trt.max_batch_size, "decoupled": config.serving.decoupled},
        "model": str(hf_dirs["target"]),
        "backend": "pytorch",
        "tensor_parallel_size": trt.tp_size,
        "max_batch_size": trt.max_batch_size,
        "max_seq_len": trt.max_seq_len,
        "speculative_config": spec,
        "disable_overlap_scheduler": True,
        "kv_cache_config": {
            "enable_block_reuse": True,
            "free_gpu_memory_fraction": trt.kv_cache.gpu_fraction or 0.85,
        },
    }
    model_yaml = out_dir / "model.yaml"
    model_yaml.write_text(
        "# model.yaml for Triton's LLM-API model (triton_backend/all_models/llmapi/tensorrt_llm/1/),\n"
        "# TensorRT-LLM >= 1.3; keys are LLM() arguments. Written by specdec-build.\n"
        + yaml.safe_dump(model, sort_keys=False)
    )
    return [extra, model_yaml]
