"""The offline entry point: build the whole stack from a config and run batches of prompts.

``SpeculativeLLM.from_config`` loads the tokenizer, builds the runner the config names
(``engine.kind``), and puts the scheduler and runner together in an ``LLMEngine``; ``generate``
feeds every prompt to the in-flight batcher at once and steps until all finish.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from trispec.checkpoints import load_tokenizer
from trispec.config import SpecDecConfig
from trispec.detokenize import StopTextTracker
from trispec.errors import ConfigError
from trispec.guided.compiler import GrammarCompiler
from trispec.llm_engine import LLMEngine
from trispec.request import GenerationRequest
from trispec.runners.factory import build_runner
from trispec.scheduler import RequestOutput, Scheduler
from trispec.stats import AcceptanceStats
from trispec.tokenizer import Tokenizer


@dataclass
class GenerationResult:
    prompt: str
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: AcceptanceStats
    # a sampled request's seed (given, or drawn for it): rerun with it to get the same text
    seed: int | None = None

    def to_dict(self) -> dict[str, object]:
        stats = self.stats.to_dict()
        keys = (
            "draft_tokens",
            "accepted_tokens",
            "rounds",
            "acceptance_rate",
            "mean_accepted_length",
            "mean_num_draft_tokens",
        )
        return {
            "prompt": self.prompt,
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "seed": self.seed,
            "stats": {**{k: stats[k] for k in keys}, "accepted_per_position": stats["accepted_per_position"]},
        }


class SpeculativeLLM:
    def __init__(self, engine: LLMEngine, tokenizer: Tokenizer, config: SpecDecConfig) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config

    @classmethod
    def from_config(cls, config: SpecDecConfig) -> SpeculativeLLM:
        if config.num_threads is not None:
            import torch

            torch.set_num_threads(config.num_threads)
        tokenizer = load_tokenizer(config.target, "target")
        if config.drafter.kind == "model":
            assert config.drafter.model is not None
            draft_tokenizer = load_tokenizer(config.drafter.model, "drafter.model")
            if draft_tokenizer.vocab_size != tokenizer.vocab_size:
                raise ConfigError("drafter.model.checkpoint", "draft and target tokenizers differ")
        runner = build_runner(config)
        scheduler = Scheduler(
            runner,
            config.scheduler,
            encode=tokenizer.encode,
            encode_words=lambda text: tokenizer.encode(text, add_bos=False),
            make_text_tracker=lambda stop: StopTextTracker(tokenizer, stop),
            eos_ids=tokenizer.eos_ids,
            grammars=GrammarCompiler(tokenizer.backend, tokenizer.eos_ids, runner.vocab_size),
        )
        return cls(LLMEngine(scheduler, runner), tokenizer, config)

    def request(self, prompt: str, **overrides: object) -> GenerationRequest:
        """A request with the config's generation defaults, overridden by keyword."""
        defaults = self.config.defaults.model_dump()
        return GenerationRequest(prompt=prompt, **{**defaults, **overrides})  # type: ignore[arg-type]

    def stream(self, requests: Sequence[GenerationRequest]) -> Iterator[tuple[int, RequestOutput]]:
        """Submit all requests, then yield (index, output) per request per step until all finish."""
        ids = {self.engine.add_request(r): i for i, r in enumerate(requests)}
        remaining = set(ids)
        while remaining:
            for out in self.engine.step():
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
                results[i] = GenerationResult(
                    requests[i].prompt, texts[i], tokens[i], reason, out.stats, out.seed
                )
        return [r for r in results if r is not None]
