"""The coupled rule inside a static step (CUDA graph): each logit row's token chosen on the device from
per-row buffers (temperature, top-k, top-p, seed, output position), with no host sync.

Greedy rows keep the argmax. A sampled row's token is the perturbed argmax over its kept set with the
keyed noise of its seed and position: the same formula as ``coupled.coupled_tokens``, so on the same
logits the same token. The kept set comes from ``device_kept_set.py`` (fixed width); a row whose kept
set does not fit there is reported ``-1`` where the caller asks (``flag_unfit``: the verify rows,
whose round then backs off or runs eagerly), or gets the token of its approximate set (a draft, which
only proposes). Log-probabilities, when asked, are those of ``logits_rules.log_probs_of``: the plain
softmax for greedy rows, the kept distribution for sampled ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trispec.sampling.device_kept_set import device_kept_sets
from trispec.sampling.kept_set import KeptSet
from trispec.sampling_params import SamplingParams


@dataclass(frozen=True)
class SamplerMode:
    """What a step's graph computes after the logits (one graph per mode and batch size)."""

    noise: bool = False  # some row is sampled
    kept: bool = False  # some sampled row has a top-k or top-p
    log_probs: bool = False  # some row's log-probability is asked for

    @property
    def greedy(self) -> bool:
        return not (self.noise or self.log_probs)


GREEDY = SamplerMode()


@dataclass
class SamplingRows:
    """Per logit row: how its token is chosen. The int64 fields share one buffer and the float64 ones
    another, so a host copy uploads them in two copies."""

    sampled: torch.Tensor  # int64 [R]: 1 coupled rule, 0 greedy
    top_k: torch.Tensor  # int64 [R]: 0 off
    seeds: torch.Tensor  # int64 [R]: the seed's 64 bits
    positions: torch.Tensor  # int64 [R]: the output position of the row's token (the noise's)
    temperature: torch.Tensor  # float64 [R]: 1 for greedy rows (cast to float32 as a scalar would be)
    top_p: torch.Tensor  # float64 [R]: 1 off
    flat64: torch.Tensor
    flatf: torch.Tensor

    @classmethod
    def allocate(cls, rows: int, device: torch.device, pin: bool = False) -> SamplingRows:
        flat64 = torch.zeros(4 * rows, dtype=torch.int64, device=device, pin_memory=pin)
        flatf = torch.ones(2 * rows, dtype=torch.float64, device=device, pin_memory=pin)
        ints = flat64.view(4, rows)
        floats = flatf.view(2, rows)
        return cls(ints[0], ints[1], ints[2], ints[3], floats[0], floats[1], flat64, flatf)

    def prefix(self, n: int) -> SamplingRows:
        return SamplingRows(
            self.sampled[:n],
            self.top_k[:n],
            self.seeds[:n],
            self.positions[:n],
            self.temperature[:n],
            self.top_p[:n],
            self.flat64,
            self.flatf,
        )

    def pad(self, n: int) -> None:
        """Rows ``[0, n)`` greedy, no top-k / top-p (host side)."""
        for field in (self.sampled, self.top_k, self.seeds, self.positions):
            field[:n] = 0
        self.temperature[:n] = 1.0
        self.top_p[:n] = 1.0

    def stage(self, seqs: Sequence[tuple[SamplingParams, int] | None], rows_per_seq: int) -> None:
        """Host side: sequence b's ``rows_per_seq`` rows from its settings and the output position of
        its first row (the next rows: the following positions); None (or a greedy request) leaves its
        rows greedy."""
        L = rows_per_seq
        self.pad(len(seqs) * L)
        for b, seq in enumerate(seqs):
            if seq is None or seq[0].greedy:
                continue
            sp, position = seq
            assert sp.seed is not None
            r = slice(b * L, (b + 1) * L)
            self.sampled[r] = 1
            self.top_k[r] = sp.top_k
            self.seeds[r] = sp.seed - 2**64 if sp.seed >= 2**63 else sp.seed
            self.positions[r] = torch.arange(position, position + L)
            self.temperature[r] = sp.temperature
            self.top_p[r] = sp.top_p

    def upload(self, host: SamplingRows) -> None:
        self.flat64.copy_(host.flat64, non_blocking=True)
        self.flatf.copy_(host.flatf, non_blocking=True)


def choose_tokens(
    logits: torch.Tensor,
    argmax: torch.Tensor,
    rows: SamplingRows,
    mode: SamplerMode,
    *,
    flag_unfit: bool,
    kernel: str,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logits`` ``[n, V]`` (model dtype), ``argmax`` int64 ``[n]`` -> each row's token (int64 ``[n]``)
    and, in a log-probs mode, its log-probability (float64 ``[n]``)."""
    n, vocab_size = logits.shape
    sampled = rows.sampled.bool()
    tokens = argmax
    scaled = threshold = ties = unfit = None
    if mode.noise:
        scaled = logits.float() / rows.temperature.float().unsqueeze(-1)
        if mode.kept:
            threshold, ties, unfit = device_kept_sets(scaled, rows.top_k, rows.top_p)
        else:
            threshold = torch.full((n,), -torch.inf, device=logits.device)
            ties = torch.full((n,), vocab_size, dtype=torch.int64, device=logits.device)
        drawn = perturbed_argmax_rows(scaled, threshold, ties, rows.seeds, rows.positions, kernel)
        tokens = torch.where(sampled, drawn, argmax)
        bad = tokens < 0  # nothing kept (NaN logits)
        if unfit is not None:
            bad = bad | (unfit & sampled)
        # a verify row says so (its round backs off); a draft proposes its argmax instead
        tokens = torch.where(bad, torch.full_like(tokens, -1) if flag_unfit else argmax, tokens)
    if not mode.log_probs:
        return tokens, None
    at = tokens.clamp(min=0).unsqueeze(-1)
    log_probs = torch.log_softmax(logits.float(), dim=-1).gather(-1, at).squeeze(-1)
    if mode.noise:
        assert scaled is not None and threshold is not None and ties is not None
        kept = KeptSet(threshold, ties).mask(scaled)
        probs = torch.softmax(scaled.masked_fill(~kept, -torch.inf), dim=-1)
        log_probs = torch.where(sampled, torch.log(probs.gather(-1, at).squeeze(-1)), log_probs)
    return tokens, log_probs.double()


def perturbed_argmax_rows(
    scaled: torch.Tensor,
    threshold: torch.Tensor,
    ties: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    kernel: str,
) -> torch.Tensor:
    """The perturbed argmax of every row from device tensors, without a sync: the Triton kernel
    (``triton``: CUDA, or the interpreter) or the C kernel (``c``: CPU tensors)."""
    out = torch.empty(scaled.shape[0], dtype=torch.int64, device=scaled.device)
    args = (scaled.contiguous(), threshold.float().contiguous(), ties.contiguous(), seeds.contiguous(),
            positions.contiguous(), out)  # fmt: skip
    if kernel == "triton":
        from trispec.sampling.triton_argmax import launch_perturbed_argmax

        launch_perturbed_argmax(*args)
    elif kernel == "c":
        _c_perturbed_argmax(*args)
    else:
        raise ValueError(f"unknown perturbed-argmax kernel {kernel!r} (triton, c)")
    return out


def _c_perturbed_argmax(
    scores: torch.Tensor,
    threshold: torch.Tensor,
    ties: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    out: torch.Tensor,
) -> None:
    from trispec.sampling import coupled

    if coupled._kernel is None:
        raise RuntimeError("the C sampling kernel is not built")
    n, vocab_size = scores.shape
    coupled._kernel.perturbed_argmax(
        scores.data_ptr(), n, vocab_size, scores.stride(0), threshold.data_ptr(), ties.data_ptr(),
        seeds.data_ptr(), positions.data_ptr(), out.data_ptr(), torch.get_num_threads(), coupled._ISA, 0, 0,
    )  # fmt: skip
