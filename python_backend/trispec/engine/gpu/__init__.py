"""The CUDA step: static-shape forward (static_step.py) over Triton paged attention
(triton_attention.py; static_attention.py its torch reference), fused layers (fused_step.py,
fused_kernels.py), CUDA graphs of whole rounds (cuda_graphs.py) and kernel launch counting
(launch_count.py). Tested on CPU under the Triton interpreter (docs/gpu.md).

May import: torch, triton, ``trispec.engine`` (the model, KV cache, ``TorchEngine``),
``trispec.sampling``; nothing below it imports this package.
"""
