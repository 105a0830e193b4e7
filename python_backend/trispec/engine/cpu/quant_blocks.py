"""A GGUF tensor's quantised blocks as the file stores them: what the loader reads and the GGUF
kernels compute with."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class QuantBlocks:
    """A 2-D GGUF tensor as the file stores it: ``data`` holds its rows (output channels, HF order)
    as ``ggml_type`` blocks, ``data.shape == (rows, row_bytes)``; ``columns`` values per row."""

    ggml_type: int
    data: torch.Tensor  # uint8 [rows, row_bytes]
    columns: int

    @property
    def rows(self) -> int:
        return self.data.shape[0]
