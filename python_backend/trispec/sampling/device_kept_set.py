"""The kept set (kept_set.py's definition) on the device, at a fixed width and with no host sync, so
it can run inside a CUDA graph.

Each row takes its ``m = min(width + 1, V)`` largest values (``torch.topk``: static shapes) and
finds its threshold and tie count from them as ``find_kept_sets`` does, each row under its own
``top_k`` (0: off) and ``top_p`` (1: off). A row whose kept set cannot be told from those ``m``
values is flagged ``unfit`` instead (the graph round then takes that row's round eagerly):

* ``top_k`` above ``m``;
* top-p alone, whose nucleus takes all ``m`` candidates of a larger vocabulary (the finder would look
  further);
* top-k and top-p together, where a prefix mass lies within ``(top_k + 2) * 2^-22`` of ``top_p``: the
  definition sums the float32 softmax of exactly ``top_k`` values, here it is the softmax of ``m``
  values with those past ``top_k`` at -inf, whose sum may be added in another order (a softmax's
  order depends on its length). A float32 sum of N positive terms is within N * 2^-24 of the exact
  one in either order, so each probability, and each prefix mass, moves by less than the margin;
  away from it both keep the same tokens. (By our estimate a random top-k 50 row
  lands there about once in 10^3.)

Top-p alone uses the softmax of the whole row, as the definition does: the same numbers, no margin.
Rows with neither keep every token (threshold -inf, ties V), as ``find_kept_sets`` leaves them.
"""

from __future__ import annotations

import torch

# widest top-k / nucleus the graph path samples on the device (wider rows run eagerly that round)
GRAPH_CANDIDATES = 256
# per kept value: twice the float32 rounding of a sum in one order or another (see above)
MARGIN_PER_VALUE = 2.0**-22


def device_kept_sets(
    scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, width: int = GRAPH_CANDIDATES
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``scaled`` float32 ``[n, V]``; ``top_k`` int64 ``[n]``, ``top_p`` float64 ``[n]``. Returns the
    threshold (float32 ``[n]``), ties (int64 ``[n]``) and ``unfit`` (bool ``[n]``) of each row."""
    vocab_size = scaled.shape[-1]
    m = min(width + 1, vocab_size)
    values, ids = torch.topk(scaled, m)
    col = torch.arange(m, device=scaled.device)
    k_on = (top_k > 0) & (top_k < vocab_size)
    p_on = top_p < 1.0
    kk = torch.where(k_on, top_k, vocab_size)  # the effective top-k (V: off)
    within_k = col < kk.unsqueeze(-1)
    full = torch.softmax(scaled, dim=-1).gather(-1, ids)  # the whole row's probabilities
    cut = torch.softmax(values.masked_fill(~within_k, -torch.inf), dim=-1)  # those of the top-k values
    probs = torch.where(k_on.unsqueeze(-1), cut, full).double()
    mass_before = torch.nn.functional.pad(torch.cumsum(probs, dim=-1)[:, :-1], (1, 0))
    target = top_p.unsqueeze(-1)
    nucleus = ((mass_before < target) & within_k).sum(dim=-1).clamp(min=1)
    size = torch.where(p_on, nucleus, kk).clamp(max=m)
    threshold = values.gather(-1, (size - 1).unsqueeze(-1)).squeeze(-1)
    ties = size - (values > threshold.unsqueeze(-1)).sum(dim=-1)
    margin = (kk.clamp(max=m) + 2).double() * MARGIN_PER_VALUE
    near = ((mass_before - target).abs() <= margin.unsqueeze(-1)) & within_k
    unfit = (k_on & (top_k > m)) | (p_on & ~k_on & (nucleus >= m) & (m < vocab_size))
    unfit |= p_on & k_on & near.any(dim=-1)
    keep_all = ~k_on & ~p_on
    threshold = torch.where(keep_all, torch.full_like(threshold, -torch.inf), threshold)
    ties = torch.where(keep_all, torch.full_like(ties, vocab_size), ties)
    return threshold, ties, unfit
