"""Only the C extensions live here; everything else is in pyproject.toml."""

from setuptools import Extension, setup


def kernel(name: str) -> Extension:
    return Extension(
        f"trispec.engine._{name}",
        sources=[f"python_backend/trispec/engine/csrc/{name}.c"],
        extra_compile_args=["-O3", "-fopenmp", "-std=gnu11"],
        extra_link_args=["-fopenmp"],
        # without a C compiler the install still succeeds; the engine then falls back to torch's
        # kernels (fast, but not batch-invariant) and says so in its log
        optional=True,
    )


setup(ext_modules=[kernel("paged_attention"), kernel("int8_linear"), kernel("gguf_linear")])
