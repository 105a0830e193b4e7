"""Weight-only int8 with per-output-channel scales (the "self-draft" drafter's lower precision).

``torch._weight_int8pack_mm(x, w_int8, scales)`` is a fused CPU kernel: it dequantizes on the fly
and reads 4x fewer weight bytes than fp32, which is what decode on CPU is bound by. It is only fast
with bfloat16 activations, so int8 engines run in bfloat16 by default.
"""

from __future__ import annotations

import torch


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row: ``weight ~= q * scale[:, None]``."""
    w = weight.to(torch.float32)
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale


class Int8Linear:
    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = weight  # [out, in] int8
        self.scales = scales  # [out], activation dtype
        self.bias = bias
        self.out_features = weight.shape[0]

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None, *, dtype: torch.dtype) -> Int8Linear:
        q, scale = quantize_per_channel(weight)
        return cls(q, scale.to(dtype), None if bias is None else bias.to(dtype))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch._weight_int8pack_mm(x.contiguous(), self.weight, self.scales)
        return y if self.bias is None else y + self.bias

    def dequantize(self) -> torch.Tensor:
        return self.weight.to(torch.float32) * self.scales.to(torch.float32)[:, None]
