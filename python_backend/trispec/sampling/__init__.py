"""Sampling: what a request's settings keep (kept_set.py), the keyed noise (noise.py), the coupled
rule that samples with it (coupled.py), and the distributions the rejection rule and TensorRT-LLM's
draft logits need (probs.py)."""

from trispec.sampling.coupled import coupled_tokens, perturbed_argmax, scaled_logits
from trispec.sampling.kept_set import KeptSet, find_kept_sets, full_sort_kept_mask
from trispec.sampling.probs import filtered_logits, logits_to_probs, make_generator, one_hot_probs, sample
from trispec.sampling_params import SamplingParams

__all__ = [
    "KeptSet",
    "SamplingParams",
    "coupled_tokens",
    "filtered_logits",
    "find_kept_sets",
    "full_sort_kept_mask",
    "logits_to_probs",
    "make_generator",
    "one_hot_probs",
    "perturbed_argmax",
    "sample",
    "scaled_logits",
]
