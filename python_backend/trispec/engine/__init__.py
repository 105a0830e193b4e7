"""Engines: what runs a model's forward pass and owns its KV cache, laid out by hardware path.

This folder (device-agnostic, what every path shares):
  base.py          the ``Engine`` interface runners call (``ForwardInput``, KV usage)
  torch_engine.py  ``TorchEngine``: our PyTorch engine (CPU and CUDA) behind that interface
  model.py         the transformer's forward over a packed ragged batch; batch.py its layout
  attention.py     the ``Attention`` interface, torch SDPA, the choice of backend
  kv_cache.py      paged KV blocks and their books (``BlockManager``, ``KVCache``)
  args.py          ``ModelArgs``: a checkpoint's shapes
  weights.py, random_weights.py, build.py, gguf_wiring.py: loading weights
                   (safetensors, GGUF, random) and building the model's layers from them
Subpackages:
  cpu/  the CPU kernels (C sources in cpu/csrc/) and their Python wrappers: paged attention,
        dense/int8/GGUF-block linear layers. The ground floor: imports torch, ``trispec.cpu_isa``
        and ``trispec.errors`` only, nothing of this folder or of gpu/.
  gpu/  the CUDA step: static-shape step, Triton attention and fused kernels, CUDA graphs, launch
        counting. The top floor: may import this folder, cpu/ and ``trispec.sampling``; nothing in
        this folder or cpu/ imports it.
"""
