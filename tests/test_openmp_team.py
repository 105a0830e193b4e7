"""The model is built on a thread of its own, so the serving loop's thread holds the only OpenMP team
(serving/openmp_team.py): a team's worker threads live until the thread that started it exits."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from trispec.serving.openmp_team import build_on_own_thread

# a torch op large enough to start a parallel region, then how many threads the process has
PROBE = """
import os, sys, time
import torch
from trispec.serving.openmp_team import build_on_own_thread
torch.set_num_threads(2)
def work():
    x = torch.ones(1 << 22)
    return float((x * 2).sum())
before = len(os.listdir("/proc/self/task"))
value = build_on_own_thread(work) if sys.argv[1] == "own" else work()
deadline = time.monotonic() + 5  # a released worker thread exits on its own time
while len(os.listdir("/proc/self/task")) > before and time.monotonic() < deadline:
    time.sleep(0.01)
print(len(os.listdir("/proc/self/task")) - before, value)
"""


def _threads_left(where: str) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, where], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    added, value = out.stdout.split()
    assert float(value) == 2.0 * (1 << 22)
    return int(added)


def test_a_team_started_on_its_own_thread_goes_with_it():
    # the main thread keeps its worker thread for the life of the process; the build's thread takes
    # its worker with it (without that, the loop's team would be a second one)
    assert _threads_left("main") >= 1
    assert _threads_left("own") == 0


def test_the_result_and_the_thread():
    main = threading.get_ident()
    assert build_on_own_thread(lambda: threading.get_ident()) != main
    assert build_on_own_thread(lambda: 41 + 1) == 42


def test_an_exception_is_raised_in_the_caller():
    def fails() -> None:
        raise ValueError("no such checkpoint")

    with pytest.raises(ValueError, match="no such checkpoint"):
        build_on_own_thread(fails)
