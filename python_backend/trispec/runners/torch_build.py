"""Build the PyTorch engines a config names: the target, and the drafter (a self-draft at lower
precision or a separate draft checkpoint, optionally with suffix decoding beside it; a model-free
drafter; or none)."""

from __future__ import annotations

from typing import Any

import torch

from trispec.checkpoints import cache_dir, load_tokenizer, resolve_checkpoint
from trispec.config import ModelConfig, SchedulerConfig, SpecDecConfig
from trispec.drafters.base import Drafter
from trispec.drafters.draft_vocab import draft_vocab_ids
from trispec.drafters.factory import model_free_drafter, suffix_drafter
from trispec.drafters.model_drafter import ModelDrafter
from trispec.drafters.with_suffix import WithSuffix
from trispec.engine.args import ModelArgs
from trispec.engine.torch_engine import TorchEngine
from trispec.engine.weights import StateDict, load_checkpoint
from trispec.errors import ConfigError

Checkpoint = tuple[ModelArgs, StateDict]


def build_engine(
    model: ModelConfig,
    field: str,
    sched: SchedulerConfig,
    checkpoint: Checkpoint | None = None,
    draft_vocab: int | None = None,
    **kw: Any,
) -> TorchEngine:
    """``draft_vocab``: a draft engine whose LM head computes that many ids (``draft_vocab.py``)."""
    args, state_dict = checkpoint or load_checkpoint(
        resolve_checkpoint(model.checkpoint, f"{field}.checkpoint")
    )
    kw.setdefault("weight_quant", "gguf" if model.weights == "gguf" else None)
    if draft_vocab is not None:
        if draft_vocab > args.vocab_size:
            raise ConfigError(
                "drafter.draft_vocab",
                f"{draft_vocab} exceeds the draft model's vocabulary ({args.vocab_size})",
            )
        tokenizer = load_tokenizer(model, field)
        ids = draft_vocab_ids(
            tokenizer.backend,
            args.vocab_size,
            draft_vocab,
            always=sorted(tokenizer.eos_ids),
            cache_dir=cache_dir(),
        )
        kw["head_ids"] = torch.from_numpy(ids)
    return TorchEngine.from_state_dict(
        args,
        state_dict,
        dtype=model.dtype,
        kv_cache_mb=model.kv_cache_mb,
        device=model.device,
        block_size=sched.block_size,
        max_context=sched.max_context,
        prefix_caching=sched.prefix_caching,
        **kw,
    )


def build_engines(config: SpecDecConfig) -> tuple[TorchEngine, Drafter | None]:
    """The target engine and the drafter. A draft engine is built first: the peak while loading is
    then the finished draft plus the target in construction, not the other way round (the target's
    construction temporaries are the larger)."""
    target_checkpoint = load_checkpoint(resolve_checkpoint(config.target.checkpoint, "target.checkpoint"))
    draft_engine = build_draft_engine(config, target_checkpoint)
    target = build_engine(config.target, "target", config.scheduler, target_checkpoint)
    del target_checkpoint  # its reader (and memory map) can go
    return target, make_drafter(config, draft_engine, target)


def make_drafter(
    config: SpecDecConfig, draft_engine: TorchEngine | None, target: TorchEngine
) -> Drafter | None:
    """The drafter the config names around its draft engine (None: a model-free drafter or none). A
    self-draft catches its cache up with the target's keys and values (``ModelDrafter``)."""
    vocab_size = target.vocab_size
    if draft_engine is None:
        return model_free_drafter(config, vocab_size)
    if draft_engine.vocab_size != vocab_size:
        raise ConfigError(
            "drafter.model.checkpoint",
            f"draft vocabulary ({draft_engine.vocab_size}) differs from the target's ({vocab_size})",
        )
    model = ModelDrafter(draft_engine, target if config.drafter.kind == "self" else None)
    if config.drafter.with_suffix:
        return WithSuffix(model, suffix_drafter(config, vocab_size))
    return model


def build_draft_engine(config: SpecDecConfig, target_checkpoint: Checkpoint) -> TorchEngine | None:
    drafter = config.drafter
    # int8 weights run with bf16 activations: the int8 kernel is only fast with those
    weight_quant = "int8" if drafter.precision == "int8" else None
    draft_vocab = drafter.draft_vocab
    if drafter.kind == "self":
        # the target's own weights at lower precision (the same file, read again lazily)
        update = {"kv_cache_mb": drafter.kv_cache_mb, "dtype": "bfloat16", "weights": "dense"}
        model = config.target.model_copy(update=update)
        return build_engine(
            model,
            "target",
            config.scheduler,
            target_checkpoint,
            weight_quant=weight_quant,
            draft_vocab=draft_vocab,
        )
    if drafter.kind == "model":
        assert drafter.model is not None
        model = drafter.model
        if drafter.precision == "gguf":
            model = model.model_copy(update={"dtype": "float32", "weights": "gguf"})
        elif drafter.precision is not None:
            model = model.model_copy(update={"dtype": "bfloat16", "weights": "dense"})
            return build_engine(
                model, "drafter.model", config.scheduler, weight_quant=weight_quant, draft_vocab=draft_vocab
            )
        return build_engine(model, "drafter.model", config.scheduler, draft_vocab=draft_vocab)
    return None
