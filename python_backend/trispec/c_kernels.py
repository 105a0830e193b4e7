"""Our C kernels (``setup.py`` compiles them) and what runs in place of one that did not build.

``setup.py`` builds them optional: an install without a C compiler or OpenMP still succeeds, and the
product falls back to torch. ``warn_missing`` says so once a process, at WARNING, naming each
missing kernel and what stands in for it (``build_transformer`` calls it for every model). The test
suite does not fall back: it fails where a kernel is missing (docs/development.md, "What the tests
need built").
"""

from __future__ import annotations

import logging
from importlib import import_module

# extension module -> what runs without it (setup.py's ext_modules are exactly these keys:
# tests/test_builds.py checks it)
KERNELS: dict[str, str] = {
    "trispec.engine.cpu._paged_attention": "attention runs on torch SDPA (not batch-invariant)",
    "trispec.engine.cpu._int8_linear": "int8 layers run torch's int8 matmul (slower, not batch-invariant)",
    "trispec.engine.cpu._gguf_linear": "`weights: gguf` is refused",
    "trispec.sampling._perturbed_argmax": "argmax, kept sets and the coupled rule run in torch (slower)",
}

logger = logging.getLogger(__name__)
_warned = False


def missing() -> dict[str, str]:
    """Each kernel that does not import here -> why (its import error)."""
    absent = {}
    for name in KERNELS:
        try:
            import_module(name)
        except ImportError as exc:
            absent[name] = str(exc)
    return absent


def warn_missing() -> None:
    """One WARNING, once a process, if any kernel is missing: which, why, and what stands in."""
    global _warned
    if _warned:
        return
    _warned = True
    absent = missing()
    if absent:
        logger.warning(
            "C kernels not built (no C compiler or OpenMP when `pip install` ran? reinstall with one): %s",
            "; ".join(f"{name} ({why}): {KERNELS[name]}" for name, why in absent.items()),
        )
