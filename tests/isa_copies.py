"""The ISA copies of our C kernels as test parameters. A kernel is asked for a copy by its level (512
AVX-512, 2 AVX2, 0 baseline; the GGUF integer path: 512 AVX-512 VNNI, 256 AVX-VNNI, 2 AVX2) and runs
the highest one this CPU has at or below it (``kernel_common.h``, ``usable_isa``): asked for a copy
the CPU lacks, it runs a lower one without saying so. So a test id names the copy it checks, a copy
this CPU lacks is a skip naming the copy that would have run in its place (the test would compare
that copy with itself), and the baseline copy runs on every x86-64 CPU."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from trispec.engine.cpu.gguf_linear import Q8_COPIES, q8_copy

AVX512, AVX2, BASELINE = 512, 2, 0
COPIES = {AVX512: "avx512", AVX2: "avx2", BASELINE: "baseline"}
# what each copy needs (GCC's __builtin_cpu_supports levels, which usable_isa asks)
NEEDS = {AVX512: "x86-64-v4: AVX-512 F/BW/CD/DQ/VL", AVX2: "x86-64-v3: AVX2, FMA, BMI2", BASELINE: "x86-64"}
Q8_NEEDS = {512: "AVX-512 VNNI", 256: "AVX-VNNI", 2: "AVX2"}


def copies(*levels: int) -> list[Any]:
    """``levels`` (default: every copy) as parameters whose ids name them."""
    return [pytest.param(level, id=COPIES[level]) for level in levels or COPIES]


def require_copy(kernel: ModuleType, level: int) -> int:
    """``level``, if ``kernel`` runs that copy on this CPU; else the test is skipped, saying why and
    which copy would have run instead."""
    ran = kernel.isa_level(level)
    if ran != level:
        pytest.skip(
            f"this CPU lacks the {COPIES[level]} copy ({NEEDS[level]}): asked for it, "
            f"{kernel.__name__} runs its {COPIES[ran]} copy"
        )
    return level


def q8_copies(*levels: int) -> list[Any]:
    """The GGUF integer path's copies ``levels`` (default: all) as parameters whose ids name them."""
    return [pytest.param(level, id=Q8_COPIES[level]) for level in levels or Q8_COPIES]


def require_q8_copy(level: int) -> int:
    """``level``, if the GGUF integer path runs that copy on this CPU; else a skip saying which copy
    would have run instead."""
    ran = q8_copy(level)
    if ran != level:
        pytest.skip(
            f"this CPU lacks the {Q8_COPIES[level]} copy ({Q8_NEEDS[level]}): asked for it, the kernel runs "
            f"{Q8_COPIES.get(ran, 'no integer path')}"
        )
    return level
