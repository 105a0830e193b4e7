"""Print a pip constraints file pinning every package already installed in the image.

deploy/Dockerfile installs specdec's light runtime dependencies with these constraints, so that pip can
add missing packages but never replace one that the image's TensorRT-LLM, torch or Triton depend on: a
conflict fails the image build instead of breaking TensorRT-LLM at run time. Runs with the image's
Python only (the standard library and pip's vendored ``packaging``).
"""

from __future__ import annotations

import importlib.metadata as md

from pip._vendor.packaging.version import InvalidVersion, Version


def constraints() -> list[str]:
    seen: set[str] = set()
    pins = []
    for dist in md.distributions():  # sys.path order: the copy that `import` finds comes first
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if not name or name in seen:
            continue
        seen.add(name)
        try:
            Version(dist.version)
        except InvalidVersion:  # e.g. Debian-packaged modules; pip cannot pin those
            continue
        pins.append(f"{name}=={dist.version}")
    return pins


if __name__ == "__main__":
    print("\n".join(constraints()))
