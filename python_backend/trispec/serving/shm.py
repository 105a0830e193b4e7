"""The Python backend's shared-memory files in /dev/shm: a unique prefix per launch, owner-only access
once the server is ready, removal after it stops, and leftovers of dead launchers."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

SHM_DIR = Path("/dev/shm")
# Every shm prefix starts with this and the launching pid, so leftovers of a dead launcher are
# recognisable (see remove_stale_shm).
SHM_PREFIX_ROOT = "specdec_"
_launch_counter = itertools.count()


def shm_prefix() -> str:
    """A shm-region prefix unique to one launch: root, launching pid, launch number."""
    return f"{SHM_PREFIX_ROOT}{os.getpid()}_{next(_launch_counter)}_"


def remove_shm(prefix: str) -> list[Path]:
    removed = []
    for path in SHM_DIR.glob(f"{prefix}*"):
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


def restrict_shm(prefix: str) -> list[Path]:
    """Owner-only access (0600) to this server's shm regions: the Python backend creates them 0644,
    so any local user could map a stub's region (its name is predictable)."""
    changed = []
    for path in SHM_DIR.glob(f"{prefix}*"):
        try:
            if path.stat().st_mode & 0o077:
                path.chmod(0o600)
                changed.append(path)
        except OSError:  # gone meanwhile, or not ours
            pass
    return changed


def remove_stale_shm() -> list[Path]:
    """Remove shm files left by earlier launchers that died without cleaning up (their pid is gone)."""
    removed = []
    for path in SHM_DIR.glob(f"{SHM_PREFIX_ROOT}*"):
        owner = path.name[len(SHM_PREFIX_ROOT) :].split("_", 1)[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            removed.extend(remove_shm(path.name))
    return removed
