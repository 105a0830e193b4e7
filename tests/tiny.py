"""Tiny, seeded, random-initialised models and a byte-level tokenizer for fast tests."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import tokenizers
import torch
from tokenizers import decoders, models, pre_tokenizers
from trispec.config import SchedulerConfig
from trispec.detokenize import StopTextTracker
from trispec.drafters.base import Drafter
from trispec.drafters.model_drafter import ModelDrafter
from trispec.engine.args import ModelArgs
from trispec.engine.base import ForwardInput
from trispec.engine.torch_engine import TorchEngine
from trispec.llm_engine import LLMEngine
from trispec.runners.torch_runner import TorchSpecRunner
from trispec.scheduler import RequestOutput, Scheduler
from trispec.tokenizer import Tokenizer

if TYPE_CHECKING:
    from trispec.engine.gpu.cuda_graphs import StepGraphs

TINY_VOCAB = 320  # 256 byte tokens + room for ids the tokenizer never produces


def tiny_args(arch: str = "llama", vocab_size: int = TINY_VOCAB, **overrides: Any) -> ModelArgs:
    """A tiny config; tests vary theta, tying, depth etc. through ``overrides``."""
    args = ModelArgs(
        arch=arch,
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_embeddings=False,
        attention_bias=arch == "qwen2",
        max_position_embeddings=1024,
    )
    return dataclasses.replace(args, **overrides)


def repeating_prompts(n: int, seed: int = 1) -> list[list[int]]:
    """Token prompts made of a random fragment repeated 1-3 times, so that model-free drafters
    (n-gram, suffix) find matches."""
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randrange(3, 12))] * rng.randrange(1, 4) for _ in range(n)]


def tiny_engine(seed: int = 0, arch: str = "llama", **kw: object) -> TorchEngine:
    kw.setdefault("num_blocks", 256)
    kw.setdefault("block_size", 8)
    return TorchEngine.from_random(tiny_args(arch), seed, **kw)


def stage_feeds(engine: TorchEngine, graphs: StepGraphs, feeds: Sequence[Sequence[int]]) -> int:
    """Sequence ``i`` (already in ``engine``) feeds ``feeds[i]`` after its cached tokens: its blocks
    reserved, its rows staged and uploaded into ``graphs``; returns the padded batch size."""
    from trispec.engine.gpu.cuda_graphs import SeqRows  # the graph path's modules, only where used

    seqs = []
    for i, feed in enumerate(feeds):
        start = engine.cached_length(i)
        engine.blocks.append(i, len(feed))
        seqs.append(SeqRows(feed, start, engine.blocks.block_table(i)))
    b_pad = graphs.stage(seqs)
    graphs.upload()
    return b_pad


def byte_tokenizer() -> Tokenizer:
    """Byte-level BPE with no merges: one token per byte, so multi-byte characters span tokens."""
    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(byte_chars))}
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return Tokenizer(tok, eos_ids=frozenset())


def ascii_tokenizer(vocab_size: int = TINY_VOCAB) -> Tokenizer:
    """Every id decodes to printable ASCII (one char, or two for ids past the 95 single chars), so
    text from a random model is readable and stop strings can span tokens."""
    chars = [chr(c) for c in range(32, 127)]
    merges = [(a, b) for a in "etaoinsrhl" for b in "etaoinsrhlducmwyfgpbvkjxqz"][: vocab_size - len(chars)]
    vocab = {tok: i for i, tok in enumerate(chars + [a + b for a, b in merges])}
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.decoder = decoders.Fuse()
    return Tokenizer(tok, eos_ids=frozenset())


def spec_engine(
    target: TorchEngine,
    drafter: Drafter | None,
    tokenizer: Tokenizer | None = None,
    **config: object,
) -> LLMEngine:
    """Scheduler + torch runner over ``target`` and ``drafter``, as ``SpeculativeLLM`` wires them
    (``sampling_rule``: the runner's, "coupled" by default; the rest: ``SchedulerConfig``)."""
    tokenizer = tokenizer or byte_tokenizer()
    # adaptive speculation chooses by measured time: tests pin it off unless they are about it
    config.setdefault("adaptive_speculation", False)
    sampling_rule = str(config.pop("sampling_rule", "coupled"))
    runner = TorchSpecRunner(target, drafter, sampling_rule=sampling_rule)
    scheduler = Scheduler(
        runner,
        SchedulerConfig(**config),
        encode=tokenizer.encode,
        make_text_tracker=lambda stop: StopTextTracker(tokenizer, stop),
        eos_ids=tokenizer.eos_ids,
    )
    return LLMEngine(scheduler, runner)


def model_drafter(seed: int = 0, **kw: object) -> ModelDrafter:
    return ModelDrafter(tiny_engine(seed, **kw))


def reference_greedy(prompt: list[int], max_tokens: int, seed: int = 0) -> list[int]:
    """Target-only greedy decoding, one token per forward, on a fresh tiny engine: the reference
    that speculative output must equal, independent of the scheduler and the runner."""
    engine = tiny_engine(seed)
    engine.add_sequence(0, len(prompt) + max_tokens)
    logits = engine.forward([ForwardInput(0, prompt, 1)])[0]
    out: list[int] = []
    for _ in range(max_tokens):
        out.append(int(torch.argmax(logits[-1])))
        logits = engine.forward([ForwardInput(0, out[-1:], 1)])[0]
    return out


def run_to_completion(llm: LLMEngine, max_steps: int = 10_000) -> dict[int, list[RequestOutput]]:
    """Step until idle; outputs grouped by request id."""
    outputs: dict[int, list[RequestOutput]] = {}
    for _ in range(max_steps):
        if not llm.has_work():
            return outputs
        for out in llm.step():
            outputs.setdefault(out.request_id, []).append(out)
    raise AssertionError("the engine did not finish")


def tokens_of(outputs: Sequence[RequestOutput]) -> list[int]:
    return [t for out in outputs for t in out.new_token_ids]


class FaultyEngine:
    """A real engine that raises whenever a poisoned sequence is in the forward batch."""

    def __init__(self, engine: TorchEngine, poisoned: set[int]) -> None:
        self.engine = engine
        self.poisoned = poisoned
        self.failures = 0

    def forward(self, inputs: Sequence[ForwardInput]) -> list[torch.Tensor]:
        if any(inp.seq_id in self.poisoned for inp in inputs):
            self.failures += 1
            raise RuntimeError("simulated device fault")
        return self.engine.forward(inputs)

    def __getattr__(self, name: str) -> object:
        return getattr(self.engine, name)
