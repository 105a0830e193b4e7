"""What the suffix-drafter tests (``test_suffix_index.py``, ``test_suffix_drafter.py``) share: the
vocabulary, greedy settings, a fresh drafter and its proposal, a copied span and a repetitive token
stream.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from trispec.drafters.base import DraftRequest
from trispec.drafters.suffix import SuffixDrafter
from trispec.sampling_params import SamplingParams

VOCAB = 320


GREEDY = SamplingParams()


def propose(
    drafter: SuffixDrafter, seq_id: int, tokens: Sequence[int], k: int = 8, sampling: SamplingParams = GREEDY
) -> list[int]:
    return drafter.propose([DraftRequest(seq_id, list(tokens), k, sampling, None)])[0].tokens


def fresh(tokens: Sequence[int], k: int = 8, **kw: object) -> list[int]:
    """Propose from an index built from scratch over ``tokens``."""
    drafter = SuffixDrafter(VOCAB, **kw)
    drafter.add_sequence(0, 4096)
    return propose(drafter, 0, tokens, k)


# -- the index -------------------------------------------------------------------------------------
SPAN = list(range(100, 140))  # say, a function in the prompt that the output re-types


def repetitive_stream(seed: int, length: int) -> list[int]:
    """Tokens from a 6-token alphabet with copied chunks: many matches of every length."""
    rng = random.Random(seed)
    tokens = [rng.randrange(6) for _ in range(20)]
    while len(tokens) < length:
        if rng.random() < 0.5:
            start = rng.randrange(len(tokens) - 5)
            tokens += tokens[start : start + rng.randrange(3, 15)]
        else:
            tokens += [rng.randrange(6) for _ in range(rng.randrange(1, 5))]
    return tokens[:length]
