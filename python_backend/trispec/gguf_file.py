"""``open_gguf``: gguf's own reader, made to read its memory map through a plain ndarray.

``gguf.GGUFReader`` slices its ``np.memmap`` once per metadata value, and a vocabulary is one value per
token and per merge (~100k slices for SmolLM2's 49k tokens). Every slice of an ``np.memmap`` runs
memmap's Python ``__array_finalize__``, which made opening the file 3x slower (3.2 s -> 1.1 s for
SmolLM2's GGUF) and dequantising its tensors 2x slower (1.5 s -> 0.8 s): every model load, every
server start paid it. The arrays it hands out are the same bytes of the same map, without the subclass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
from gguf import GGUFReader


class PlainViewGGUFReader(GGUFReader):
    # gguf 0.19, gguf_reader.py: every field, string and tensor is read through _get
    def _get(
        self, offset: int, dtype: Any, count: int = 1, override_order: Literal["I", "S", "<"] | None = None
    ) -> np.ndarray:
        plain = self.__dict__.get("_plain")
        if plain is None:
            plain = self._plain = self.data.view(np.ndarray)
        count = int(count)
        end = offset + np.dtype(dtype).itemsize * count
        array = plain[offset:end].view(dtype=dtype)[:count]
        order = self.byte_order if override_order is None else override_order
        return array.view(array.dtype.newbyteorder(order))


def open_gguf(path: str | Path, mode: Literal["r", "r+", "c"] = "r") -> GGUFReader:
    """A ``GGUFReader`` of ``path`` (memory-mapped; ``reader.data`` is still the ``np.memmap``)."""
    return PlainViewGGUFReader(str(path), mode)
