"""specdec-bench's memory rows (``bench/memory.py``): the bytes a decode step reads, per layer kind and
in all; every decode figure against the floor (bytes over the read bandwidth measured in the run); the
host time per token, a token's time through the scheduler less its forward's kernel time
(``Transformer.kernel_clock``, kept by a GGUF stack model)."""

from __future__ import annotations

import pytest
from gguf_files import random_gguf
from required_builds import c_kernel
from tiny import spec_engine, tiny_args, tiny_engine
from trispec.bench.arms import Arm
from trispec.bench.closed_loop import run_closed_loop
from trispec.bench.memory import DecodeFigure, bytes_by_kind, host_ms_per_token, memory_row, read_bandwidth
from trispec.bench.rows import row
from trispec.engine.base import ForwardInput
from trispec.engine.model import KernelClock
from trispec.engine.torch_engine import TorchEngine

needs_q8 = pytest.mark.skipif(
    c_kernel("trispec.engine.cpu._gguf_linear").q8_level(2) == 0,
    reason="the GGUF kernel's integer path needs AVX2",
)
ARGS = tiny_args(hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2, head_dim=64)


def stack_engine() -> TorchEngine:
    e = TorchEngine.from_checkpoint(
        random_gguf(ARGS, 0, mix="k"), weight_quant="gguf", num_blocks=64, block_size=8
    )
    assert e.model.stack is not None
    return e


def test_host_time_is_a_tokens_time_less_its_decode_forwards_kernels() -> None:
    # a prefill forward (111 rows) is not a decode step: left out
    host = host_ms_per_token([0.030, 0.031], [(111, 0.2), (1, 0.028), (1, 0.029)])
    assert host == {"token_ms": 30.5, "kernel_ms": 28.5, "host_ms": 2.0}
    assert host_ms_per_token([0.03], [(5, 0.02)]) is None  # no 1-row forward: nothing to subtract
    assert host_ms_per_token([], [(1, 0.02)]) is None


@needs_q8
def test_bytes_by_kind_add_up_to_what_a_step_streams() -> None:
    model = stack_engine().model
    kinds = bytes_by_kind(model)
    assert all(kinds[k] > 0 for k in ("qkv", "o", "gate_up", "down", "lm_head", "embed_row", "norms"))
    assert sum(kinds[k] for k in ("qkv", "o", "gate_up", "down", "lm_head")) == model.streamed_bytes
    assert kinds["total"] == sum(v for k, v in kinds.items() if k != "total")
    assert kinds["embed_row"] == model.embed_blocks.data.shape[1]  # one row of the file's blocks


@needs_q8
def test_figures_are_read_against_the_floor() -> None:
    model = stack_engine().model
    bandwidth = 40e9
    r = memory_row("target", model, bandwidth, [DecodeFigure("a", 100.0), DecodeFigure("b", 50.0)])
    floor_s = r["bytes"]["total"] / bandwidth
    assert r["floor_ms"] == pytest.approx(floor_s * 1e3, abs=1e-3)  # printed rounded
    assert r["figures"]["a"]["of_floor"] == pytest.approx(100.0 * floor_s, abs=1e-4)
    assert r["figures"]["b"]["ms"] == 20.0
    assert r["read_gb_s"] == 40.0 and "host" not in r


def test_the_read_bandwidth_is_measured() -> None:
    assert 1e8 < read_bandwidth(reps=3, nbytes=32 << 20) < 1e13


@needs_q8
def test_a_stack_model_clocks_its_kernels_per_forward() -> None:
    e = stack_engine()
    clock = KernelClock()
    e.model.kernel_clock = clock
    e.add_sequence(0, 32)
    e.forward([ForwardInput(0, [1, 2, 3, 4, 5], 1)])
    e.forward([ForwardInput(0, [6], 1)])
    assert [rows for rows, _ in clock.forwards] == [5, 1]
    assert all(s > 0 for _, s in clock.forwards)
    layered = tiny_engine(0)  # run layer by layer: its kernels are not a few timed calls
    layered.model.kernel_clock = clock
    clock.reset()
    layered.add_sequence(0, 32)
    layered.forward([ForwardInput(0, [1, 2], 1)])
    assert clock.forwards == []


@needs_q8
def test_the_plain_row_at_one_request_carries_its_host_time() -> None:
    e = stack_engine()
    e.model.kernel_clock = clock = KernelClock()
    result = run_closed_loop(
        spec_engine(e, None), [[5, 6, 7, 8]] * 2, concurrency=1, max_tokens=6, num_draft_tokens=0
    )
    result.kernel_forwards = list(clock.forwards)
    plain = row("w", 1, Arm("plain", None, 0, False), result, None)
    host = plain["host"]
    assert host is not None and 0 < host["kernel_ms"] < host["token_ms"]
    assert host["host_ms"] == pytest.approx(host["token_ms"] - host["kernel_ms"], abs=2e-3)
    assert row("w", 2, Arm("plain", None, 0, False), result, None)["host"] is None  # one request only
