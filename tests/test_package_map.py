"""The package map holds: who may import whom.

* Nothing in the runtime package (``trispec``) imports the build package (``trispec_build``).
* The scheduler side of the runner seam (scheduler, step plan, engine step, runner protocol) imports
  nothing from the engines, drafters, the verifier or the accept rule, and not torch: it plans with
  plain data, whatever runner executes the plan.
* Build and profile tools do not load the engine stack (torch) to find a cache or a tokenizer.
* The engine is layered by hardware path: ``engine/cpu`` (kernels) imports nothing of the engine
  above it, the engine's own modules import nothing of ``engine/gpu``.
* No two modules of our packages import each other, directly or round a loop (imports inside
  functions count: a lazy import only hides a circle).
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


PACKAGES = {
    "trispec": RUNTIME,
    "trispec_build": ROOT / "build_engines" / "trispec_build",
    "trispec_client": ROOT / "client" / "trispec_client",
    "trispec_openai": ROOT / "client" / "trispec_openai",
}


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


def _modules() -> dict[str, Path]:
    modules = {}
    for package, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of our packages it imports (``from pkg import sub`` names ``pkg.sub``;
    a compiled extension ``pkg._name`` is not a module here)."""
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(filter(None, (owner(alias.name) for alias in node.names)))
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if full in modules:
                        deps.add(full)
                    elif not (alias.name.startswith("_") and node.module in modules):
                        deps.update(filter(None, [owner(node.module)]))
        graph[module] = deps - {module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_round_a_loop() -> None:
    assert circles(import_graph()) == []


def test_the_circle_check_can_fail() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_engine_is_layered_by_hardware_path() -> None:
    graph = import_graph()
    engine = {m: deps for m, deps in graph.items() if m.startswith("trispec.engine")}
    cpu_up = {
        m: sorted(
            d for d in deps if d.startswith("trispec.engine") and not d.startswith("trispec.engine.cpu")
        )
        for m, deps in engine.items()
        if m.startswith("trispec.engine.cpu")
    }
    gpu_down = {
        m: sorted(d for d in deps if d.startswith("trispec.engine.gpu"))
        for m, deps in engine.items()
        if not m.startswith("trispec.engine.gpu")
    }
    assert engine["trispec.engine.model"], "the graph lost the engine's imports"
    assert not {m: d for m, d in cpu_up.items() if d}, "engine/cpu imports the engine above it"
    assert not {m: d for m, d in gpu_down.items() if d}, "the engine below imports engine/gpu"
