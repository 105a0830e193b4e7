"""Starting the TensorRT-LLM runner on a GPU it shares between two engines, over the stand-in's
simulated GPU memory (``trtllm_standin.GPU``): TensorRT-LLM sizes each executor's KV cache when the
executor is created, from what is free after that engine's weights are loaded, so the budget must
take both engines' weights off first; the capacities the executors really got are read back. Also
the executor worker for tensor parallel."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_trtllm import trtllm_yaml, write_hf
from tiny import TINY_VOCAB
from trispec.config import load_config
from trispec.errors import ConfigError
from trispec.runners import trtllm_setup
from trispec.runners.trtllm_executor import TrtllmUnavailable, worker_executable
from trispec.runners.trtllm_setup import start_runner
from trtllm_standin import write_engine

GiB = 2**30


def pair(tmp: Path, *, target_gib: float, draft_gib: float, kv_cache: str = "{gpu_fraction: 0.85}") -> Path:
    """A target and a draft engine whose rank0.engine files hold ``*_gib`` of weights, and the YAML."""
    write_hf(tmp / "target", "llama", 0)
    write_hf(tmp / "draft", "llama", 7)
    engines = tmp / "out" / "engines"
    t_bytes, d_bytes = int(target_gib * GiB), int(draft_gib * GiB)
    write_engine(
        engines / "target", vocab_size=TINY_VOCAB, seed=0, spec_mode=2, max_draft_len=8, weights_bytes=t_bytes
    )
    write_engine(engines / "draft", vocab_size=TINY_VOCAB, seed=0, noise=0.1, weights_bytes=d_bytes)
    config = trtllm_yaml(tmp, "{kind: model, model: {checkpoint: {path: draft}}}")
    config.write_text(config.read_text().replace("kv_cache: {gib: 1}", f"kv_cache: {kv_cache}"))
    return config


def reads_the_simulated_gpu(monkeypatch: pytest.MonkeyPatch, standin: object) -> None:
    monkeypatch.setattr(trtllm_setup, "free_gpu_memory", lambda device: standin.GPU.free_bytes())  # type: ignore[attr-defined]


def capacity(executor: object) -> int:
    stand_in = executor.executor  # type: ignore[attr-defined]
    return stand_in.max_num_blocks * stand_in.engine.tokens_per_block


def test_the_budget_leaves_both_engines_weights_and_neither_executor_is_starved(
    tmp_path: Path, trtllm_bindings, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    """16 GiB free, 6 + 2 GiB of engine weights, gpu_fraction 0.85: the plan is 0.85 of what stays
    free once both engines and their runtime reserves are loaded, both executors hold exactly the
    planned tokens, and the log says so. A budget taken from the 16 GiB free before loading would
    leave the second executor a fraction of its share."""
    trtllm_bindings.GPU = trtllm_bindings.SimulatedGpu(16 * GiB)
    reads_the_simulated_gpu(monkeypatch, trtllm_bindings)
    runner = start_runner(load_config(pair(tmp_path, target_gib=6, draft_gib=2)))
    out = capsys.readouterr().out
    assert "engines' weights 8.00 GiB" in out and "GPU free 16.00 GiB" in out
    planned = runner.kv_tokens
    assert capacity(runner.target) == planned and capacity(runner.draft) == planned
    assert f"target {planned} tokens, draft {planned} tokens (planned {planned} in each)" in out
    # 0.85 of (16 - 8 - 2 x 1 reserve) GiB, split over 256 + 256 KV bytes per token
    assert planned == pytest.approx(0.85 * 6 * GiB / 512, rel=0.001)
    for executor in (runner.target, runner.draft):
        kv_config = executor.executor.config.kv_cache_config
        assert kv_config.free_gpu_memory_fraction == 0.85 and kv_config.enable_block_reuse
        assert kv_config.max_tokens == planned
    assert trtllm_bindings.GPU.free_bytes() > 0


def test_a_budget_in_gib_that_cannot_fit_beside_the_weights_is_refused(
    tmp_path: Path, trtllm_bindings, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    trtllm_bindings.GPU = trtllm_bindings.SimulatedGpu(16 * GiB)
    reads_the_simulated_gpu(monkeypatch, trtllm_bindings)
    config = load_config(pair(tmp_path, target_gib=6, draft_gib=2, kv_cache="{gib: 7}"))
    with pytest.raises(ConfigError) as info:
        start_runner(config)
    assert info.value.field == "trtllm.kv_cache"
    assert "7 GiB does not fit" in info.value.message and "8.00 GiB of engine weights" in info.value.message


def test_without_a_gpu_reading_tensorrt_llm_sizes_the_caches_and_the_runner_reads_them_back(
    tmp_path: Path, trtllm_bindings, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    """No CUDA device to read free memory from (a fraction budget): the draft's executor, created
    first, gets its share of the fraction; the target the fraction of what is left; the runner uses
    the capacities they report after a warm-up request."""
    trtllm_bindings.GPU = trtllm_bindings.SimulatedGpu(16 * GiB)
    monkeypatch.setattr(trtllm_setup, "free_gpu_memory", lambda device: None)
    runner = start_runner(load_config(pair(tmp_path, target_gib=6, draft_gib=2)))
    out = capsys.readouterr().out
    assert "sized by TensorRT-LLM" in out
    draft_fraction = runner.draft.executor.config.kv_cache_config.free_gpu_memory_fraction
    assert draft_fraction == pytest.approx(0.85 / 2)  # equal KV bytes per token: half of it
    assert runner.kv_tokens == min(capacity(runner.target), capacity(runner.draft)) > 0
    assert "measured after start" in out


def test_executor_worker_from_the_config_the_image_or_the_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Orchestrator mode spawns TensorRT-LLM's worker: the configured path, else the Triton image's
    trtllmExecutorWorker, else tensorrt_llm/bin/executorWorker of the installed wheel; an empty or
    missing path is refused naming it."""
    import importlib.util

    from trispec.runners import trtllm_executor

    wheel = tmp_path / "site" / "tensorrt_llm"
    (wheel / "bin").mkdir(parents=True)
    (wheel / "bin" / "executorWorker").write_text("")
    spec = importlib.util.spec_from_loader("tensorrt_llm", loader=None, is_package=True)
    assert spec is not None
    spec.submodule_search_locations = [str(wheel)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "tensorrt_llm" else None)
    monkeypatch.setattr(
        trtllm_executor, "TRITON_IMAGE_WORKER", tmp_path / "no-image" / "trtllmExecutorWorker"
    )
    assert worker_executable(None) == wheel / "bin" / "executorWorker"
    image = tmp_path / "image" / "trtllmExecutorWorker"
    image.parent.mkdir()
    image.write_text("")
    monkeypatch.setattr(trtllm_executor, "TRITON_IMAGE_WORKER", image)
    assert worker_executable(None) == image
    assert worker_executable(wheel / "bin" / "executorWorker") == wheel / "bin" / "executorWorker"
    with pytest.raises(TrtllmUnavailable, match="does not exist"):
        worker_executable(tmp_path / "nowhere")
    with pytest.raises(TrtllmUnavailable, match="empty"):
        worker_executable(Path(""))
    monkeypatch.setattr(trtllm_executor, "TRITON_IMAGE_WORKER", tmp_path / "no-image" / "x")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(TrtllmUnavailable, match=r"set trtllm\.executor_worker"):
        worker_executable(None)


def test_an_empty_executor_worker_in_the_config_is_refused(tmp_path: Path) -> None:
    write_hf(tmp_path / "target", "llama", 0)
    with pytest.raises(ConfigError) as info:
        load_config(trtllm_yaml(tmp_path, "{kind: ngram}", ", executor_worker: ''"))
    assert info.value.field == "trtllm.executor_worker" and "empty" in info.value.message


def test_bindings_without_iteration_stats_still_start(
    tmp_path: Path, trtllm_bindings, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Neither a GPU reading nor iteration stats (older or partial bindings): the caches are left to
    TensorRT-LLM and the runner starts, reporting the most its sequences could hold."""
    monkeypatch.setattr(trtllm_setup, "free_gpu_memory", lambda device: None)
    monkeypatch.delattr(trtllm_bindings.Executor, "get_latest_iteration_stats")
    runner = start_runner(load_config(pair(tmp_path, target_gib=0, draft_gib=0)))
    assert runner.kv_tokens == runner.target_info.max_batch_size * runner.target_info.usable_seq_len
