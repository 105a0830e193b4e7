"""The model-free drafters a config names; shared by every runner (the torch runner also builds
model drafters, which need its engines)."""

from __future__ import annotations

from trispec.config import SpecDecConfig
from trispec.drafters.base import Drafter
from trispec.drafters.ngram import NgramDrafter
from trispec.drafters.suffix import SuffixDrafter


def model_free_drafter(config: SpecDecConfig, vocab_size: int) -> Drafter | None:
    """The drafter of kind ngram or suffix; None for the other kinds."""
    drafter = config.drafter
    if drafter.kind == "ngram":
        return NgramDrafter(vocab_size, drafter.ngram.max_ngram, drafter.ngram.min_ngram)
    if drafter.kind == "suffix":
        return suffix_drafter(config, vocab_size)
    return None


def suffix_drafter(config: SpecDecConfig, vocab_size: int) -> SuffixDrafter:
    s = config.drafter.suffix
    return SuffixDrafter(
        vocab_size,
        max_depth=s.max_depth,
        max_spec_factor=s.max_spec_factor,
        min_token_prob=s.min_token_prob,
        global_tokens=s.global_tokens,
    )
