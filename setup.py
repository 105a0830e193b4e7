"""Only the C extensions live here; everything else is in pyproject.toml."""

import os
import warnings

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.warnings import InformationOnly

# `pip install -e .`: the packages live in four folders (pyproject.toml, package-dir), so setuptools
# installs them through a meta path finder and says so with an "Editable installation." warning of
# ~10 lines at every install, which pip prints (setuptools, command/editable_wheel.py, _TopLevelFinder:
# InformationOnly.emit("Editable installation.", msg)). It is information only, with nothing to change;
# pip runs this file in the process that emits it.
warnings.filterwarnings("ignore", message="Editable installation", category=InformationOnly)


def kernel(name: str, package: str = "engine.cpu") -> Extension:
    folder = package.replace(".", "/")
    return Extension(
        f"trispec.{package}._{name}",
        sources=[f"python_backend/trispec/{folder}/csrc/{name}.c"],
        # kernel_common.h, shared by every kernel
        include_dirs=["python_backend/trispec/csrc"],
        # -g0: Python's own CFLAGS ask for debug info, which took 24 s of gguf_linear.c's 60 s compile
        # (the longest step of a fresh install on the 2-core machine); the code is the same without it
        extra_compile_args=["-O3", "-fopenmp", "-std=gnu11", "-g0"],
        extra_link_args=["-fopenmp"],
        # without a C compiler the install still succeeds; the engine then falls back to torch's
        # kernels (fast, but not batch-invariant) and says so in its log
        optional=True,
    )


class ParallelBuildExt(build_ext):
    """The kernels compile side by side, one a core (each has several ISA copies: most of a fresh
    install's own time)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1


setup(
    cmdclass={"build_ext": ParallelBuildExt},
    ext_modules=[
        kernel("paged_attention"),
        kernel("int8_linear"),
        kernel("gguf_linear"),
        kernel("perturbed_argmax", "sampling"),
    ],
)
