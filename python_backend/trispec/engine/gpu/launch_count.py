"""The kernels a step's code issues, counted on any device (the CPU included) by construction.

``LaunchCounter`` is a ``TorchFunctionMode``: it sees each torch call the step makes at the Python
level (``F.rms_norm`` once, not the ops a CPU build decomposes it into) and counts a call as one
kernel when it writes memory: a new tensor that is not a view of an input, an in-place method
(``index_copy_``), or an ``out=``. Allocations (``torch.empty``), views and no-op casts count nothing.
A Triton launch counts once, through ``launch(name)`` around it in its wrapper, and the torch calls
inside it (the interpreter's, on the CPU) count nothing.

What it cannot see: a cuBLAS call that is two kernels (``addmm`` at one row copies its bias first)
or splits its reduction. The bench prints the CUDA profiler's count beside it (scripts/gpu_kernels.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty"}
_NOT_KERNELS = {"requires_grad_", "set_", "resize_", "__set__", "share_memory_"}

_active: list[LaunchCounter] = []


@contextmanager
def launch(name: str) -> Iterator[None]:
    """Around one Triton launch: counted once by an active ``LaunchCounter``."""
    counter = _active[-1] if _active else None
    if counter is None:
        yield
        return
    if not counter.depth:
        counter.names.append(name)
    counter.depth += 1
    try:
        yield
    finally:
        counter.depth -= 1


class LaunchCounter(TorchFunctionMode):
    """``with LaunchCounter() as c: step()`` then ``c.names``: one entry per kernel, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self.depth = 0

    def __enter__(self) -> LaunchCounter:
        _active.append(self)
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        _active.remove(self)
        super().__exit__(*exc)

    def __torch_function__(self, func: Any, types: Any, args: Sequence = (), kwargs: dict | None = None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if not self.depth and _writes(func, args, kwargs, result):
            self.names.append(getattr(func, "__name__", str(func)))
        return result


def _writes(func: Any, args: Sequence, kwargs: dict, result: Any) -> bool:
    name = getattr(func, "__name__", "")
    if name in _ALLOCATIONS or name in _NOT_KERNELS or not isinstance(result, torch.Tensor):
        return False
    if kwargs.get("out") is not None or (name.endswith("_") and not name.startswith("__")):
        return True
    inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    storage = _storage(result)
    return storage is None or all(_storage(a) != storage for a in inputs)


def _storage(t: torch.Tensor) -> int | None:
    if t.layout != torch.strided:  # a packed (opaque) weight: no storage to share
        return None
    try:
        return t.untyped_storage().data_ptr()
    except NotImplementedError:  # opaque implementations with a strided layout
        return None


def per_layer(names: Sequence[str], layers: int, marker: str = "attend") -> tuple[float, int]:
    """Kernels per decoder layer and outside the layers, from one step's kernel names: the span
    between the first and the last layer's ``marker`` (one per layer) divided by ``layers - 1``."""
    at = [i for i, n in enumerate(names) if marker in n]
    if layers < 2 or len(at) != layers:
        raise ValueError(f"{len(at)} {marker!r} kernels for {layers} layers")
    each = (at[-1] - at[0]) / (layers - 1)
    return each, round(len(names) - each * layers)
