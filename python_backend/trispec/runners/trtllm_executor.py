"""The one module that calls TensorRT-LLM: its C++ executor through ``tensorrt_llm.bindings.executor``.

Written against TensorRT-LLM 1.2.x (the last releases that run TensorRT engines; later releases are
PyTorch-backend only). Everything TensorRT-LLM-shaped stays here: the runner above it speaks in
token lists. The package is imported lazily, so the torch path never needs it; without it,
``engine.kind: trtllm`` fails with one line naming the package and version.

Names used (nanobind/pybind ``cpp/tensorrt_llm/{nanobind,pybind}/executor/``; Python driver
``triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/1/model.py``): ``Executor(path,
ModelType.DECODER_ONLY, ExecutorConfig(max_beam_width, kv_cache_config, enable_chunked_context,
parallel_config, gather_generation_logits))``, ``KvCacheConfig(enable_block_reuse, max_tokens,
free_gpu_memory_fraction)``, ``ParallelConfig`` (``CommunicationMode.ORCHESTRATOR`` and
``OrchestratorConfig(is_orchestrator, worker_executable_path)`` for tensor parallel), ``Request``,
``SamplingConfig``, ``OutputConfig``, ``ExternalDraftTokensConfig``, ``enqueue_request``,
``await_responses(ids, timeout)``, ``cancel_request``, ``get_latest_iteration_stats()``,
``Response.has_error() / error_msg / result``, ``Result.output_token_ids / finish_reasons / is_final /
generation_logits / request_perf_metrics.kv_cache_metrics`` (``OutputConfig(return_perf_metrics)``),
``Request(cache_salt_id)`` (pybind/executor/request.cpp; blocks are reused only among requests with
the same salt id, mixed into the root of the reuse tree).

What the runtime does that shapes this module (read from TensorRT-LLM's source; docs/tensorrt-llm.md):
the end token is never in ``output_token_ids``, only ``finish_reasons[0] == END_ID`` says it came
(externalDraftTokensKernels.cu: "Do not increase seq len when EOS is generated"), so a completion
carries ``ended``; KV block reuse is required for a draft-tokens target and is what makes re-sending
the whole sequence every round cheap (each request reports its reused, missed and allocated blocks in
``kv_cache_metrics`` when asked: kvCacheManager.cpp ``loadOrAllocateBlocks``); the KV cache is sized
inside ``Executor(...)`` as
``min(max_tokens, fraction x free memory then)``, and its real size is only visible in the iteration
stats, read back after a warm-up request.
"""

from __future__ import annotations

import datetime
import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trispec.guided.spec import Guide
from trispec.runners.trtllm_sampling import sampling_config_kwargs
from trispec.sampling_params import SamplingParams
from trispec.step import KVCacheMetrics

SUPPORTED = "tensorrt_llm 1.2.x (engines and the executor bindings; newer releases run no engines)"
# where NVIDIA's Triton TensorRT-LLM images put the worker; the wheel ships its own under bin/
TRITON_IMAGE_WORKER = Path("/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker")


class TrtllmUnavailable(RuntimeError):
    """TensorRT-LLM is not installed (or too new to run engines)."""


def bindings() -> Any:
    try:
        import tensorrt_llm.bindings.executor as trtllm
    except ImportError as exc:
        raise TrtllmUnavailable(
            f"engine.kind trtllm needs the Python package {SUPPORTED} on a CUDA machine; "
            f"importing tensorrt_llm.bindings.executor failed: {exc}"
        ) from None
    return trtllm


def worker_executable(configured: Path | None) -> Path:
    """The MPI worker orchestrator mode spawns per GPU: ``trtllm.executor_worker`` when set, else
    NVIDIA's Triton image's ``trtllmExecutorWorker``, else ``tensorrt_llm/bin/executorWorker`` inside
    the installed wheel (which always ships it). Raises naming what was looked for."""
    if configured is not None:
        if not str(configured).strip() or str(configured) == ".":
            raise TrtllmUnavailable("trtllm.executor_worker is empty: name the worker binary or omit it")
        if not configured.is_file():
            raise TrtllmUnavailable(f"trtllm.executor_worker: {configured} does not exist")
        return configured
    candidates = [TRITON_IMAGE_WORKER]
    spec = importlib.util.find_spec("tensorrt_llm")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        candidates.append(Path(folder) / "bin" / "executorWorker")
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise TrtllmUnavailable(
        "tensor parallel needs TensorRT-LLM's executor worker; none of "
        f"{', '.join(map(str, candidates))} exists (set trtllm.executor_worker)"
    )


@dataclass(frozen=True)
class Completion:
    """What one request produced: the new tokens (input excluded, the end token never among them),
    whether it stopped on its end id, the per-token logits when asked for (``[tokens, vocab]``), or
    the executor's error."""

    tokens: list[int]
    logits: Any = None
    error: str | None = None
    ended: bool = False
    # the executor's kv_cache_metrics of the request (asked for with ``perf_metrics``)
    kv: KVCacheMetrics | None = None


@dataclass(frozen=True)
class GuidedVocab:
    """What TensorRT-LLM's guided decoder needs of the tokenizer: every token's string in id order,
    the tokenizer.json, and the ids that end a sequence."""

    encoded_vocab: list[str]
    tokenizer_str: str
    stop_token_ids: list[int]


class TrtllmExecutor:
    """One engine, one executor: submit token-list requests, collect their final results."""

    def __init__(
        self,
        engine_dir: Path,
        *,
        kv_cache_tokens: int | None,
        free_gpu_memory_fraction: float = 0.9,
        device_ids: list[int] | None = None,
        worker_executable: Path | None = None,
        gather_generation_logits: bool = False,
        enable_chunked_context: bool = True,
        guided_vocab: GuidedVocab | None = None,
    ) -> None:
        trtllm = bindings()
        self._trtllm = trtllm
        # block reuse: required for a draft-tokens target, and what makes re-sending the sequence
        # cheap (set explicitly: its default changed across releases). max_tokens is this executor's
        # share of one budget; the fraction only caps it (the smaller wins)
        kv_cache = trtllm.KvCacheConfig(
            enable_block_reuse=True,
            max_tokens=kv_cache_tokens,
            free_gpu_memory_fraction=free_gpu_memory_fraction,
        )
        kwargs: dict[str, Any] = {
            "max_beam_width": 1,
            "kv_cache_config": kv_cache,
            "enable_chunked_context": enable_chunked_context,
        }
        if device_ids and len(device_ids) > 1:
            # tensor parallel from one process: orchestrator mode, the executor spawns its MPI workers.
            # Leader mode would need one process per GPU under mpirun. As tensorrtllm_backend's
            # Python-backend model.py sets it up (get_parallel_config).
            kwargs["parallel_config"] = trtllm.ParallelConfig(
                device_ids=device_ids,
                communication_mode=trtllm.CommunicationMode.ORCHESTRATOR,
                orchestrator_config=trtllm.OrchestratorConfig(True, str(worker_executable or "")),
            )
        elif device_ids:
            kwargs["parallel_config"] = trtllm.ParallelConfig(device_ids=device_ids)
        if gather_generation_logits:
            kwargs["gather_generation_logits"] = True  # 1.x: logits are asked for at run time
        if guided_vocab is not None:
            # the runtime's own grammar engine (xgrammar) over our tokenizer, as the LLM API sets it up
            # (TRT tensorrt_llm/llmapi/tokenizer.py _xgrammar_tokenizer_info; llguidance is refused by
            # the C++ runtime: batch_manager/guidedDecoder.cpp "LLGuidance is not supported")
            kwargs["guided_decoding_config"] = trtllm.GuidedDecodingConfig(
                backend=trtllm.GuidedDecodingConfig.GuidedDecodingBackend.XGRAMMAR,
                encoded_vocab=guided_vocab.encoded_vocab,
                tokenizer_str=guided_vocab.tokenizer_str,
                stop_token_ids=guided_vocab.stop_token_ids,
            )
        config = trtllm.ExecutorConfig(**kwargs)
        self.executor = trtllm.Executor(Path(engine_dir), trtllm.ModelType.DECODER_ONLY, config)

    def submit(
        self,
        tokens: list[int],
        max_new_tokens: int,
        *,
        sampling: SamplingParams,
        seed: int,
        end_id: int,
        pad_id: int | None,
        client_id: int | None = None,
        draft_tokens: list[int] | None = None,
        draft_logits: Any = None,
        return_logits: bool = False,
        guide: Guide | None = None,
        perf_metrics: bool = False,
        cache_salt_id: int | None = None,
    ) -> int:
        """Enqueue one request (raises if the bindings refuse it). ``end_id`` -1: no end token.
        ``draft_tokens`` must not be empty: TensorRT-LLM asserts on an empty external draft
        (TRT-LLM #2684), send none instead. ``perf_metrics``: the result carries the request's
        KV-block figures. ``cache_salt_id``: its blocks are reused only among requests with the same."""
        trtllm = self._trtllm
        if draft_tokens is not None and not draft_tokens:
            raise ValueError("an external draft must hold at least one token")
        sampling_config = trtllm.SamplingConfig(beam_width=1, **sampling_config_kwargs(sampling, seed))
        output_config = trtllm.OutputConfig(
            exclude_input_from_output=True,
            return_generation_logits=return_logits,
            return_perf_metrics=perf_metrics,
        )
        external = None
        if draft_tokens:
            external = trtllm.ExternalDraftTokensConfig(draft_tokens, logits=draft_logits)
        salted = {} if cache_salt_id is None else {"cache_salt_id": cache_salt_id}
        try:
            request = trtllm.Request(
                tokens,
                max_new_tokens,
                streaming=False,
                sampling_config=sampling_config,
                output_config=output_config,
                end_id=end_id,
                pad_id=pad_id,
                external_draft_tokens_config=external,
                client_id=client_id,
                guided_decoding_params=None if guide is None else self._guided_params(guide),
                **salted,
            )
        except TypeError as exc:
            if not salted:
                raise
            raise ValueError(
                f"cache_salt: this TensorRT-LLM's executor takes no cache_salt_id ({exc}); a salted "
                "request cannot be kept apart here"
            ) from None
        return int(self.executor.enqueue_request(request))

    def _guided_params(self, guide: Guide) -> Any:
        """NVIDIA's guide types as its Triton model maps them (tensorrt_llm/1/model.py
        get_guided_decoding_params_from_request); OpenAI's json_object as the schema of any object."""
        params = self._trtllm.GuidedDecodingParams
        if guide.kind == "json_object":
            return params(guide_type=params.GuideType.JSON_SCHEMA, guide='{"type": "object"}')
        guide_type = getattr(params.GuideType, guide.kind.upper())
        return params(guide_type=guide_type, guide=guide.text or None)

    def collect(self, request_ids: list[int], timeout_s: float) -> dict[int, Completion]:
        """Wait for the final result of every request; those not final by ``timeout_s`` are cancelled
        and come back with an error."""
        pending = set(request_ids)
        done: dict[int, Completion] = {}
        deadline = time.monotonic() + timeout_s
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                for rid in pending:
                    self.cancel(rid)
                    done[rid] = Completion([], error=f"no result within {timeout_s:.0f} s (cancelled)")
                break
            wait = datetime.timedelta(milliseconds=max(1, int(min(left, 0.05) * 1000)))
            for response in self.executor.await_responses(list(pending), wait):
                for item in response if isinstance(response, list) else [response]:
                    rid = int(item.request_id)
                    if rid not in pending:
                        continue
                    if item.has_error():
                        done[rid] = Completion([], error=str(item.error_msg))
                        pending.discard(rid)
                    elif item.result.is_final:  # not streaming: only the final one carries tokens
                        done[rid] = self._completion(item.result)
                        pending.discard(rid)
        return done

    def _completion(self, result: Any) -> Completion:
        reasons = list(getattr(result, "finish_reasons", None) or [])
        reason = reasons[0] if reasons else None
        if reason == self._trtllm.FinishReason.CANCELLED:
            return Completion([], error="cancelled by the executor")
        logits = result.generation_logits
        if logits is not None and getattr(logits, "numel", lambda: 1)() == 0:
            logits = None
        ended = reason == self._trtllm.FinishReason.END_ID
        return Completion(list(result.output_token_ids[0]), logits, ended=ended, kv=_kv_metrics(result))

    def kv_capacity_tokens(self) -> int | None:
        """The KV cache the executor really holds, in tokens, from its latest iteration stats (None
        before any iteration ran, or from bindings without iteration stats)."""
        latest = getattr(self.executor, "get_latest_iteration_stats", None)
        for stats in reversed(list(latest() if latest is not None else [])):
            kv = getattr(stats, "kv_cache_stats", None)
            if kv is not None and kv.max_num_blocks:
                return int(kv.max_num_blocks) * int(kv.tokens_per_block)
        return None

    def cancel(self, request_id: int) -> None:
        self.executor.cancel_request(request_id)

    def shutdown(self) -> None:
        self.executor.shutdown()


def _kv_metrics(result: Any) -> KVCacheMetrics | None:
    """The request's ``request_perf_metrics.kv_cache_metrics`` (None when not asked for)."""
    perf = getattr(result, "request_perf_metrics", None)
    kv = getattr(perf, "kv_cache_metrics", None)
    if kv is None:
        return None
    return KVCacheMetrics(
        reused_blocks=int(kv.num_reused_blocks),
        missed_blocks=int(kv.num_missed_blocks),
        alloc_new_blocks=int(kv.num_new_allocated_blocks),
        alloc_total_blocks=int(kv.num_total_allocated_blocks),
    )
