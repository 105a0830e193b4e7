"""The GGUF wiring of a build (``weights: gguf``): which tensors keep the file's own quantised
blocks (decoded inside the matmul by the GGUF kernel) and which fall back to dense float32."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import torch

from trispec.engine.cpu.linear import gguf_supported, require_gguf_kernel
from trispec.engine.cpu.quant_blocks import QuantBlocks
from trispec.errors import ConfigError

logger = logging.getLogger(__name__)


def gguf_blocks_of(
    state_dict: Mapping[str, torch.Tensor], weight_quant: str | None, dtype: torch.dtype, device: torch.device
) -> Callable[[list[str]], list[QuantBlocks] | None]:
    """For ``weight_quant="gguf"``: names -> their GGUF blocks, or None where one of them is of a type
    the kernel does not decode (that layer is built dense). Otherwise always None."""
    if weight_quant != "gguf":
        return lambda names: None
    if dtype != torch.float32 or device.type != "cpu":
        raise ConfigError("weights", "gguf weights run on the CPU with float32 activations (dtype: float32)")
    if not getattr(state_dict, "has_blocks", False):
        raise ConfigError("weights", "gguf weights need a .gguf checkpoint")
    require_gguf_kernel()
    read = state_dict.blocks  # type: ignore[attr-defined]

    def blocks_of(names: list[str]) -> list[QuantBlocks] | None:
        parts = [read(n) for n in names]
        if all(gguf_supported(b) for b in parts):
            return parts  # type: ignore[return-value]
        kinds = sorted({str(b.ggml_type) for b in parts if b is not None and not gguf_supported(b)})
        if kinds:
            logger.info(
                "%s: ggml type %s is not decoded by the GGUF kernel: dense", names[0], "/".join(kinds)
            )
        return None

    return blocks_of
