"""The CPU kernels and their Python wrappers: batch-invariant paged attention, dense (oneDNN), int8
and GGUF-block linear layers; the C sources are in ``csrc/`` (compiled by ``setup.py``).

May import: torch, ``trispec.cpu_isa``, ``trispec.errors`` and one another; never the engine above
(``trispec.engine``'s modules) or ``trispec.engine.gpu``.
"""
