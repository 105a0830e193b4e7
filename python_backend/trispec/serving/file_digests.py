"""SHA-256 of weight and tokenizer files, computed once per file version and cached.

Hashing a 1 GB GGUF takes seconds; a replica computes its model fingerprint at every start, so the
digest is kept in ``$SPECDEC_CACHE_DIR/file-digests.json``. The cache key (path, size, mtime in ns,
inode) only says when the stored SHA-256 is still the file's: any rewrite changes the mtime or the
inode, and then the file is hashed again. The digest itself is always a real SHA-256 of the bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path

from trispec.checkpoints import cache_dir

CACHE_FILE = "file-digests.json"
_CHUNK = 1 << 24


def sha256_of(path: Path) -> str:
    """The file's SHA-256 (hex), from the cache when the file has not changed since it was hashed."""
    path = path.resolve()
    stat = path.stat()
    key = str(path)
    version = [stat.st_size, stat.st_mtime_ns, stat.st_ino]
    cache = _load()
    entry = cache.get(key)
    if isinstance(entry, dict) and entry.get("version") == version and isinstance(entry.get("sha256"), str):
        return entry["sha256"]
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    value = digest.hexdigest()
    # read again just before writing: another replica on this machine may have added its own files
    cache = _load()
    cache[key] = {"version": version, "sha256": value}
    _store(cache)
    return value


def sha256_of_tree(root: Path) -> str:
    """One digest for every regular file under ``root`` (a Hugging Face checkpoint folder): the
    SHA-256 of each file's relative path and SHA-256, in path order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(root).as_posix()}\0{sha256_of(path)}\n".encode())
    return digest.hexdigest()


def _cache_path() -> Path:
    return cache_dir() / CACHE_FILE


def _load() -> dict[str, object]:
    try:
        data = json.loads(_cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _store(cache: dict[str, object]) -> None:
    """Atomically (a reader never sees half a file); a cache that cannot be written is only slower."""
    path = _cache_path()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=CACHE_FILE + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(cache, f, indent=0, sort_keys=True)
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
