"""specdec's Python package: speculative decoding with in-flight batching (the core behind the Triton
model). The import name is ``trispec`` because ``specdec`` on PyPI is an unrelated project."""

__version__ = "0.1.0"
