"""Only the C extension lives here; everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "trispec.engine._paged_attention",
            sources=["python_backend/trispec/engine/csrc/paged_attention.c"],
            extra_compile_args=["-O3", "-fopenmp", "-std=gnu11"],
            extra_link_args=["-fopenmp"],
            # without a C compiler the install still succeeds; the engine then falls back to SDPA
            # (fast, but not batch-invariant) and says so in its log
            optional=True,
        )
    ]
)
