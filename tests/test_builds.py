"""What the suite needs built (``required_builds.py``): every C kernel setup.py declares is built from
its current sources, triton is installed where the test extra installs it, and a missing one fails the
suite instead of skipping its tests; the product, which may run without them, says so in its log."""

from __future__ import annotations

import logging
import os
import runpy
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import required_builds
import setuptools
from required_builds import KERNELS_BUILD_HERE, ROOT, kernel_problem
from tiny import tiny_engine
from trispec import c_kernels
from trispec.c_kernels import KERNELS


def test_the_kernel_list_is_what_setup_py_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    given: dict[str, Any] = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: given.update(kw))
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(ROOT / "setup.py"))
    assert {ext.name for ext in given["ext_modules"]} == set(KERNELS)


@pytest.mark.skipif(not KERNELS_BUILD_HERE, reason="the C kernels are x86-64 code")
def test_every_kernel_is_built_from_its_current_sources() -> None:
    problems = [p for p in map(kernel_problem, KERNELS) if p is not None]
    assert not problems, f"{problems}: rebuild with {required_builds.REBUILD}"


def test_triton_is_installed_where_the_test_extra_installs_it() -> None:
    assert required_builds.triton().__name__ == "triton"


def test_a_kernel_older_than_its_sources_is_a_problem(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A failed rebuild leaves the old kernel in place (optional=True): caught by its age."""
    built, source = tmp_path / "_int8_linear.so", tmp_path / "int8_linear.c"
    built.write_bytes(b"")
    source.write_text("/* edited */")
    monkeypatch.setattr(required_builds, "import_module", lambda _: SimpleNamespace(__file__=built))
    monkeypatch.setattr(required_builds, "kernel_sources", lambda _: [source])
    os.utime(source, (1000, 1000))
    os.utime(built, (2000, 2000))
    assert kernel_problem("trispec.engine.cpu._int8_linear") is None
    os.utime(source, (3000, 3000))
    problem = kernel_problem("trispec.engine.cpu._int8_linear")
    assert "older than its sources ['int8_linear.c']: its last build failed" in str(problem)


# a plugin for the pytest run below: the named modules fail to import, as if never built or installed
BLOCK_IMPORTS = """
import os, sys

class Unbuilt:
    def find_spec(self, name, path=None, target=None):
        if name in os.environ["BLOCKED_MODULES"].split(","):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Unbuilt())
"""


@pytest.mark.skipif(not KERNELS_BUILD_HERE, reason="the C kernels are x86-64 code")
def test_a_missing_kernel_or_triton_fails_the_suite_with_a_reason(tmp_path: Path) -> None:
    """Collecting a kernel's tests without it, or the GPU compile's test without triton, is an error
    naming what is missing, never a skip."""
    (tmp_path / "block_imports.py").write_text(textwrap.dedent(BLOCK_IMPORTS))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "BLOCKED_MODULES": "trispec.engine.cpu._int8_linear,triton",
    }
    files = ["tests/test_int8_linear.py", "tests/test_triton_aot.py"]
    # --noconftest: collecting these two needs none of conftest.py's shared fixtures (their imports
    # cost seconds), and starts no GPU compile
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "block_imports", "-p", "no:cacheprovider", "--noconftest",
         "-n", "0", "--collect-only", "-q", *files],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert "the C kernel trispec.engine.cpu._int8_linear is not built" in out, out
    assert "triton is not installed" in out, out
    assert "skipped" not in out, out


def test_the_product_says_loudly_which_kernels_it_runs_without(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(c_kernels, "_warned", False)

    def unbuilt(name: str) -> object:  # the others built, whatever this machine has
        if name == "trispec.engine.cpu._paged_attention":
            raise ImportError("no such file")
        return SimpleNamespace()

    monkeypatch.setattr(c_kernels, "import_module", unbuilt)
    with caplog.at_level(logging.WARNING, logger="trispec.c_kernels"):
        tiny_engine()  # every model build says it, once a process
        tiny_engine(seed=1)
    warnings = [r.getMessage() for r in caplog.records if r.name == "trispec.c_kernels"]
    assert len(warnings) == 1, warnings
    assert "trispec.engine.cpu._paged_attention (no such file): attention runs on torch SDPA" in warnings[0]
    assert "_int8_linear" not in warnings[0]  # built: not named
