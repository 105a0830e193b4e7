"""The ``trtllm`` section of the YAML config: how ``specdec-build`` converts and builds TensorRT-LLM
engines and how they are served, with the one KV-cache budget the draft and target executors share.
Part of ``trispec.config``'s ``SpecDecConfig``; kept apart because only the TensorRT-LLM path reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from trispec.strict_model import StrictModel


class KVCacheBudget(StrictModel):
    """One KV-cache budget for the draft and target executors together: ``gib`` GiB, or a fraction
    of the GPU memory that is free when the executors start. Split so both hold the same tokens."""

    gib: float | None = Field(None, gt=0)
    gpu_fraction: float | None = Field(None, gt=0, le=1)

    @model_validator(mode="after")
    def _one(self) -> KVCacheBudget:
        if (self.gib is None) == (self.gpu_fraction is None):
            raise ValueError("give exactly one of 'gib' or 'gpu_fraction'")
        return self


class TrtllmConfig(StrictModel):
    """TensorRT-LLM engines: how ``specdec-build`` converts and builds them, and how they are served."""

    dtype: Literal["float16", "bfloat16", "float32"] = "bfloat16"
    tp_size: int = Field(1, ge=1)
    max_batch_size: int = Field(8, ge=1)
    max_input_len: int = Field(2048, ge=1)
    max_seq_len: int = Field(4096, ge=2)
    # the target engine accepts up to this many external draft tokens per request
    max_draft_len: int = Field(8, ge=1, le=64)
    # tokens one engine step packs (trtllm-build --max_num_tokens, passed explicitly: left out,
    # trtllm-build raises it for a draft-tokens target). Without chunked context a whole context
    # (the sequence re-sent each round, plus its drafts) must fit in it.
    max_num_tokens: int = Field(8192, ge=1)
    # weight-only quantisation of both engines (a self-draft is always int8)
    weight_only: Literal["int8", "int4"] | None = None
    # TensorRT-LLM's examples folder (convert_checkpoint.py lives under models/core/<arch>/)
    examples_dir: Path = Path("/app/tensorrt_llm/examples")
    # where specdec-build writes hf/, checkpoints/, engines/, logs/, the plan and the LLM-API files
    engines_dir: Path = Path("engines")
    # engines built elsewhere (default: engines_dir/engines/{target,draft})
    target_engine: Path | None = None
    draft_engine: Path | None = None
    gpu_ids: list[int] = Field(default_factory=lambda: [0], min_length=1)
    # tp_size > 1: TensorRT-LLM's MPI worker that orchestrator mode spawns per GPU. Unset: NVIDIA's
    # Triton image's trtllmExecutorWorker if present, else tensorrt_llm/bin/executorWorker inside the
    # installed wheel (which always ships it)
    executor_worker: Path | None = None
    kv_cache: KVCacheBudget = KVCacheBudget(gpu_fraction=0.85)
    # GPU memory each engine takes beside its weights before its KV cache is sized (activations,
    # decoder buffers); subtracted with both engines' weights before the KV budget is split
    runtime_reserve_gib: float = Field(1.0, ge=0)
    # prompts longer than max_num_tokens are prefilled in chunks (needs paged context FMHA, which
    # specdec-build always enables); false: such contexts are refused up front, naming max_num_tokens
    chunked_context: bool = True
    # sampled requests: true (default) = the draft's logits go with its tokens, divided by the
    # draft's temperature and masked to its top-k/top-p set, so TensorRT-LLM's p/q check sees the
    # distribution the draft sampled from: lossless. false = tokens only: TensorRT-LLM then accepts
    # a draft when the target's own sample equals it and otherwise emits a FRESH target sample, which
    # is biased towards the draft for temperature > 0 (greedy stays exact either way)
    draft_logits: bool = True
    # TensorRT-LLM >= 1.3 LLM API only (model.yaml / extra_llm_api_options.yaml): speculation off at
    # batch sizes above this (DecodingBaseConfig.max_concurrency); null: always on
    max_concurrency: int | None = Field(8, ge=1)

    @field_validator("executor_worker", mode="before")
    @classmethod
    def _worker_path(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():
            raise ValueError("must name the executor worker binary, not be empty (omit it for the default)")
        return value

    @model_validator(mode="after")
    def _limits(self) -> TrtllmConfig:
        if self.max_input_len > self.max_seq_len:
            raise ValueError("max_input_len must be <= max_seq_len")
        if self.max_num_tokens <= self.max_draft_len:
            raise ValueError(
                f"max_num_tokens ({self.max_num_tokens}) must exceed max_draft_len ({self.max_draft_len}): "
                "one verify step takes max_draft_len + 1 tokens"
            )
        if len(self.gpu_ids) != self.tp_size:
            raise ValueError(f"gpu_ids names {len(self.gpu_ids)} GPUs, tp_size is {self.tp_size}")
        return self

    @property
    def target_engine_dir(self) -> Path:
        return self.target_engine or self.engines_dir / "engines" / "target"

    @property
    def draft_engine_dir(self) -> Path:
        return self.draft_engine or self.engines_dir / "engines" / "draft"
