"""Shared fixtures."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import aot_compile
import pytest

# fixtures shared by several test files, registered here for all of them (docs/development.md)
pytest_plugins = ["client_stand_ins", "deploy_manifests", "tiny_triton", "e2e_server", "serving_loop_sinks"]

# OpenMP threads that wait for work sleep instead of spinning: with a test worker per core (make test)
# and served models beside them, spinning threads take the cores the others need (two copies of
# test_speculative_sampling.py side by side: 209 s spinning, 86 s passive). Read when torch loads
# libgomp: before anything imports torch, and inherited by the servers the tests start.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The Triton kernels run under Triton's interpreter on a machine without a GPU; the variable is read
# when ``@triton.jit`` decorates, so it must be set before trispec.engine.gpu.triton_attention is imported.
if not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def trtllm_bindings() -> Iterator[object]:
    """Install the contract stand-in as ``tensorrt_llm.bindings.executor`` for one test (the real
    package cannot be installed here); removed afterwards so nothing else sees it."""
    import types

    import trtllm_standin

    names = ["tensorrt_llm", "tensorrt_llm.bindings", "tensorrt_llm.bindings.executor"]
    saved = {name: sys.modules.get(name) for name in names}
    package, sub = types.ModuleType("tensorrt_llm"), types.ModuleType("tensorrt_llm.bindings")
    package.bindings = sub  # type: ignore[attr-defined]
    sub.executor = trtllm_standin  # type: ignore[attr-defined]
    sys.modules.update({names[0]: package, names[1]: sub, names[2]: trtllm_standin})
    trtllm_standin.Executor.enqueued.clear()
    trtllm_standin.Executor.stalled = False
    trtllm_standin.Executor.decodes_on = True
    trtllm_standin.Executor.poisoned = set()
    trtllm_standin.GPU = trtllm_standin.SimulatedGpu()
    try:
        yield trtllm_standin
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


# The slowest files (make test's durations, 2026-11-27) start first on the xdist workers, so that the
# suite does not end on one long file (make test passes --no-loadscope-reorder: xdist keeps this
# order); the ahead-of-time compile's test goes last, by when the compile it waits for has run beside
# the rest. Never list test_server_stub_killed.py: it disturbs the server the test_server_*.py files
# share and must come after them (docs/development.md, "Running the tests").
SLOWEST_FIRST = (
    "test_speculative_real.py",
    "test_resume.py",
    "test_speculative_sampling.py",
    "test_server_streams.py",
    "test_soak.py",
    "test_isa_forced.py",
    "test_bls_peer.py",
    "test_retryable_refusals.py",
    "test_server_stall.py",
    "test_gpu_spec_bench.py",
    "test_supervisor.py",
    "test_bench.py",
    "test_speculative_tiny.py",
    "test_hf_export.py",
)
LAST = ("test_triton_aot.py",)


# The files that share the session's served model (``e2e_server``): one work unit under xdist, so that
# one worker starts that server once instead of each worker that runs one of them (a start costs
# ~9 CPU-s); test_server_stub_killed.py still sorts after the others within it.
SHARED_SERVER_FILES = frozenset(
    (
        "test_server_streams.py",
        "test_server_cancel.py",
        "test_server_guided.py",
        "test_server_refusals.py",
        "test_server_prefix_reset.py",
        "test_server_stub_killed.py",
    ),
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    if config.getoption("dist") != "loadfile":
        return None  # xdist's own for any other --dist
    from xdist.scheduler import LoadFileScheduling

    class SharedServerScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "e2e_server" if scope.rsplit("/", 1)[-1] in SHARED_SERVER_FILES else scope

    return SharedServerScheduling(config, log)  # type: ignore[arg-type]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    last = len(rank) + 1

    def order(item: pytest.Item) -> int:
        return last if item.path.name in LAST else rank.get(item.path.name, len(rank))

    items.sort(key=order)  # stable: the other files and every file's own tests keep their order


def pytest_collection_finish(session: pytest.Session) -> None:
    # the GPU compile of every Triton kernel runs beside the suite, niced (tests/aot_compile.py); an
    # xdist worker reads the one its controller started
    workerinput = getattr(session.config, "workerinput", None)
    if workerinput is not None and aot_compile.WORKDIR_KEY in workerinput:
        aot_compile.follow(workerinput[aot_compile.WORKDIR_KEY])
    elif workerinput is None and any(item.nodeid.endswith(aot_compile.TEST) for item in session.items):
        aot_compile.start()


def pytest_configure(config: pytest.Config) -> None:
    # Under xdist (the controller, before its workers start): each worker, and each server it starts,
    # runs one OpenMP thread: with more workers than cores, two threads each only fought over the
    # cores (test_speculative_real.py alone on the 2-core machine: 197 CPU-s with two threads, 162
    # with one). A run without workers keeps torch's default.
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # type: ignore[no-untyped-def]
    node.workerinput[aot_compile.WORKDIR_KEY] = str(aot_compile.workdir())


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:  # type: ignore[no-untyped-def]
    if any(nodeid.endswith(aot_compile.TEST) for nodeid in ids):
        aot_compile.start()  # once: the first worker to report


def pytest_sessionfinish(session: pytest.Session) -> None:
    aot_compile.stop()
