"""trispec: speculative decoding with in-flight batching (the core behind the Triton model)."""

__version__ = "0.1.0"
