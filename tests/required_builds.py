"""What the test suite needs built or installed, and fails without (never a skip): our C kernels on an
x86-64 machine (their only target: every copy is x86 code) and the ``triton`` package where the
``test`` extra installs it (pyproject.toml: Linux x86-64). ``make test`` installs both; a kernel that
did not compile there is a broken build, which ``setup.py`` lets pass (``optional=True``, so that users
without a compiler can still install) and the product survives by falling back, but the tests must
not: a test module that needs one fails at collection, saying which and why (docs/development.md,
"What the tests need built").
"""

from __future__ import annotations

import platform
from importlib import import_module
from pathlib import Path
from types import ModuleType

import pytest
from trispec.c_kernels import KERNELS

ROOT = Path(__file__).resolve().parents[1]
# where the kernels can build (their ISA copies are AVX-512, AVX2 and x86-64 baseline code)
KERNELS_BUILD_HERE = platform.machine().lower() in ("x86_64", "amd64")
# pyproject.toml's marker on the test extra's triton
TRITON_INSTALLED_HERE = platform.system() == "Linux" and platform.machine() == "x86_64"
REBUILD = "`make venv` (or `pip install -e .`; add `-v` to see the compiler's errors)"


def kernel_sources(name: str) -> list[Path]:
    """The files a kernel is compiled from: its package's ``csrc/`` and the shared ``trispec/csrc/``
    (what the Makefile reinstalls for)."""
    package = name.rsplit(".", 1)[0].replace(".", "/")
    folders = [ROOT / "python_backend" / package / "csrc", ROOT / "python_backend/trispec/csrc"]
    return [f for folder in folders for f in sorted(folder.iterdir())]


def kernel_problem(name: str) -> str | None:
    """Why the built kernel ``name`` is unusable here (not built, or older than its sources: the last
    build of it failed, leaving the old one), or None."""
    try:
        module = import_module(name)
    except ImportError as exc:
        return f"the C kernel {name} is not built ({exc})"
    built = Path(module.__file__ or "")
    newer = [f.name for f in kernel_sources(name) if f.stat().st_mtime > built.stat().st_mtime]
    if newer:
        return (
            f"the C kernel {name} ({built.name}) is older than its sources {newer}: its last build "
            "failed or did not run"
        )
    return None


def c_kernel(name: str) -> ModuleType:
    """The built kernel ``name`` (a key of ``trispec.c_kernels.KERNELS``). Where it is missing or stale:
    a failure at collection on x86-64, a skip elsewhere (the kernels are x86 code)."""
    assert name in KERNELS, name
    problem = kernel_problem(name)
    if problem is None:
        return import_module(name)
    if not KERNELS_BUILD_HERE:
        pytest.skip(
            f"{name}: the C kernels are x86-64 code, this is {platform.machine()}", allow_module_level=True
        )
    pytest.fail(
        f"{problem}. The tests need every C kernel: rebuild with {REBUILD}. setup.py lets an install "
        "without a C compiler or OpenMP succeed without them; the product then falls back to torch, "
        "the tests do not (docs/development.md, 'What the tests need built').",
        pytrace=False,
    )


def triton() -> ModuleType:
    """The ``triton`` package: a failure at collection where the test extra installs it, a skip
    elsewhere."""
    try:
        import triton as module
    except ImportError as exc:
        missing = str(exc)
    else:
        return module
    if not TRITON_INSTALLED_HERE:
        pytest.skip(
            f"triton: the test extra installs it on Linux x86-64 only ({missing})", allow_module_level=True
        )
    pytest.fail(
        f"triton is not installed ({missing}): the test extra installs it on Linux x86-64 (`make venv`, "
        "or `pip install -e '.[test]'`; docs/development.md, 'What the tests need built').",
        pytrace=False,
    )
