"""Where tritonserver and the Python backend stub are, and what they need to run: a backend directory
of our own holding the stub for the running Python, and ``LD_LIBRARY_PATH`` / ``PATH`` so the stub
finds ``libpython`` and this venv (see ``/work/shared/notes/triton-on-cpu.md``)."""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from trispec.errors import TritonServerError

STUB_NAME = "triton_python_backend_stub"
# a tritonserver install tree to use instead of the wheel's (NVIDIA's images: /opt/tritonserver)
SERVER_ROOT_ENV = "SPECDEC_TRITONSERVER_ROOT"


@dataclass(frozen=True)
class TritonInstallation:
    """Paths inside the installed ``nvidia-pytriton`` wheel."""

    binary: Path
    python_backend: Path  # holds libtriton_python.so and triton_python_backend_utils.py
    stub: Path  # the Python backend stub built for the running Python version
    libs: Path  # the wheel's bundled shared libraries (nvidia_pytriton.libs)

    @classmethod
    def locate(cls) -> TritonInstallation:
        """The server in ``$SPECDEC_TRITONSERVER_ROOT`` (e.g. ``/opt/tritonserver`` in NVIDIA's Triton
        images, where the GPU build lives), else the one inside the nvidia-pytriton wheel."""
        root = os.environ.get(SERVER_ROOT_ENV)
        if root:
            return cls.from_root(Path(root))
        spec = importlib.util.find_spec("pytriton")
        if spec is None or not spec.submodule_search_locations:
            raise TritonServerError("the nvidia-pytriton wheel is not installed (it carries tritonserver)")
        package = Path(next(iter(spec.submodule_search_locations)))
        root = package / "tritonserver"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        found = cls(
            binary=root / "bin" / "tritonserver",
            python_backend=root / "backends" / "python",
            stub=root / "python_backend_stubs" / version / STUB_NAME,
            libs=package.parent / "nvidia_pytriton.libs",
        )
        for path in (found.binary, found.python_backend / "libtriton_python.so", found.stub, found.libs):
            if not path.exists():
                raise TritonServerError(f"{path} is missing from the nvidia-pytriton wheel, Python {version}")
        return found

    @classmethod
    def from_root(cls, root: Path) -> TritonInstallation:
        """A tritonserver install tree: ``bin/tritonserver``, ``backends/python/`` (the backend and its
        stub side by side) and ``lib/``."""
        python = root / "backends" / "python"
        found = cls(
            binary=root / "bin" / "tritonserver",
            python_backend=python,
            stub=python / STUB_NAME,
            libs=root / "lib",
        )
        for path in (found.binary, python / "libtriton_python.so", found.stub):
            if not path.exists():
                raise TritonServerError(f"{path} is missing (${SERVER_ROOT_ENV}={root})")
        return found


def prepare_backend_directory(directory: Path, install: TritonInstallation) -> Path:
    """Fill ``directory/python/`` with symlinks to the Python backend and the matching stub.

    Triton looks for the stub beside ``libtriton_python.so``; the wheel keeps them apart, so pointing
    ``--backend-directory`` at the wheel fails ("triton_python_backend_stub is not found").
    """
    python_dir = directory / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    sources = [
        install.python_backend / "libtriton_python.so",
        install.python_backend / "triton_python_backend_utils.py",
        install.stub,
    ]
    for source in sources:
        link = python_dir / source.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(source)
    return directory


def server_environment(install: TritonInstallation, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment tritonserver and its Python stubs need.

    The stub links libpython without an RPATH (so Python's LIBDIR goes first on LD_LIBRARY_PATH) and
    finds its prefix, hence the venv with torch and this project, from the first ``python`` on PATH.
    """
    env = dict(os.environ if base is None else base)
    lib_dirs = [sysconfig.get_config_var("LIBDIR"), str(install.libs), env.get("LD_LIBRARY_PATH", "")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(d for d in lib_dirs if d)
    bin_dirs = [os.path.dirname(sys.executable), env.get("PATH", "")]
    env["PATH"] = os.pathsep.join(d for d in bin_dirs if d)
    return env
