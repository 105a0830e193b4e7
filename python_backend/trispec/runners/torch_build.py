"""Build the PyTorch engines a config names: the target, and the drafter (a self-draft at lower
precision, a separate draft checkpoint, n-gram lookup, or none)."""

from __future__ import annotations

from typing import Any

from trispec.config import ModelConfig, SchedulerConfig, SpecDecConfig
from trispec.drafters.base import Drafter
from trispec.drafters.model_drafter import ModelDrafter
from trispec.drafters.ngram import NgramDrafter
from trispec.engine.args import ModelArgs
from trispec.engine.torch_engine import TorchEngine
from trispec.engine.weights import StateDict, load_checkpoint
from trispec.errors import ConfigError

Checkpoint = tuple[ModelArgs, StateDict]


def build_engine(
    model: ModelConfig, field: str, sched: SchedulerConfig, checkpoint: Checkpoint | None = None, **kw: Any
) -> TorchEngine:
    args, state_dict = checkpoint or load_checkpoint(model.checkpoint.resolve(f"{field}.checkpoint"))
    return TorchEngine.from_state_dict(
        args,
        state_dict,
        dtype=model.dtype,
        kv_cache_mb=model.kv_cache_mb,
        block_size=sched.block_size,
        max_context=sched.max_context,
        **kw,
    )


def build_target(config: SpecDecConfig) -> tuple[TorchEngine, Checkpoint]:
    checkpoint = load_checkpoint(config.target.checkpoint.resolve("target.checkpoint"))
    return build_engine(config.target, "target", config.scheduler, checkpoint), checkpoint


def build_drafter(
    config: SpecDecConfig, target: TorchEngine, target_checkpoint: Checkpoint
) -> Drafter | None:
    drafter = config.drafter
    sched = config.scheduler
    if drafter.kind == "none":
        return None
    if drafter.kind == "ngram":
        return NgramDrafter(target.vocab_size, drafter.ngram.max_ngram, drafter.ngram.min_ngram)
    if drafter.kind == "self":
        # the target's own weights at lower precision (loaded once, shared with the target's build);
        # int8 weights run with bf16 activations: the int8 kernel is only fast with those
        weight_quant = "int8" if drafter.precision == "int8" else None
        self_model = config.target.model_copy(
            update={"kv_cache_mb": drafter.kv_cache_mb, "dtype": "bfloat16"}
        )
        engine = build_engine(self_model, "target", sched, target_checkpoint, weight_quant=weight_quant)
    else:
        assert drafter.model is not None
        engine = build_engine(drafter.model, "drafter.model", sched)
    if engine.vocab_size != target.vocab_size:
        raise ConfigError(
            "drafter.model.checkpoint",
            f"draft vocabulary ({engine.vocab_size}) differs from the target's ({target.vocab_size})",
        )
    return ModelDrafter(engine)
