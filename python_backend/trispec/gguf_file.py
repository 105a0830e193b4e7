"""``open_gguf``: gguf's own reader, made to read its memory map through a plain ndarray.

``gguf.GGUFReader`` slices its ``np.memmap`` once per metadata value, and a vocabulary is one value per
token and per merge (~100k slices for SmolLM2's 49k tokens). Every slice of an ``np.memmap`` runs
memmap's Python ``__array_finalize__``, which made opening the file 3x slower (3.2 s -> 1.1 s for
SmolLM2's GGUF) and dequantising its tensors 2x slower (1.5 s -> 0.8 s): every model load, every
server start paid it. The arrays it hands out are the same bytes of the same map, without the subclass.
Its arrays were still parsed one value at a time through the generic recursion (an enum, a ``_get`` and
list concatenation per token): an array of scalars is now read as one array and sliced, an array of
strings walked in one loop (SmolLM2's GGUF opened in 1.8 s -> 0.2 s, Qwen2.5 1.5B's 13.8 s -> 0.8 s);
the fields are the same (``tests/test_model_parity.py`` compares every part with gguf's own reader).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
from gguf import GGUFReader, GGUFValueType


class PlainViewGGUFReader(GGUFReader):
    # gguf 0.19, gguf_reader.py: every field, string and tensor is read through _get
    def _get(
        self, offset: int, dtype: Any, count: int = 1, override_order: Literal["I", "S", "<"] | None = None
    ) -> np.ndarray:
        count = int(count)
        end = offset + np.dtype(dtype).itemsize * count
        array = self._plain_view()[offset:end].view(dtype=dtype)[:count]
        order = self.byte_order if override_order is None else override_order
        return array.view(array.dtype.newbyteorder(order))

    # gguf 0.19, gguf_reader.py ``_get_field_parts``: the same (size, parts, data indices, types) for
    # an array of scalars or of strings; anything else (an array of arrays) goes the generic way
    def _get_field_parts(
        self, orig_offs: int, raw_type: int
    ) -> tuple[int, list[np.ndarray], list[int], list[GGUFValueType]]:
        if raw_type != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        item_type, count, offs = GGUFValueType(int(raw_itype[0])), int(alen[0]), orig_offs + 12
        parts: list[np.ndarray] = [raw_itype, alen]
        scalar = self.gguf_scalar_to_np.get(item_type)
        if scalar is not None:
            values = self._get(offs, scalar, count)
            parts += [values[i : i + 1] for i in range(count)]
            indices = list(range(2, 2 + count))
            offs += int(values.nbytes)
        elif item_type == GGUFValueType.STRING:
            plain = self._plain_view()
            length_type = np.dtype(np.uint64).newbyteorder(self.byte_order)
            for _ in range(count):
                length = plain[offs : offs + 8].view(length_type)
                size = int(length[0])
                parts += [length, plain[offs + 8 : offs + 8 + size]]
                offs += 8 + size
            indices = list(range(3, 2 + 2 * count, 2))
        else:
            return super()._get_field_parts(orig_offs, raw_type)
        types = [GGUFValueType.ARRAY, item_type] if count else [GGUFValueType.ARRAY]
        return offs - orig_offs, parts, indices, types

    def _plain_view(self) -> np.ndarray:
        plain = self.__dict__.get("_plain")
        if plain is None:
            plain = self._plain = self.data.view(np.ndarray)
        return plain


def open_gguf(path: str | Path, mode: Literal["r", "r+", "c"] = "r") -> GGUFReader:
    """A ``GGUFReader`` of ``path`` (memory-mapped; ``reader.data`` is still the ``np.memmap``)."""
    return PlainViewGGUFReader(str(path), mode)
