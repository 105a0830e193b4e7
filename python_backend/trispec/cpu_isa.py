"""Which copy of our C kernels runs: the ISA level torch itself runs at, so that
``ATEN_CPU_CAPABILITY=avx2`` forces the AVX2 copies of ours too (how the tests check an AVX2 machine's
numbers on an AVX-512 one)."""

from __future__ import annotations

from typing import Any

import torch


def isa_level(kernel: Any) -> int:
    """512 (AVX-512), 2 (AVX2) or 0 (baseline), as ``kernel.isa_level`` lowers it to what the CPU
    runs; 0 without the kernel."""
    capability = torch.backends.cpu.get_cpu_capability()
    wanted = 512 if capability.startswith("AVX512") else 2 if capability == "AVX2" else 0
    return kernel.isa_level(wanted) if kernel is not None else 0


def q8_level(kernel: Any) -> int:
    """The GGUF kernel's integer path for torch's ISA: 512 (AVX-512 VNNI), 256 (AVX-VNNI) or 2 (AVX2),
    lowered to what the CPU runs; 0 (no integer path: the float one) without AVX2 or the kernel.
    A forced AVX2 run (``ATEN_CPU_CAPABILITY=avx2``) gets the best 256-bit copy."""
    if kernel is None or not hasattr(kernel, "q8_level"):
        return 0
    capability = torch.backends.cpu.get_cpu_capability()
    wanted = 512 if capability.startswith("AVX512") else 256 if capability == "AVX2" else 0
    return kernel.q8_level(wanted)
