"""Each C kernel's report of the ISA copy it runs (``isa_level``, what ``isa_copies.require_copy`` skips
by) agrees with the CPU's own flags in /proc/cpuinfo: a skip in the kernel tests is a copy really
missing here, and a pass a copy really run. (The GGUF integer path's copies: test_gguf_q8.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from isa_copies import AVX2, AVX512, BASELINE
from required_builds import c_kernel
from trispec.c_kernels import KERNELS

# what GCC's __builtin_cpu_supports("x86-64-v3") / ("x86-64-v4") ask, as Linux names the flags
# (abm: LZCNT); usable_isa (kernel_common.h) asks exactly these levels
X86_64_V3 = {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
X86_64_V4 = X86_64_V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


def cpu_flags() -> set[str]:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return set(next(line for line in lines if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo flags to compare with")


@pytest.mark.parametrize("name", list(KERNELS), ids=lambda n: n.rsplit(".", 1)[1])
def test_the_kernel_reports_the_copies_this_cpu_has(name: str) -> None:
    kernel, flags = c_kernel(name), cpu_flags()
    assert (kernel.isa_level(AVX512) == AVX512) == (flags >= X86_64_V4), sorted(X86_64_V4 - flags)
    assert (kernel.isa_level(AVX2) == AVX2) == (flags >= X86_64_V3), sorted(X86_64_V3 - flags)
    assert kernel.isa_level(BASELINE) == BASELINE  # every x86-64 CPU runs it
    # asked for a copy, a kernel runs it or a lower one, never a higher
    assert kernel.isa_level(AVX2) in (AVX2, BASELINE) and kernel.isa_level(AVX512) in (AVX512, AVX2, BASELINE)
