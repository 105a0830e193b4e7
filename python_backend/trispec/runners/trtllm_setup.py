"""Start the TensorRT-LLM runner from a config: read and cross-check both engines, plan one KV budget
from the GPU memory left once both engines are loaded (``kv_budget``), start the executors, warm
each one up and read back the KV cache it really got.

The draft executor starts first: TensorRT-LLM sizes an executor's KV cache when it is created, from
the memory free then (``min(max_tokens, fraction x free)``), so the smaller engine created first
always gets its planned share, and the target's cap (taken after the draft's cache) still covers its
own share when the plan is right. The measured capacities are logged beside the plan and the smaller
one is what the runner reports.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from trispec.config import SpecDecConfig
from trispec.errors import ConfigError
from trispec.runners.kv_budget import GiB, kv_budget_bytes, split_kv_budget
from trispec.runners.trtllm_engines import EngineInfo, check_pair, engine_weight_bytes, read_engine
from trispec.runners.trtllm_executor import TrtllmExecutor, worker_executable
from trispec.runners.trtllm_runner import TrtllmSpecRunner
from trispec.sampling_params import SamplingParams

logger = logging.getLogger(__name__)
WARM_UP_TIMEOUT_S = 600.0  # the first request of an executor also loads its kernels
DEFAULT_GPU_MEM_FRACTION = 0.9  # TensorRT-LLM's own (executor.h kDefaultGpuMemFraction)


def free_gpu_memory(device: int) -> int | None:
    """Free bytes on the GPU, or None without CUDA (the budget must then be given in GiB)."""
    import torch

    if not torch.cuda.is_available():
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


@dataclass(frozen=True)
class KVPlan:
    """What each executor is told: ``max_tokens`` (equal for both, None when TensorRT-LLM sizes the
    caches itself) and a ``free_gpu_memory_fraction`` each (the draft's is applied first)."""

    max_tokens: int | None
    draft_fraction: float
    target_fraction: float
    text: str


def plan_kv(config: SpecDecConfig, target: EngineInfo, draft: EngineInfo | None) -> KVPlan:
    """``trtllm.kv_cache`` (GiB, or a fraction of the GPU memory left once both engines' weights and
    runtime reserves are loaded) split between the executors. Without CUDA to read the free memory
    from, a fraction budget is left to TensorRT-LLM: the draft's executor, created first, gets its
    share of the fraction, the target the fraction of what is then left."""
    trt = config.trtllm
    assert trt is not None
    engines = [target] if draft is None else [target, draft]
    weights = sum(engine_weight_bytes(e.path) for e in engines)
    reserve = int(trt.runtime_reserve_gib * GiB) * len(engines)
    draft_bpt = draft.kv_bytes_per_token() if draft is not None else 0.0
    fraction = trt.kv_cache.gpu_fraction
    free = free_gpu_memory(trt.gpu_ids[0])
    if free is None and fraction is not None:
        share = draft_bpt / (draft_bpt + target.kv_bytes_per_token())
        text = (
            f"KV cache: sized by TensorRT-LLM (no CUDA device to read free memory from here): draft "
            f"{fraction * share:.3f} of the memory free when it starts, target {fraction:.3f} of what is "
            "then free"
        )
        return KVPlan(None, fraction * share, fraction, text)
    try:
        if free is None:
            budget: float = (trt.kv_cache.gib or 0.0) * GiB
        else:
            budget = kv_budget_bytes(
                free_bytes=free,
                weights_bytes=weights,
                reserve_bytes=reserve,
                gib=trt.kv_cache.gib,
                gpu_fraction=fraction,
            )
        split = split_kv_budget(budget, target.kv_bytes_per_token(), draft_bpt, target.tokens_per_block)
    except ValueError as exc:
        raise ConfigError("trtllm.kv_cache", str(exc)) from None
    split = dataclasses.replace(split, free_bytes=free or 0, weights_bytes=weights, reserve_bytes=reserve)
    # the fraction only caps max_tokens (TensorRT-LLM takes the smaller): with the weights counted it
    # never binds, and it keeps a wrong plan from taking the whole GPU
    cap = fraction if fraction is not None else DEFAULT_GPU_MEM_FRACTION
    return KVPlan(split.tokens, cap, cap, split.describe())


def start_runner(config: SpecDecConfig) -> TrtllmSpecRunner:
    """Read and cross-check both engines, plan the KV budget, start the executors."""
    from trispec.checkpoints import load_tokenizer
    from trispec.drafters.factory import model_free_drafter

    trt = config.trtllm
    assert trt is not None
    k = config.scheduler.max_num_draft_tokens
    target_info = read_engine(trt.target_engine_dir)
    draft_info = read_engine(trt.draft_engine_dir) if config.drafter.kind in ("model", "self") else None
    if config.drafter.with_suffix:
        raise ConfigError("drafter.with_suffix", "not available with engine.kind trtllm yet")
    problems = check_pair(draft_info, target_info, k)
    if problems:
        raise ConfigError("trtllm", "the engines do not fit together:\n  " + "\n  ".join(problems))
    plan = plan_kv(config, target_info, draft_info)
    print(f"specdec: {plan.text}", flush=True)
    logger.info("%s", plan.text)
    tokenizer = load_tokenizer(config.target, "target")
    pad_id = tokenizer.info.pad_id if tokenizer.info.pad_id is not None else tokenizer.eos_id
    common = {
        "kv_cache_tokens": plan.max_tokens,
        "device_ids": trt.gpu_ids,
        "worker_executable": worker_executable(trt.executor_worker) if trt.tp_size > 1 else None,
        "enable_chunked_context": trt.chunked_context,
    }
    draft = None
    if draft_info is not None:
        draft = TrtllmExecutor(
            trt.draft_engine_dir,
            gather_generation_logits=trt.draft_logits,
            free_gpu_memory_fraction=plan.draft_fraction,
            **common,
        )
    target = TrtllmExecutor(trt.target_engine_dir, free_gpu_memory_fraction=plan.target_fraction, **common)
    runner = TrtllmSpecRunner(
        target,
        target_info,
        draft=draft,
        drafter=model_free_drafter(config, target_info.vocab_size),
        kv_tokens=plan.max_tokens or 0,
        num_draft_tokens=k,
        draft_info=draft_info,
        end_id=tokenizer.eos_id,
        pad_id=pad_id,
        draft_logits=trt.draft_logits,
        chunked_context=trt.chunked_context,
    )
    # what no plan or measurement gives: the most the runner's sequences could hold (metrics only)
    most = target_info.max_batch_size * target_info.usable_seq_len
    runner.kv_tokens = measured_kv_tokens(plan, {"target": target, "draft": draft}, pad_id, most)
    return runner


def measured_kv_tokens(
    plan: KVPlan, executors: dict[str, TrtllmExecutor | None], pad_id: int | None, fallback: int
) -> int:
    """Run one one-token request through each executor and read the KV capacity it reports; log it
    beside the plan. An executor that cannot serve its warm-up request stops the start. The KV
    figures only feed the metrics: with neither a plan nor a reading, ``fallback`` is reported."""
    measured: dict[str, int] = {}
    for role, executor in executors.items():
        if executor is None:
            continue
        rid = executor.submit([0], 1, sampling=SamplingParams(), seed=0, end_id=-1, pad_id=pad_id)
        done = executor.collect([rid], WARM_UP_TIMEOUT_S)[rid]
        if done.error is not None:
            raise RuntimeError(f"the {role} engine failed its warm-up request: {done.error}")
        capacity = executor.kv_capacity_tokens()
        if capacity is not None:
            measured[role] = capacity
    line = ", ".join(f"{role} {tokens} tokens" for role, tokens in measured.items()) or "not reported"
    planned = f"planned {plan.max_tokens} in each" if plan.max_tokens else "sized by TensorRT-LLM"
    print(f"specdec: KV cache measured after start: {line} ({planned})", flush=True)
    logger.info("KV cache measured after start: %s (%s)", line, planned)
    if plan.max_tokens and measured and min(measured.values()) < plan.max_tokens:
        logger.warning("an executor holds less KV cache than planned: %s (%s)", line, planned)
    known = [*([plan.max_tokens] if plan.max_tokens else []), *measured.values()]
    return min(known) if known else fallback
