"""Every Triton launch the GPU path can make, compiled ahead of time for a GPU target, on any machine.

The launches are not listed by hand: the path's own code runs on the ``meta`` device (shapes, strides
and offsets, no data) with each ``@triton.jit`` kernel of the project replaced by a recorder, so each
launch site computes its block sizes, splits and constexprs as it does on a GPU. ``GraphRound``'s
verify, draft-first and draft-next steps run for the engines given (``RoundShape``) at every ``max_k``,
fused and unfused, in every sampler mode, at one padded size per split-KV count (what a padded size
changes in a kernel; ``round_launches`` says why the rest adds nothing, and the tests check it); the
eager path's sampled rows too.

Each recorded launch is then specialised as Triton's JIT would specialise it on the device (its own
binder: argument types, the 1 / divisible-by-16 integer and pointer-alignment attributes, the options)
and compiled with ``triton.compile`` for a ``GPUTarget``: through PTX and ``ptxas`` to a cubin, on the
CPU, for sm_80 / sm_90 / sm_100. What the interpreter never checks (loop-carried types, layouts, the
shared memory a block needs) fails here. On a GPU the same compile with the device's target fills
Triton's cache under the key its JIT looks up, so a run then compiles nothing (``warm``).

Needs ``TRITON_INTERPRET`` unset when the kernel modules are imported (compiled kernels, not
interpreted ones): the CLI ``scripts/triton_aot.py`` runs in its own process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import os
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from trispec.engine.args import ModelArgs

# every module of the project that defines a @triton.jit kernel (tests check none is missing)
KERNEL_MODULES = (
    "trispec.engine.gpu.triton_attention",
    "trispec.engine.gpu.fused_kernels",
    "trispec.sampling.triton_argmax",
)
# the most shared memory a block may use (bytes): Triton's launcher refuses more (OutOfResources)
MAX_SHARED = {80: 166_912, 90: 232_448, 100: 232_448}


@dataclass(frozen=True)
class EngineShape:
    """One engine as the GPU path builds it."""

    args: ModelArgs
    dtype: torch.dtype
    block_size: int = 16
    max_context: int = 4096


@dataclass(frozen=True)
class RoundShape:
    """A ``GraphRound`` (and the eager sampled rows of its target): ``target``, an optional draft model,
    each ``max_k`` it is built with (0: plain decoding), and its padded batch sizes."""

    name: str
    target: EngineShape
    draft: EngineShape | None
    max_ks: tuple[int, ...]
    sizes: tuple[int, ...] | None = None  # None: cuda_graphs.GRAPH_BATCH_SIZES
    sampled: bool = True  # False: greedy steps only


@dataclass(frozen=True)
class Launch:
    kernel: str  # "module:name"
    args: tuple
    kwargs: tuple  # (name, value) pairs


@dataclass(frozen=True)
class Variant:
    """One compiled kernel as Triton's JIT would build it for a target (hashable, picklable)."""

    kernel: str
    arch: int
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[tuple[int, ...], Any], ...]
    attrs: tuple[tuple[tuple[int, ...], tuple[tuple[str, Any], ...]], ...]
    options: tuple[tuple[str, Any], ...]

    def describe(self) -> str:
        names = dict(self.signature)
        params = list(names)
        const = ", ".join(f"{params[p[0]]}={v}" for p, v in self.constexprs)
        warps = dict(self.options).get("num_warps")
        if warps:
            const += f", num_warps={warps}"
        return f"{self.kernel.split(':')[1]}[sm_{self.arch}]({const})"


@dataclass
class Compiled:
    variant: Variant
    seconds: float = 0.0
    shared: int = 0
    instructions: int = 0  # in the PTX
    barriers: int = 0  # bar.sync in the PTX
    error: str | None = None
    sources: list[str] = field(default_factory=list)  # which rounds launch it


def kernels() -> dict[str, Any]:
    """``"module:name"`` -> the ``JITFunction`` of every kernel in ``KERNEL_MODULES``."""
    from triton.runtime.jit import JITFunction

    found = {}
    for name in KERNEL_MODULES:
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if isinstance(value, JITFunction):
                found[f"{name}:{attr}"] = value
            elif type(value).__name__ == "InterpretedFunction":
                raise RuntimeError(
                    "TRITON_INTERPRET was set when the kernels were imported: nothing to compile"
                )
    return found


class _Recorder:
    def __init__(self, key: str, sink: list[Launch]) -> None:
        self.key, self.sink = key, sink

    def __getitem__(self, grid: object) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            self.sink.append(Launch(self.key, args, tuple(kwargs.items())))

        return launch


@contextmanager
def recording() -> Iterator[list[Launch]]:
    """Within: each kernel's launches are recorded (not run) in the list yielded."""
    sink: list[Launch] = []
    found = kernels()
    for key in found:
        setattr(importlib.import_module(key.split(":")[0]), key.split(":")[1], _Recorder(key, sink))
    try:
        yield sink
    finally:
        for key, fn in found.items():
            setattr(importlib.import_module(key.split(":")[0]), key.split(":")[1], fn)


@functools.lru_cache(maxsize=8)
def meta_engine(shape: EngineShape, layers: int = 2) -> Any:
    """A ``TorchEngine`` of ``shape`` on the meta device (weights and KV pool of the real shapes, no
    storage), built as ``TorchEngine.from_state_dict`` builds one, with at most ``layers`` decoder
    layers: every layer launches the same kernels at the same shapes, except that the fused step's
    last one ends in the final norm, so two show each launch (the tests check a third adds none)."""
    from trispec.engine.build import build_transformer
    from trispec.engine.random_weights import random_specs
    from trispec.engine.torch_engine import TorchEngine
    from trispec.engine.weights import LazyStateDict

    args = dataclasses.replace(shape.args, num_layers=min(shape.args.num_layers, layers))
    loaders = {name: (lambda s=s: torch.empty(s, device="meta")) for name, s, *_ in random_specs(args)}
    rope = max(args.max_position_embeddings, shape.max_context)
    model = build_transformer(
        args, LazyStateDict(loaders), dtype=shape.dtype, rope_length=rope, device=torch.device("meta")
    )
    blocks = -(-shape.max_context // shape.block_size)
    return TorchEngine(model, num_blocks=blocks, block_size=shape.block_size, max_context=shape.max_context)


def sampler_modes() -> list[Any]:
    """Every mode a step's graph can be captured in (``graph_plan.sampler_mode``)."""
    from trispec.sampling.graph_sampler import SamplerMode

    return [
        SamplerMode(noise=n, kept=k, log_probs=lp)
        for n in (False, True)
        for k in ((False, True) if n else (False,))
        for lp in (False, True)
    ]


def round_launches(shape: RoundShape, exhaustive: bool = False) -> list[Launch]:
    """Every launch of ``shape``'s rounds, and of the eager path's sampled rows on its target.

    Not every product of the loops is needed, and the code says why: in ``StepGraphs._step`` the
    padded size reaches a kernel only through ``splits_for`` (the buffers are prefixes of ones
    allocated at the largest size), so one size per split count is run (``split_sizes``); the layers
    do not see the sampler mode, nor the sampler the layers or the padded size, so every mode runs at
    one size on the unfused layers, and the layers (fused and unfused) greedy at every split count;
    the draft's steps do not depend on ``max_k``; two layers show every layer's launches.
    ``exhaustive`` runs the whole product, every layer (the tests check it finds nothing more)."""
    from trispec.drafters.model_drafter import ModelDrafter
    from trispec.engine.gpu.cuda_graphs import GRAPH_BATCH_SIZES
    from trispec.runners.graph_round import GraphRound
    from trispec.sampling.graph_sampler import GREEDY

    layers = 1 << 10 if exhaustive else 2
    target = meta_engine(shape.target, layers)
    draft = meta_engine(shape.draft, layers) if shape.draft is not None else None
    sizes = tuple(shape.sizes or GRAPH_BATCH_SIZES)
    modes = sampler_modes() if shape.sampled else [GREEDY]
    with recording() as launches:
        drafted = False
        for max_k in shape.max_ks:
            for fused in (False, True):
                drafter = ModelDrafter(draft) if draft is not None and max_k > 0 else None
                graphs = GraphRound(target, drafter, max_k=max_k, sizes=sizes, capture=False,
                                    attention="triton", argmax_kernel="triton", fused=fused)  # fmt: skip
                steps = [graphs.verify]
                if graphs.first is not None and (exhaustive or not drafted):
                    steps += [graphs.first, graphs.next]
                for step in steps:
                    each = sizes if exhaustive else split_sizes(sizes, step.engine.args.num_kv_heads)
                    for b_pad in each:
                        for mode in modes if exhaustive else [GREEDY]:
                            step._step(b_pad, mode)
                    if not exhaustive and not fused:
                        for mode in modes[1:]:
                            step._step(each[-1], mode)
            drafted = drafted or (draft is not None and max_k > 0)
        if shape.sampled:
            _eager_sampled_rows(target.vocab_size)
    return launches


def split_sizes(sizes: Sequence[int], num_kv_heads: int) -> list[int]:
    """The smallest padded size of each split count ``splits_for`` gives, and the largest size."""
    from trispec.engine.gpu.triton_attention import splits_for

    first: dict[int, int] = {}
    for b in sorted(sizes):
        first.setdefault(splits_for(b, num_kv_heads), b)
    return sorted({*first.values(), max(sizes)})


def _eager_sampled_rows(vocab_size: int) -> None:
    """The eager path's sampled rows on CUDA (``coupled.perturbed_argmax``): the scaled logits are a
    new float32 ``[n, V]`` tensor (``coupled.scaled_logits``)."""
    from trispec.sampling.kept_set import KeptSet
    from trispec.sampling.triton_argmax import triton_perturbed_argmax

    n = 3
    scaled = torch.empty(n, vocab_size, device="meta")
    kept = KeptSet(torch.empty(n, device="meta"), torch.empty(n, dtype=torch.int64, device="meta"))
    # its check of the tokens after the launch reads values: none on meta
    with contextlib.suppress(RuntimeError, NotImplementedError):
        triton_perturbed_argmax(scaled, kept, [1] * n, [0] * n)


def specialise(launch: Launch, arch: int, found: dict[str, Any] | None = None) -> Variant:
    """``launch`` as Triton's JIT specialises it for a CUDA device of compute capability ``arch``
    (``JITFunction.run``: its binder, then ``_pack_args``)."""
    from triton import knobs

    fn = (found or kernels())[launch.kernel]
    backend, binder = _binder(fn, arch)
    kwargs = dict(launch.kwargs)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    bound, specialization, options = binder(*launch.args, **kwargs)
    _, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return Variant(
        kernel=launch.kernel,
        arch=arch,
        signature=tuple(signature.items()),
        constexprs=tuple(sorted(constexprs.items())),
        attrs=tuple(sorted((path, tuple(map(tuple, a))) for path, a in attrs.items())),
        options=tuple(sorted(kwargs.items())),
    )


@functools.cache
def _binder(fn: Any, arch: int) -> tuple[Any, Callable]:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(GPUTarget("cuda", arch, 32))
    return backend, create_function_from_signature(fn.signature, fn.params, backend)


def compile_variant(variant: Variant) -> tuple[float, int, int, int]:
    """Compile ``variant`` (to a cubin) for its target; returns the seconds, the shared memory per
    block, and the PTX's instructions and barriers (``bar.sync``). Raises what Triton raises."""
    import time

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    target = GPUTarget("cuda", variant.arch, 32)
    fn = kernels()[variant.kernel]
    options = make_backend(target).parse_options(dict(variant.options))
    attrs = {path: [list(a) for a in pairs] for path, pairs in variant.attrs}
    t = time.perf_counter()
    src = ASTSource(fn, dict(variant.signature), dict(variant.constexprs), attrs)
    kernel = triton.compile(src, target=target, options=options.__dict__)
    ptx = kernel.asm["ptx"].splitlines()
    instructions = [
        x for x in ptx if x.startswith("\t") and not x.strip().startswith(("//", ".", "$", "{", "}"))
    ]
    barriers = sum("bar.sync" in x or "barrier.sync" in x for x in instructions)
    return time.perf_counter() - t, int(kernel.metadata.shared), len(instructions), barriers


def _compile_quietly(variant: Variant) -> tuple[float, int, int, int, str | None]:
    try:
        seconds, shared, instructions, barriers = compile_variant(variant)
    except Exception as e:  # reported with its variant, the rest still compile
        lines = traceback.format_exception_only(type(e), e)
        return 0.0, 0, 0, 0, "".join(lines).strip()[-1500:]
    limit = MAX_SHARED.get(variant.arch)
    error = None
    if limit is not None and shared > limit:
        error = f"OutOfResources: {shared} bytes of shared memory, sm_{variant.arch} has {limit}"
    return seconds, shared, instructions, barriers, error


def _worker_init() -> None:
    os.environ.pop("TRITON_INTERPRET", None)


def compile_rounds(
    shapes: Sequence[RoundShape],
    archs: Sequence[int],
    jobs: int,
    extra: Callable[[], list[Launch]] | None = None,
    on_shape: Callable[[str, int, int], None] | None = None,
    compile: bool = True,
) -> list[Compiled]:
    """Enumerate ``shapes``' launches (and ``extra()``'s) here and compile each distinct variant for
    each of ``archs`` in ``jobs`` worker processes as they are found (``compile=False``: only
    enumerate); one ``Compiled`` per variant."""
    import multiprocessing

    found = kernels()
    results: dict[Variant, Compiled] = {}
    futures: dict[Variant, Future] = {}
    sources: list[tuple[str, Callable[[], list[Launch]]]] = [
        (s.name, lambda s=s: round_launches(s)) for s in shapes
    ]
    if extra is not None:
        sources.append(("bench kernel check", extra))
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_init) if compile else None
    try:
        for name, enumerate_launches in sources:
            launches = enumerate_launches()
            new = 0
            for launch in launches:
                for arch in archs:
                    variant = specialise(launch, arch, found)
                    if variant not in results:
                        results[variant] = Compiled(variant)
                        if pool is not None:
                            futures[variant] = pool.submit(_compile_quietly, variant)
                        new += 1
                    if name not in results[variant].sources:
                        results[variant].sources.append(name)
            if on_shape is not None:
                on_shape(name, len(launches), new)
        for variant, future in futures.items():
            c = results[variant]
            try:
                c.seconds, c.shared, c.instructions, c.barriers, c.error = future.result()
            except Exception as e:  # a worker killed by an LLVM abort
                c.error = f"{type(e).__name__}: {e}"
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return list(results.values())
