"""The one module that calls TensorRT-LLM: its C++ executor through ``tensorrt_llm.bindings.executor``.

Written against the documented API of TensorRT-LLM 1.2.x (the last releases that run TensorRT
engines; later releases are PyTorch-backend only). Everything TensorRT-LLM-shaped stays here: the
runner above it speaks in token lists. The package is imported lazily, so the torch path never
needs it; without it, ``engine.kind: trtllm`` fails with one line naming the package and version.

Names used (pybind ``cpp/tensorrt_llm/pybind/executor/``; Python driver
``triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/1/model.py``): ``Executor(path,
ModelType.DECODER_ONLY, ExecutorConfig)``, ``KvCacheConfig``, ``ParallelConfig`` (with
``CommunicationMode.ORCHESTRATOR`` and ``OrchestratorConfig(is_orchestrator, worker_path)`` for
tensor parallel), ``Request``,
``SamplingConfig``, ``OutputConfig``, ``ExternalDraftTokensConfig``, ``enqueue_request``,
``await_responses``, ``cancel_request``, ``Response.has_error() / error_msg / result``,
``Result.output_token_ids / is_final / generation_logits``.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trispec.sampling_params import SamplingParams

SUPPORTED = "tensorrt_llm 1.2.x (engines and the executor bindings; newer releases run no engines)"


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


@dataclass(frozen=True)
class Completion:
    """What one request produced: the new tokens (input excluded), the per-token logits when asked
    for (``[len(tokens), vocab]`` float32), or the executor's error."""

    tokens: list[int]
    logits: Any = None
    error: str | None = None


class TrtllmExecutor:
    """One engine, one executor: submit token-list requests, collect their final results."""

    def __init__(
        self,
        engine_dir: Path,
        *,
        kv_cache_tokens: int,
        device_ids: list[int] | None = None,
        worker_executable: Path | None = None,
        gather_generation_logits: bool = False,
    ) -> None:
        trtllm = bindings()
        self._trtllm = trtllm
        # block reuse is what makes re-sending the whole sequence every round cheap: set it explicitly
        # (its default changed across releases); max_tokens is this executor's share of one budget
        kwargs: dict[str, Any] = {
            "max_beam_width": 1,
            "kv_cache_config": trtllm.KvCacheConfig(enable_block_reuse=True, max_tokens=kv_cache_tokens),
        }
        if device_ids and len(device_ids) > 1:
            # tensor parallel from one process: orchestrator mode, the executor spawns its MPI workers
            # (trtllmExecutorWorker). Leader mode would need one process per GPU under mpirun. As
            # tensorrtllm_backend's Python-backend model.py sets it up (get_parallel_config).
            kwargs["parallel_config"] = trtllm.ParallelConfig(
                device_ids=device_ids,
                communication_mode=trtllm.CommunicationMode.ORCHESTRATOR,
                orchestrator_config=trtllm.OrchestratorConfig(True, str(worker_executable or "")),
            )
        elif device_ids:
            kwargs["parallel_config"] = trtllm.ParallelConfig(device_ids=device_ids)
        if gather_generation_logits:
            kwargs["gather_generation_logits"] = True  # 1.x: logits are asked for at run time
        config = trtllm.ExecutorConfig(**kwargs)
        self.executor = trtllm.Executor(Path(engine_dir), trtllm.ModelType.DECODER_ONLY, config)

    def submit(
        self,
        tokens: list[int],
        max_new_tokens: int,
        *,
        sampling: SamplingParams,
        seed: int | None,
        end_id: int | None,
        pad_id: int | None,
        client_id: int,
        draft_tokens: list[int] | None = None,
        draft_logits: Any = None,
        return_logits: bool = False,
    ) -> int:
        """Enqueue one request (raises if the executor refuses it). ``draft_tokens`` must not be
        empty: TensorRT-LLM asserts on an empty external draft (TRT-LLM #2684), send none instead."""
        trtllm = self._trtllm
        if draft_tokens is not None and not draft_tokens:
            raise ValueError("an external draft must hold at least one token")
        if sampling.greedy:
            sampling_config = trtllm.SamplingConfig(beam_width=1)
        else:
            sampling_config = trtllm.SamplingConfig(
                beam_width=1,
                top_k=sampling.top_k or None,
                top_p=sampling.top_p if sampling.top_p < 1.0 else None,
                temperature=sampling.temperature,
                seed=seed,
            )
        output_config = trtllm.OutputConfig(
            exclude_input_from_output=True, return_generation_logits=return_logits
        )
        external = None
        if draft_tokens:
            external = trtllm.ExternalDraftTokensConfig(draft_tokens, logits=draft_logits)
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
        )
        return int(self.executor.enqueue_request(request))

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
                        continue
                    result = item.result
                    if not result.is_final:
                        continue  # not streaming: only the final response carries the tokens
                    logits = result.generation_logits
                    if logits is not None and getattr(logits, "numel", lambda: 1)() == 0:
                        logits = None
                    done[rid] = Completion(list(result.output_token_ids[0]), logits)
                    pending.discard(rid)
        return done

    def cancel(self, request_id: int) -> None:
        self.executor.cancel_request(request_id)

    def shutdown(self) -> None:
        self.executor.shutdown()
