"""Build the whole speculative stack from a config, and run batches of prompts offline.

``SpeculativeLLM.from_config`` wires tokenizer, target engine, verifier, drafter and scheduler;
``generate`` feeds every prompt to the in-flight batcher at once and steps until all finish.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trispec.config import DrafterConfig, ModelConfig, SchedulerConfig, SpecDecConfig
from trispec.detokenize import StopTextTracker
from trispec.drafters.base import Drafter
from trispec.drafters.model_drafter import ModelDrafter
from trispec.drafters.ngram import NgramDrafter
from trispec.engine.args import ModelArgs
from trispec.engine.torch_engine import TorchEngine
from trispec.engine.weights import StateDict, load_checkpoint
from trispec.errors import ConfigError
from trispec.request import GenerationRequest
from trispec.scheduler import RequestOutput, Scheduler
from trispec.stats import AcceptanceStats
from trispec.tokenizer import Tokenizer, load_tokenizer_for_gguf
from trispec.verifier import LogitsVerifier

CACHE_DIR_ENV = "TRISPEC_CACHE_DIR"
Checkpoint = tuple[ModelArgs, StateDict]


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_DIR_ENV, Path.home() / ".cache" / "trispec"))


@dataclass
class GenerationResult:
    prompt: str
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: AcceptanceStats

    def to_dict(self) -> dict[str, object]:
        stats = self.stats.to_dict()
        keys = ("draft_tokens", "accepted_tokens", "rounds", "acceptance_rate", "mean_accepted_length")
        return {
            "prompt": self.prompt,
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "stats": {**{k: stats[k] for k in keys}, "accepted_per_position": stats["accepted_per_position"]},
        }


def load_tokenizer(model: ModelConfig, field: str) -> Tokenizer:
    weights = model.checkpoint.resolve(f"{field}.checkpoint")
    if model.tokenizer is not None:
        return Tokenizer.from_files(model.tokenizer)
    if weights.is_dir():
        return Tokenizer.from_files(weights / "tokenizer.json")
    return load_tokenizer_for_gguf(weights, cache_dir())


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


def build_drafter(
    config: SpecDecConfig, target: TorchEngine, target_checkpoint: Checkpoint
) -> Drafter | None:
    drafter: DrafterConfig = config.drafter
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


class SpeculativeLLM:
    def __init__(self, scheduler: Scheduler, tokenizer: Tokenizer, config: SpecDecConfig) -> None:
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.config = config

    @classmethod
    def from_config(cls, config: SpecDecConfig) -> SpeculativeLLM:
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        sched = config.scheduler
        tokenizer = load_tokenizer(config.target, "target")
        target_checkpoint = load_checkpoint(config.target.checkpoint.resolve("target.checkpoint"))
        target = build_engine(config.target, "target", sched, target_checkpoint)
        if config.drafter.kind == "model":
            assert config.drafter.model is not None
            draft_tokenizer = load_tokenizer(config.drafter.model, "drafter.model")
            if draft_tokenizer.vocab_size != tokenizer.vocab_size:
                raise ConfigError("drafter.model.checkpoint", "draft and target tokenizers differ")
        scheduler = Scheduler(
            LogitsVerifier(target),
            build_drafter(config, target, target_checkpoint),
            sched,
            encode=tokenizer.encode,
            make_text_tracker=lambda stop: StopTextTracker(tokenizer, stop),
            eos_ids=tokenizer.eos_ids,
        )
        return cls(scheduler, tokenizer, config)

    def request(self, prompt: str, **overrides: object) -> GenerationRequest:
        """A request with the config's generation defaults, overridden by keyword."""
        defaults = self.config.defaults.model_dump()
        return GenerationRequest(prompt=prompt, **{**defaults, **overrides})  # type: ignore[arg-type]

    def stream(self, requests: Sequence[GenerationRequest]) -> Iterator[tuple[int, RequestOutput]]:
        """Submit all requests, then yield (index, output) per request per step until all finish."""
        ids = {self.scheduler.add_request(r): i for i, r in enumerate(requests)}
        remaining = set(ids)
        while remaining:
            for out in self.scheduler.step():
                if out.request_id in ids:
                    yield ids[out.request_id], out
                    if out.finished:
                        remaining.discard(out.request_id)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        texts = [""] * len(requests)
        tokens: list[list[int]] = [[] for _ in requests]
        results: list[GenerationResult | None] = [None] * len(requests)
        for i, out in self.stream(requests):
            texts[i] += out.new_text
            tokens[i].extend(out.new_token_ids)
            if out.finished:
                reason = out.finish_reason.value if out.finish_reason else "unknown"
                results[i] = GenerationResult(requests[i].prompt, texts[i], tokens[i], reason, out.stats)
        return [r for r in results if r is not None]
