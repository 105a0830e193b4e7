"""Load real weights (never pickle) as a lazy HF-named float32 state dict plus ``ModelArgs``.

Lazy: a tensor is read (and dequantised) when it is asked for and not kept, so building an engine
layer by layer holds its final weights plus one layer in flight, never a second full copy (loading
the Qwen2.5-Coder 1.5B + 0.5B pair eagerly peaked at 18.3 GB RSS for 8.5 GB of fp32 weights).

* HF layout: a directory with ``config.json`` and ``model.safetensors`` (or a sharded
  ``model.safetensors.index.json``).
* GGUF (llama.cpp): metadata -> ``ModelArgs``; every tensor dequantized to float32 with
  ``gguf.quants.dequantize`` (Q4_0/Q4_1/Q8_0/K-quants/F16/...), or, for ``weights: gguf``, a 2-D
  tensor's blocks as the file stores them (``LazyStateDict.blocks``). llama.cpp's converter permutes
  the rows of ``attn_q``/``attn_k`` for the llama architecture (its RoPE pairs adjacent dims, HF pairs
  halves); we undo that so the tensors are exactly HF's. Qwen2 files are not permuted.
"""

from __future__ import annotations

import contextlib
import functools
import json
import mmap
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np
import torch
from gguf.quants import dequantize

from trispec.engine.args import ModelArgs
from trispec.engine.cpu.gguf_linear import decode_rows
from trispec.engine.cpu.quant_blocks import QuantBlocks
from trispec.errors import ConfigError
from trispec.gguf_file import open_gguf


class LazyStateDict(Mapping[str, torch.Tensor]):
    """HF tensor name -> float32 tensor, produced by its loader on every access (nothing cached:
    callers keep what they need). Iteration lists the names without reading any tensor."""

    def __init__(
        self,
        loaders: dict[str, Callable[[], torch.Tensor]],
        row_loaders: dict[str, Callable[[int, int], torch.Tensor]] | None = None,
        block_loaders: dict[str, Callable[[], QuantBlocks]] | None = None,
        stored_loaders: dict[str, Callable[[], torch.Tensor]] | None = None,
    ) -> None:
        self._loaders = loaders
        self._stored_loaders = stored_loaders or {}
        self._row_loaders = row_loaders or {}
        self._block_loaders = block_loaders or {}

    @property
    def has_blocks(self) -> bool:
        """Whether ``blocks`` can read tensors as stored (a GGUF file)."""
        return bool(self._block_loaders)

    def blocks(self, name: str) -> QuantBlocks | None:
        """A 2-D tensor's GGUF blocks, read from the file (None: not from a GGUF file, or 1-D)."""
        loader = self._block_loaders.get(name)
        return None if loader is None else loader()

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._loaders[name]()

    def __contains__(self, name: object) -> bool:
        return name in self._loaders  # Mapping's default would read the tensor to find out

    def stored(self, name: str) -> torch.Tensor:
        """The tensor in the file's own dtype where the format has one (bf16 safetensors stay bf16:
        moved to a GPU before they are widened, no float32 copy of them on the host)."""
        loader = self._stored_loaders.get(name)
        return loader() if loader is not None else self[name]

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start, stop)`` of a 2-D tensor, reading only those where the format allows."""
        if name in self._row_loaders:
            return self._row_loaders[name](start, stop)
        return self[name][start:stop]

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaders)

    def __len__(self) -> int:
        return len(self._loaders)


StateDict = Mapping[str, torch.Tensor]


def load_checkpoint(path: str | Path) -> tuple[ModelArgs, LazyStateDict]:
    """A GGUF file or a HF safetensors directory -> (args, lazy HF-named float32 state dict)."""
    p = Path(path).resolve()
    if p.is_dir():
        return load_safetensors_dir(p)
    if p.is_file() and p.suffix == ".gguf":
        return load_gguf(p)
    if p.is_file() and p.name == "config.json":
        return load_safetensors_dir(p.parent)
    raise ConfigError("checkpoint", f"{path}: expected a .gguf file or a directory with config.json")


# -- HF safetensors -----------------------------------------------------------------------------------


def load_safetensors_dir(directory: str | Path) -> tuple[ModelArgs, LazyStateDict]:
    from safetensors import safe_open

    d = Path(directory)
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise ConfigError("checkpoint", f"{d}: no config.json")
    args = ModelArgs.from_hf_config(json.loads(cfg_path.read_text()))
    index = d / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (d / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        files = sorted(f.name for f in d.glob("*.safetensors"))
    if not files:
        raise ConfigError("checkpoint", f"{d}: no .safetensors files")
    loaders: dict[str, Callable[[], torch.Tensor]] = {}
    stored: dict[str, Callable[[], torch.Tensor]] = {}
    for f in files:
        handle = safe_open(str(d / f), framework="pt")  # memory-mapped; kept open by the loaders
        for name in handle.keys():  # noqa: SIM118 -- safe_open has keys(), not iteration
            loaders[name] = functools.partial(_read_safetensor, handle, name)
            stored[name] = functools.partial(handle.get_tensor, name)
    return args, LazyStateDict(loaders, stored_loaders=stored)


def _read_safetensor(handle: object, name: str) -> torch.Tensor:
    return handle.get_tensor(name).to(torch.float32)  # type: ignore[attr-defined]


# -- GGUF ---------------------------------------------------------------------------------------------

_GGUF_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_BLK = re.compile(r"blk\.(\d+)\.(.+)")


def gguf_to_hf_name(name: str) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``; None if unused (rope_freqs)."""
    if name in _GGUF_GLOBAL:
        return _GGUF_GLOBAL[name]
    m = _BLK.fullmatch(name)
    if m and m.group(2) in _GGUF_LAYER:
        return f"model.layers.{m.group(1)}.{_GGUF_LAYER[m.group(2)]}"
    return None


def unpermute_llama_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of llama.cpp's ``permute``: per head, rows (d0 d1)(d2 d3).. -> halves [d0 d2 ..][d1 d3 ..].

    llama.cpp: ``w.reshape(n_head, 2, dim, ...).swapaxes(1, 2)``; undo with the reverse reshape.
    """
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def dequantize_tensor(tensor: object, values_per_chunk: int = 1 << 18) -> torch.Tensor:
    """A ``gguf.ReaderTensor`` -> float32 torch tensor in PyTorch orientation ``[out, in]``."""
    shape = tuple(int(s) for s in reversed(tensor.shape))  # type: ignore[attr-defined]  # GGUF: [in, out]
    rows = _float_rows(tensor.data, tensor.tensor_type, shape[-1], values_per_chunk)  # type: ignore[attr-defined]
    return torch.from_numpy(rows.reshape(shape))


def _float_rows(data: np.ndarray, qtype: int, width: int, values_per_chunk: int = 1 << 18) -> np.ndarray:
    """A GGUF tensor's data (or some of its rows) as writable float32 ``[rows, width]``."""
    if data.ndim == 2 and data.dtype == np.uint8:
        decoded = decode_rows(data, qtype, width)
        return decoded if decoded is not None else _dequantize_rows(data, qtype, width, values_per_chunk)
    array = np.asarray(dequantize(data, qtype), dtype=np.float32).reshape(-1, width)
    # F32/F16 tensors come back as read-only views of the memory-mapped file: copy those.
    return array if array.flags.writeable and array.flags.c_contiguous else array.copy()


def _dequantize_rows(rows: np.ndarray, qtype: int, width: int, values_per_chunk: int = 1 << 18) -> np.ndarray:
    """Quantized rows (one row of blocks each) -> float32 ``[rows, width]``, a chunk of rows at a time.

    gguf's numpy dequantisation makes several full-size temporaries (2-3 GB for a 151936 x 1536
    embedding at once), so it goes a chunk at a time; and it loops in Python over groups of 16 rows,
    so each chunk goes in as one long row (rows are whole blocks): 2x faster for SmolLM2's 0.1 GB.
    """
    out = np.empty((rows.shape[0], width), dtype=np.float32)
    step = max(1, values_per_chunk // width)
    for start in range(0, rows.shape[0], step):
        chunk = rows[start : start + step]
        out[start : start + len(chunk)] = dequantize(chunk.reshape(1, -1), qtype).reshape(len(chunk), width)
    return out


def _read_gguf_rows(reader: object, tensor: object, start: int, stop: int) -> torch.Tensor:
    """Output rows ``[start, stop)`` of a 2-D GGUF tensor (GGUF stores them as its data's rows)."""
    data = tensor.data  # type: ignore[attr-defined]
    width = int(tensor.shape[0])  # type: ignore[attr-defined]  # GGUF: [in, out]
    array = _float_rows(data[start:stop], tensor.tensor_type, width)  # type: ignore[attr-defined]
    row_bytes = tensor.n_bytes // data.shape[0]  # type: ignore[attr-defined]
    _drop_pages(reader, tensor.data_offset + start * row_bytes, (stop - start) * row_bytes)  # type: ignore[attr-defined]
    return torch.from_numpy(array)


def _drop_pages(reader: object, offset: int, nbytes: int) -> None:
    """Let the kernel drop the file pages a tensor was read from: they would otherwise stay in the
    process's RSS (1.1 GB for the Qwen2.5 1.5B GGUF) until the reader goes. Clean file-backed pages:
    dropping them loses nothing; a later read (a self-draft's) just reads the file again."""
    mm = getattr(getattr(reader, "data", None), "_mmap", None)
    if mm is None or not hasattr(mm, "madvise"):
        return
    start = offset // mmap.PAGESIZE * mmap.PAGESIZE
    end = offset + nbytes
    with contextlib.suppress(OSError, ValueError):
        mm.madvise(mmap.MADV_DONTNEED, start, end - start)


def load_gguf(path: str | Path) -> tuple[ModelArgs, LazyStateDict]:
    reader = open_gguf(path)  # memory-maps the file
    args = ModelArgs.from_gguf(reader)
    # the parsed metadata (a 151936-entry vocabulary and its merges: ~0.35 GB of small objects) is
    # not needed past this point; the tokenizer comes from its own cached tokenizer.json
    reader.fields.clear()
    loaders: dict[str, Callable[[], torch.Tensor]] = {}
    row_loaders: dict[str, Callable[[int, int], torch.Tensor]] = {}
    block_loaders: dict[str, Callable[[], QuantBlocks]] = {}
    for t in reader.tensors:
        name = gguf_to_hf_name(t.name)
        if name is None:
            continue
        loaders[name] = functools.partial(_read_gguf_tensor, reader, t, args)
        if len(t.shape) == 2:
            block_loaders[name] = functools.partial(_read_gguf_blocks, reader, t, args)
        if name in ("lm_head.weight", "model.embed_tokens.weight"):  # never permuted
            row_loaders[name] = functools.partial(_read_gguf_rows, reader, t)
    if "model.embed_tokens.weight" not in loaders:
        raise ConfigError("checkpoint", f"{path}: no token_embd.weight")
    return args, LazyStateDict(loaders, row_loaders, block_loaders)


def _read_gguf_tensor(reader: object, tensor: object, args: ModelArgs) -> torch.Tensor:
    w = dequantize_tensor(tensor)
    _drop_pages(reader, tensor.data_offset, tensor.n_bytes)  # type: ignore[attr-defined]
    return _to_hf_rows(w, tensor, args)


def _to_hf_rows(w: torch.Tensor, tensor: object, args: ModelArgs) -> torch.Tensor:
    """Undo llama.cpp's row permutation of llama q/k (rows are whole output channels, so this works
    on dequantised values and on a row's blocks alike)."""
    name: str = tensor.name  # type: ignore[attr-defined]
    if args.arch == "llama" and name.endswith(("attn_q.weight", "attn_q.bias")):
        return unpermute_llama_qk(w, args.num_heads)
    if args.arch == "llama" and name.endswith(("attn_k.weight", "attn_k.bias")):
        return unpermute_llama_qk(w, args.num_kv_heads)
    return w


def _read_gguf_blocks(reader: object, tensor: object, args: ModelArgs) -> QuantBlocks:
    """A 2-D tensor's bytes, copied out of the memory map (whose pages are then dropped), one row
    of blocks per output channel."""
    rows, columns = (int(s) for s in reversed(tensor.shape))  # type: ignore[attr-defined]  # GGUF: [in, out]
    data = torch.from_numpy(np.ascontiguousarray(tensor.data).view(np.uint8).reshape(rows, -1).copy())  # type: ignore[attr-defined]
    _drop_pages(reader, tensor.data_offset, tensor.n_bytes)  # type: ignore[attr-defined]
    return QuantBlocks(int(tensor.tensor_type), _to_hf_rows(data, tensor, args).contiguous(), columns)  # type: ignore[attr-defined]
