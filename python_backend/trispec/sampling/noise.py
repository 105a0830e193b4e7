"""Keyed noise: for a request's seed s, output position t and token x, a Gumbel variate G(s, t, x)
that is a pure function of the three (no generator state), so that the target, a draft model and a
rerun of the request all see the same noise at the same position, whatever k, drafter or batch.

    bits(s, t, x) = word (x mod 4) of Philox4x32-10(counter = (x div 4, t mod 2^32, t div 2^32, STREAM),
                                                    key = (s mod 2^32, s div 2^32))
    u = (bits + 1/2) / 2^32,  G = -log(-log(u))   (float64)

Philox4x32-10 is the counter-based generator of Salmon et al. ("Parallel random numbers: as easy as
1, 2, 3", SC'11), the one Triton's ``tl.random.philox`` and cuRAND implement, so the CUDA kernel
(``triton_argmax.py``) draws the same bits from the same formula; the CPU kernel is
``csrc/perturbed_argmax.c``. This module is the torch version of the same formula: what the tests hold
both kernels to, and the fallback when the C kernel was not built.
"""

from __future__ import annotations

import torch

# "SPEC": this use of a request's seed, apart from any other use of the same seed
STREAM = 0x53504543
_M0, _M1 = 0xD2511F53, 0xCD9E8D57  # Philox4x32 round multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # Weyl key increments
_MASK32 = 0xFFFFFFFF


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of ``a * m`` for uint32 values held in int64 (no int64 overflow: the
    constant is split into 16-bit halves)."""
    low_half = a * (m & 0xFFFF)
    high_half = a * (m >> 16)
    mid = low_half + ((high_half & 0xFFFF) << 16)
    return (high_half >> 16) + (mid >> 32), mid & _MASK32


def philox4x32_10(counter: tuple[torch.Tensor, ...], key: tuple[int, int]) -> tuple[torch.Tensor, ...]:
    """Philox4x32-10 of int64 tensors holding uint32 counter words; returns the four output words."""
    c0, c1, c2, c3 = (c.to(torch.int64) for c in counter)
    k0, k1 = key
    for _ in range(10):
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + _W0) & _MASK32, (k1 + _W1) & _MASK32
    return c0, c1, c2, c3


def noise_bits(seed: int, position: int, token_ids: torch.Tensor) -> torch.Tensor:
    """The 32-bit word of each token id (int64 tensor of values in [0, 2^32))."""
    ids = token_ids.to(torch.int64)
    group = ids >> 2
    zeros = torch.zeros_like(group)
    counter = (group, zeros + (position & _MASK32), zeros + (position >> 32), zeros + STREAM)
    words = torch.stack(philox4x32_10(counter, (seed & _MASK32, seed >> 32)), dim=-1)
    return words.gather(-1, (ids & 3).unsqueeze(-1)).squeeze(-1)


def gumbel_of(bits: torch.Tensor) -> torch.Tensor:
    """G = -log(-log(u)) with u = (bits + 1/2) / 2^32, float64."""
    u = (bits.to(torch.float64) + 0.5) * 2.0**-32
    return -torch.log(-torch.log(u))


def gumbel(seed: int, position: int, token_ids: torch.Tensor) -> torch.Tensor:
    """G(seed, position, x) for every x in ``token_ids`` (float64)."""
    return gumbel_of(noise_bits(seed, position, token_ids))
