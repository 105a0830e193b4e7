"""The package map holds: who may import whom.

* Nothing in the runtime package (``trispec``) imports the build package (``trispec_build``).
* The scheduler side of the runner seam (scheduler, step plan, engine step, runner protocol) imports
  nothing from the engines, drafters, the verifier or the accept rule, and not torch: it plans with
  plain data, whatever runner executes the plan.
* Build and profile tools do not load the engine stack (torch) to find a cache or a tokenizer.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "python_backend" / "trispec"
SEAM = [
    "scheduler/__init__.py",
    "scheduler/intake.py",
    "scheduler/admission.py",
    "scheduler/outputs.py",
    "scheduler/scheduler.py",
    "step.py",
    "llm_engine.py",
    "runners/base.py",
    "sequence.py",
    "request.py",
]
FORBIDDEN_FOR_SEAM = ("trispec.engine", "trispec.drafters", "trispec.verifier", "trispec.accept", "torch")


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_runtime_never_imports_the_build_package() -> None:
    offenders = {
        str(p.relative_to(ROOT)): sorted(n for n in imports_of(p) if n.startswith("trispec_build"))
        for p in RUNTIME.rglob("*.py")
    }
    assert not {k: v for k, v in offenders.items() if v}


@pytest.mark.parametrize("module", SEAM)
def test_scheduler_side_of_the_seam_imports_no_engine(module: str) -> None:
    bad = sorted(n for n in imports_of(RUNTIME / module) if n.startswith(FORBIDDEN_FOR_SEAM))
    assert not bad, f"{module} imports {bad}"


@pytest.mark.parametrize(
    "module",
    ["trispec.scheduler", "trispec.llm_engine", "trispec.llm", "trispec.checkpoints", "trispec_build.cli"],
)
def test_importing_does_not_load_torch(module: str) -> None:
    code = f"import sys, {module}; sys.exit(1 if 'torch' in sys.modules else 0)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"importing {module} loads torch{run.stderr[-2000:]}"


def test_the_torch_check_can_fail() -> None:
    code = "import sys, trispec.runners.torch_runner; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 1
