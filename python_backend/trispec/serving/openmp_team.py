"""Build the model on a thread of its own, so that the serving loop's thread holds the process's only
OpenMP team.

GNU OpenMP (libgomp, torch's and our kernels') keeps a team of worker threads per thread that has
started a parallel region, until that thread exits. While the threads of all teams outnumber the CPUs
(``gomp_managed_threads > gomp_available_cpus``, libgomp team.c / wait.h), every barrier waits with a
throttled spin (100 rounds, libgomp env.c ``gomp_throttled_spin_count_var``) and then sleeps on a futex:
a wake-up per barrier, and a GGUF layer stack passes ~8 barriers a layer. Triton's stub loads the model
on its main thread, which never exits, and the loop then steps on its own thread: two teams on a 2-core
machine. Measured there (2026-12-07, a C probe of 5,000 barriers): ~1 voluntary context switch every
other barrier on the second thread's team, none where the first team's thread had exited; a decode
step 35.5 ms on the main thread, 42 ms on a second one (docs/serving.md, "One OpenMP team").
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def build_on_own_thread(build: Callable[[], T], name: str = "specdec-build") -> T:
    """``build()`` on a new thread that exits when it returns, taking its OpenMP team with it; its
    result, or its exception raised here."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(build())
        except BaseException as exc:  # handed to the caller's thread
            error.append(exc)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join()
    # join() returns before the OS thread has run its thread-local destructors (libgomp's frees the
    # team): wait until the kernel has let go of it, a millisecond or so
    task = f"/proc/self/task/{thread.native_id}"
    deadline = time.monotonic() + 1.0
    while os.path.exists(task) and time.monotonic() < deadline:
        time.sleep(0.001)
    if error:
        raise error[0]
    return result[0]
