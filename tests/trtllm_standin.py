"""A model of TensorRT-LLM 1.2.x's executor bindings (``tensorrt_llm.bindings.executor``): tests only,
never shipped. TensorRT-LLM cannot be installed on these machines, so the runner is tested against
this: the API subset it uses, with each behaviour written from TensorRT-LLM's source (TRT =
NVIDIA/TensorRT-LLM, release/1.2.1; a file and a string to grep there on every behaviour below).

The engine an ``Executor`` loads is a directory with TensorRT-LLM's ``config.json`` (read as the real
one is), a ``rank0.engine`` whose size is the weights the GPU must hold, and ``standin.json`` naming
the tiny random model (our torch engine, used only for the model's logits) that stands for it. The
decoding rules (sampling, external-draft acceptance) live in ``trtllm_standin_decoding`` and import
nothing of ours; the bindings' plain types in ``trtllm_standin_types`` (all re-exported here), the
engine directories in ``trtllm_standin_engine``.

What it does, each from the source:
* requests are validated when the executor fetches them, per request (``LlmRequest::validate``,
  batch_manager/llmRequest.cpp; executor/executorImpl.cpp ``fetchNewRequests`` catches per request):
  an end id outside [-1, vocab) errors ("EndId (%d) is not within acceptable range"), a prompt over
  max_input_len errors ("exceeds maximum input length"), more drafts than max_draft_len error
  ("Draft tokens length (%d) exceeds maximum draft tokens length"), prompt + drafts over
  max_input_len silently CUTS the drafts ("Number of draft tokens is changed"), prompt + max_tokens +
  draft length per step (max_draft_len when the request has none) over max_seq_len silently LOWERS
  max_tokens ("Number of requested output tokens is changed");
* generation logits need ``ExecutorConfig(gather_generation_logits=True)``, else that request errors
  ("To return generation logits, gather_generation_logits must be enabled in ExecutorConfig",
  executorImpl.cpp); they come back ``[beams, max_tokens, vocab_padded]``, rows past the last
  generated step zero;
* without chunked context (``ExecutorConfig.enable_chunked_context`` False, the default) a context
  request's whole token count plus its drafts is checked against max_num_tokens
  (batch_manager/microBatchScheduler.cpp: "The number of context tokens (%d) exceeds the limit
  value (%d)"); the throw happens in ``forwardAsync`` and ``terminateActiveRequests`` fails EVERY
  active request on the executor (executorImpl.cpp). Chunked context needs paged context FMHA
  (trtGptModelInflightBatching.cpp: "Chunked context requires context FMHA, paged kv_cache and paged
  context FMHA");
* a DRAFT_TOKENS_EXTERNAL engine refuses to start without KV block reuse
  (trtGptModelInflightBatching.cpp: "KV cache block reuse must be enabled for speculative decoding
  target model");
* the KV cache is sized inside ``Executor(...)`` AFTER this engine's weights and runtime buffers are
  on the GPU: ``min(max_tokens, free_gpu_memory_fraction x free)``, the fraction 0.9 when unset
  (batch_manager/kvCacheManager.cpp ``calculateFreeMemBytes``: "the smaller value will be used";
  executor.h ``kDefaultGpuMemFraction``); its size shows only in the iteration stats
  (``get_latest_iteration_stats()[-1].kv_cache_stats.max_num_blocks``, filled per iteration);
* the end token is never in ``output_token_ids``: the end shows in ``finish_reasons`` as END_ID
  (externalDraftTokensKernels.cu ``forwardAcceptedTokensKernel``: "Do not increase seq len when EOS is
  generated"); a request decodes on after its verify step until max_tokens or the end id (TRT's
  C++ model tests, grep "acceptedDraftTokensLengths[givenInputIdx": the full output length is
  expected with draft tokens, only the first accepted + 1 compared); drafts are verified in the step
  of the last context chunk (runtime buffers ``setBufferSizes``: "isLastContextChunk() ?
  getNumDraftTokens() : 0"), which here is the only one;
* guided decoding as ``trtllm_standin_guided`` says: the config at executor creation, the params per
  request, the first logits row of a step masked and the step's last token accepted;
* unset top_k / top_p are greedy whatever the temperature, the default seed is 0
  (``trtllm_standin_decoding.runtime_sampling``); acceptance as in
  ``trtllm_standin_decoding.verify_external_drafts``;
* KV block reuse (``enable_block_reuse``): each request's context reuses the blocks earlier requests
  left (same prefix, same ``cache_salt_id``) and reports them in ``request_perf_metrics`` when
  ``OutputConfig.return_perf_metrics`` is set (``trtllm_standin_kv``, each behaviour from
  kvCacheManager.cpp);
* an empty external draft asserts when the config is built (TRT-LLM issue #2684: "Assertion failed:
  !mTokens.empty()"); ``cancel_request`` ends a request with FinishReason.CANCELLED; one process
  driving several GPUs needs orchestrator mode with a worker executable (tensorrtllm_backend README,
  "Leader mode" / "Orchestrator mode").
Test hooks (not TensorRT-LLM's): ``Executor.poisoned`` client ids get an error response (a device
fault), ``Executor.stalled`` keeps every response pending (a hung executor), ``Executor.decodes_on``
False stops a request after its verify step, ``Executor.enqueued``
(all executors) and ``received`` (this one) record what was sent, ``GPU`` is the simulated device
memory.

Work happens when responses are awaited: one call runs the executor's iterations (fetch, schedule,
forward) until nothing can progress.
"""

from __future__ import annotations

import datetime
import itertools
from pathlib import Path
from typing import Any, ClassVar

import torch
from trispec.engine.base import ForwardInput
from trtllm_standin_decoding import draw, runtime_sampling, target_probs, verify_external_drafts
from trtllm_standin_engine import GiB, SimulatedGpu, _Engine, _model
from trtllm_standin_guided import Matcher
from trtllm_standin_kv import ReuseTree

# the bindings' types, all of them: this module is ``tensorrt_llm.bindings.executor``
from trtllm_standin_types import *  # noqa: F403
from trtllm_standin_types import (
    ActiveRequest,
    CommunicationMode,
    ExecutorConfig,
    FinishReason,
    IterationStats,
    KvCacheConfig,
    KvCacheStats,
    ModelType,
    ParallelConfig,
    Request,
    RequestPerfMetrics,
    Response,
    Result,
)

# runtime buffers an executor allocates beside its weights before the KV cache is sized (activations,
# decoder state); a fixed figure here, a function of max_num_tokens and the model on a real GPU
RUNTIME_BUFFER_BYTES = GiB // 4


DEFAULT_GPU_MEM_FRACTION = 0.9  # executor.h kDefaultGpuMemFraction


GPU = SimulatedGpu()


class Executor:
    poisoned: ClassVar[set[int]] = set()
    enqueued: ClassVar[list[Request]] = []
    stalled: ClassVar[bool] = False
    # False: a request stops after its verify step (accepted drafts + 1), as a runtime that did not
    # decode on would; the runner must be right either way
    decodes_on: ClassVar[bool] = True

    def __init__(self, model_path: Path, model_type: ModelType, executor_config: ExecutorConfig) -> None:
        path = Path(model_path)
        self.engine = _Engine.read(path)
        self.config = executor_config
        self._check_parallel(executor_config.parallel_config)
        kv_config = executor_config.kv_cache_config
        if self.engine.draft_tokens_external and not kv_config.enable_block_reuse:
            raise RuntimeError(
                "[TensorRT-LLM][ERROR] Assertion failed: KV cache block reuse must be enabled for "
                "speculative decoding target model"
            )
        if executor_config.enable_chunked_context and not self.engine.paged_context_fmha:
            raise RuntimeError(
                "[TensorRT-LLM][ERROR] Assertion failed: Chunked context requires context FMHA, paged "
                "kv_cache and paged context FMHA all enabled at the same time."
            )
        engine_file = path / "rank0.engine"
        GPU.take(engine_file.stat().st_size if engine_file.exists() else 0, "engine weights")
        GPU.take(RUNTIME_BUFFER_BYTES, "runtime buffers")
        self.max_num_blocks = self._size_kv_cache(kv_config)
        self.reuse = (
            ReuseTree(self.max_num_blocks, self.engine.tokens_per_block)
            if kv_config.enable_block_reuse
            else None
        )
        self.model = _model(path, self.engine.vocab_size)
        self.max_num_tokens = executor_config.max_num_tokens or self.engine.max_num_tokens
        self._ids = itertools.count(1)
        self._queued: list[tuple[int, Request]] = []
        self._active: dict[int, ActiveRequest] = {}
        self._ready: dict[int, list[Response]] = {}
        self._stats: list[IterationStats] = []
        self._iterations = 0
        self.cancelled: list[int] = []
        self.received: list[Request] = []  # test hook: what this executor was sent

    def _check_parallel(self, parallel: ParallelConfig | None) -> None:
        devices = (parallel.device_ids if parallel else None) or [0]
        if len(devices) != self.engine.tp_size:
            raise RuntimeError(
                f"[TensorRT-LLM][ERROR] engine tp_size {self.engine.tp_size}, {len(devices)} device ids"
            )
        if self.engine.tp_size > 1 and (
            parallel is None
            or parallel.communication_mode is not CommunicationMode.ORCHESTRATOR
            or parallel.orchestrator_config is None
            or not parallel.orchestrator_config.worker_executable_path
        ):
            raise RuntimeError("[TensorRT-LLM][ERROR] MPI world size 1 < tp_size: run one rank per GPU")

    def _size_kv_cache(self, kv_config: KvCacheConfig) -> int:
        block_bytes = self.engine.tokens_per_block * self.engine.kv_bytes_per_token
        fraction = kv_config.free_gpu_memory_fraction
        nbytes = int((DEFAULT_GPU_MEM_FRACTION if fraction is None else fraction) * GPU.free_bytes())
        if kv_config.max_tokens is not None:
            blocks_wanted = -(-kv_config.max_tokens // self.engine.tokens_per_block)
            nbytes = min(nbytes, blocks_wanted * block_bytes)
        blocks = nbytes // block_bytes
        if blocks < 1:
            raise RuntimeError("[TensorRT-LLM][ERROR] Assertion failed: no free memory for the KV cache")
        GPU.take(blocks * block_bytes, "KV cache")
        return blocks

    # -- the API -------------------------------------------------------------------------------
    def enqueue_request(self, request: Request) -> int:
        Executor.enqueued.append(request)
        self.received.append(request)
        rid = next(self._ids)
        self._queued.append((rid, request))
        return rid

    def enqueue_requests(self, requests: list[Request]) -> list[int]:
        return [self.enqueue_request(r) for r in requests]

    def await_responses(self, ids: Any = None, timeout: datetime.timedelta | None = None) -> list[Any]:
        """The three overloads: all ready responses; those of one id; a list per id of a list."""
        if not Executor.stalled:
            self._run()
        if isinstance(ids, list):
            return [self._ready.pop(i, []) for i in ids]
        if ids is not None:
            return self._ready.pop(ids, [])
        ready = [r for rs in self._ready.values() for r in rs]
        self._ready.clear()
        return ready

    def cancel_request(self, request_id: int) -> None:
        self.cancelled.append(request_id)
        queued = any(rid == request_id for rid, _ in self._queued)
        self._queued = [(rid, r) for rid, r in self._queued if rid != request_id]
        if self._active.pop(request_id, None) is not None or queued:
            self._ready[request_id] = [Response(request_id, Result(True, [[]], [FinishReason.CANCELLED]))]

    def get_latest_iteration_stats(self) -> list[IterationStats]:
        stats, self._stats = self._stats, []
        return stats

    def shutdown(self) -> None:
        self._queued.clear()
        self._active.clear()

    # -- the executor loop ---------------------------------------------------------------------
    def _run(self) -> None:
        while self._queued or self._active:
            self._fetch()
            scheduled = self._schedule()
            if scheduled is None:  # forwardAsync threw: every active request failed
                continue
            if not scheduled:
                return  # nothing fits the KV cache: requests wait (GUARANTEED_NO_EVICT)
            for rid in scheduled:
                active = self._active.pop(rid)
                self._ready[rid] = [self._respond(rid, active)]

    def _fetch(self) -> None:
        for rid, request in self._queued:
            try:
                self._active[rid] = self._validate(request)
            except RuntimeError as exc:
                self._ready[rid] = [Response(rid, error_msg=str(exc), client_id=request.client_id)]
        self._queued = []

    def _validate(self, request: Request) -> ActiveRequest:
        engine, prompt_len = self.engine, len(request.input_token_ids)
        end_id = request.end_id
        if end_id is not None and not -1 <= end_id < engine.vocab_size:
            raise RuntimeError(
                f"[TensorRT-LLM][ERROR] EndId ({end_id}) is not within acceptable range [-1, "
                f"{engine.vocab_size})."
            )
        if prompt_len > engine.max_input_len:
            raise RuntimeError(
                f"[TensorRT-LLM][ERROR] Prompt length ({prompt_len}) exceeds maximum input length "
                f"({engine.max_input_len})."
            )
        external = request.external_draft_tokens_config
        drafts = list(external.tokens) if external is not None else []
        per_step = engine.max_draft_len
        if drafts:
            if len(drafts) > engine.max_draft_len:
                raise RuntimeError(
                    f"[TensorRT-LLM][ERROR] Draft tokens length ({len(drafts)}) exceeds maximum draft "
                    f"tokens length ({engine.max_draft_len})."
                )
            per_step = len(drafts)
            if prompt_len + per_step > engine.max_input_len:
                per_step = engine.max_input_len - prompt_len
                drafts = drafts[:per_step]  # "Number of draft tokens is changed"
        max_new = request.max_tokens
        if prompt_len + max_new + per_step > engine.max_seq_len:
            max_new = engine.max_seq_len - prompt_len - per_step  # "...output tokens is changed"
        if request.output_config.return_generation_logits and not self.config.gather_generation_logits:
            raise RuntimeError(
                "[TensorRT-LLM][ERROR] Assertion failed: To return generation logits, "
                "gather_generation_logits must be enabled in ExecutorConfig"
            )
        return ActiveRequest(request, max_new, drafts)

    def _schedule(self) -> list[int] | None:
        """The micro-batch scheduler's context check, then the KV capacity of each request."""
        if not self.config.enable_chunked_context:
            for active in self._active.values():
                tokens = len(active.request.input_token_ids) + len(active.drafts)
                if tokens > self.max_num_tokens:
                    self._terminate_active(
                        "Encountered an error in forwardAsync function: [TensorRT-LLM][ERROR] Assertion "
                        f"failed: The number of context tokens ({tokens}) exceeds the limit value "
                        f"({self.max_num_tokens})"
                    )
                    return None
        scheduled, free = [], self.max_num_blocks
        for rid, active in self._active.items():
            length = len(active.request.input_token_ids) + active.max_new_tokens + len(active.drafts)
            blocks = -(-length // self.engine.tokens_per_block)
            if blocks <= free:
                scheduled.append(rid)
                free -= blocks
        self._iterations += 1
        stats = KvCacheStats(
            self.max_num_blocks, free, self.max_num_blocks - free, self.engine.tokens_per_block
        )
        self._stats.append(IterationStats(self._iterations, len(self._active), stats))
        return scheduled

    def _terminate_active(self, error: str) -> None:
        for rid, active in self._active.items():
            self._ready[rid] = [Response(rid, error_msg=error, client_id=active.request.client_id)]
        self._active.clear()

    def _respond(self, rid: int, active: ActiveRequest) -> Response:
        request = active.request
        if request.client_id in Executor.poisoned:
            return Response(rid, error_msg="[TensorRT-LLM][ERROR] simulated device fault")
        perf = None
        if self.reuse is not None:
            held, kv = self.reuse.add_sequence(request.input_token_ids, request.cache_salt_id)
            perf = RequestPerfMetrics(kv)
        new, reason, logits = self._generate(active)
        if self.reuse is not None:
            self.reuse.release(held, [*request.input_token_ids, *new], request.cache_salt_id)
        if not request.output_config.return_perf_metrics:
            perf = None
        out = new if request.output_config.exclude_input_from_output else [*request.input_token_ids, *new]
        return Response(rid, Result(True, [out], [reason], logits, perf), client_id=request.client_id)

    # -- decoding, with the model's real logits ------------------------------------------------
    def _generate(self, active: ActiveRequest) -> tuple[list[int], FinishReason, Any]:
        request, engine = active.request, self.engine
        config = request.sampling_config
        sampling = runtime_sampling(config.top_k, config.top_p, config.temperature)
        generator = torch.Generator().manual_seed(config.seed or 0)  # the default seed is 0
        prompt, drafts = request.input_token_ids, active.drafts
        external = request.external_draft_tokens_config
        sid = -next(_seq_ids)
        self.model.add_sequence(sid, len(prompt) + len(drafts) + active.max_new_tokens + 1)
        rows: list[torch.Tensor] = []
        guided = self._matcher(request)
        try:
            logits = self.model.forward([ForwardInput(sid, [*prompt, *drafts], len(drafts) + 1)])[0]
            if guided is not None:  # one row per request is masked: the first (trtllm_standin_guided)
                logits = torch.cat([guided.mask(logits[0])[None], logits[1:].float()])
            if drafts:
                step = verify_external_drafts(
                    drafts,
                    logits,
                    sampling,
                    engine.vocab_size,
                    generator,
                    draft_logits=None if external.logits is None else torch.as_tensor(external.logits),
                    acceptance_threshold=external.acceptance_threshold,
                    end_id=request.end_id,
                )
                new = step.tokens[: active.max_new_tokens]
                ended = step.ended and len(step.tokens) <= active.max_new_tokens
                if step.accepted < len(drafts):  # the rejected drafts leave the cache
                    self.model.free(sid)
                    self.model.add_sequence(sid, len(prompt) + len(drafts) + active.max_new_tokens + 1)
                    self.model.forward([ForwardInput(sid, [*prompt, *new][:-1], 0)])
                rows = list(logits[: len(new)])
            else:
                new, ended = [], False
            while not ended and len(new) < active.max_new_tokens and (Executor.decodes_on or not drafts):
                if new or drafts:
                    if guided is not None:  # the step's last token only reaches the matcher
                        guided.accept(new[-1])
                    logits = self.model.forward([ForwardInput(sid, [new[-1]], 1)])[0]
                    if guided is not None:
                        logits = guided.mask(logits[-1])[None]
                rows.append(logits[-1])
                token = draw(target_probs(logits[-1], sampling, engine.vocab_size), generator)
                if token == request.end_id:
                    ended = True
                else:
                    new.append(token)
        finally:
            self.model.free(sid)
        reason = FinishReason.END_ID if ended else FinishReason.LENGTH
        return new, reason, self._generation_logits(request, rows)

    def _matcher(self, request: Request) -> Matcher | None:
        config, params = self.config.guided_decoding_config, request.guided_decoding_params
        if config is None or params is None:  # without a guided decoder the params are not read
            return None
        return Matcher(config, params, self.engine.vocab_size)

    def _generation_logits(self, request: Request, rows: list[torch.Tensor]) -> Any:
        if not request.output_config.return_generation_logits:
            return None
        out = torch.zeros(1, request.max_tokens, self.engine.vocab_size)
        for i, row in enumerate(rows[: request.max_tokens]):
            out[0, i] = row.float()
        return out


_seq_ids = itertools.count(1)
