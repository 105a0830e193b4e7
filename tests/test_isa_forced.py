"""The batch-invariance tests again (exactness of speculation among them), with every kernel's AVX2
code forced.

CI machines differ in CPU (AVX2 on some, AVX-512 with BF16 on others) and torch, oneDNN and our
attention kernel each pick their code by CPU. Running that file a second time in a child pytest
with ``ATEN_CPU_CAPABILITY=avx2`` and ``ONEDNN_MAX_CPU_ISA=AVX2`` (our kernel follows torch's
capability) means a green run on an AVX-512 machine is also a green run of the AVX2 code paths.
(Bit-equality *between* the two ISAs is not promised: only within one machine.) test_speculative_tiny.py
ran here too until 2026-11-28: what its kernels must do for its tests to pass (the same bits for a row
whatever the rows beside it, the verify's logits equal to decoding's) is what test_batch_invariance.py
checks directly, greedy and seeded speculation included.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
FILES = ["test_batch_invariance.py"]


@pytest.mark.skipif("SPECDEC_EXPECT_CPU_CAPABILITY" in os.environ, reason="already the forced run")
def test_invariance_suite_passes_with_avx2_kernels() -> None:
    env = {
        **os.environ,
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "SPECDEC_EXPECT_CPU_CAPABILITY": "AVX2",
    }
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FILES]
    run = subprocess.run(command, cwd=HERE, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    # the child really ran the tests, including the one that checks the forced ISA took effect
    assert " passed" in run.stdout and "skipped" not in run.stdout.splitlines()[-1], run.stdout[-2000:]
