"""A contract stand-in for ``tensorrt_llm.bindings.executor`` (tests only; never shipped).

It implements the subset the TensorRT-LLM runner uses, with TensorRT-LLM's documented semantics,
and computes real outputs with our torch engine on tiny random models, so the runner's results can
be compared token for token with target-only decoding:

* ``Executor(engine_dir, ModelType.DECODER_ONLY, ExecutorConfig)`` reads the engine's ``config.json``
  (the documented schema) and ``standin.json`` (which tiny model stands for the engine);
* a ``Request``'s output includes the prompt unless ``OutputConfig.exclude_input_from_output``; it
  stops at ``end_id`` (finish reason END_ID) or after ``max_tokens`` new tokens (LENGTH);
* with ``ExternalDraftTokensConfig`` the target accepts the longest prefix of the draft that matches
  its own greedy choice and adds one token of its own (so it returns accepted + 1 tokens); sampled
  requests with draft logits use the standard speculative-sampling check;
* an empty draft list raises when the config is built (TensorRT-LLM asserts ``!mTokens.empty()`` in
  ``ExternalDraftTokensConfig``'s constructor); more draft tokens than the engine's ``max_draft_len``
  fail in the executor's next iteration with TensorRT-LLM's message, and take every active request
  on that executor down with them (``terminateActiveRequests`` in ``forwardAsync``);
* ``cancel_request`` turns a request's final response into one with FinishReason.CANCELLED;
* requests whose ``client_id`` is in ``Executor.poisoned`` get an error response (a device fault);
  ``Executor.stalled`` makes every response wait forever (a hung executor).

Computation happens at enqueue; ``await_responses`` hands the responses out.
"""

from __future__ import annotations

import datetime
import enum
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from tiny import tiny_args
from trispec.accept import greedy_accept, speculative_accept
from trispec.engine.base import ForwardInput
from trispec.engine.torch_engine import TorchEngine
from trispec.sampling import logits_to_probs, sample
from trispec.sampling_params import SamplingParams as OurSampling

ENGINES: dict[str, TorchEngine] = {}  # one tiny engine per stand-in model, shared by executors


class ModelType(enum.Enum):
    DECODER_ONLY = 0


class FinishReason(enum.Enum):
    NOT_FINISHED = 0
    END_ID = 1
    STOP_WORDS = 2
    LENGTH = 3
    TIMED_OUT = 4
    CANCELLED = 5


@dataclass
class KvCacheConfig:
    enable_block_reuse: bool = True
    max_tokens: int | None = None
    free_gpu_memory_fraction: float | None = None


class CommunicationMode(enum.Enum):
    LEADER = 0
    ORCHESTRATOR = 1


@dataclass
class OrchestratorConfig:
    is_orchestrator: bool = True
    worker_executable_path: str = ""


@dataclass
class ParallelConfig:
    device_ids: list[int] | None = None
    communication_mode: CommunicationMode = CommunicationMode.LEADER
    orchestrator_config: OrchestratorConfig | None = None


@dataclass
class ExecutorConfig:
    max_beam_width: int = 1
    kv_cache_config: KvCacheConfig = field(default_factory=KvCacheConfig)
    parallel_config: ParallelConfig | None = None
    gather_generation_logits: bool = False


@dataclass
class SamplingConfig:
    beam_width: int = 1
    top_k: int | None = None
    top_p: float | None = None
    temperature: float | None = None
    seed: int | None = None


@dataclass
class OutputConfig:
    return_log_probs: bool = False
    return_context_logits: bool = False
    return_generation_logits: bool = False
    exclude_input_from_output: bool = False
    return_perf_metrics: bool = False


class ExternalDraftTokensConfig:
    def __init__(
        self, tokens: list[int], logits: Any = None, acceptance_threshold: float | None = None
    ) -> None:
        if not tokens:
            raise RuntimeError("[TensorRT-LLM][ERROR] Assertion failed: !mTokens.empty()")
        self.tokens = list(tokens)
        self.logits = logits
        self.acceptance_threshold = acceptance_threshold


class Request:
    def __init__(
        self,
        input_token_ids: list[int],
        max_tokens: int,
        *,
        streaming: bool = False,
        sampling_config: SamplingConfig | None = None,
        output_config: OutputConfig | None = None,
        end_id: int | None = None,
        pad_id: int | None = None,
        external_draft_tokens_config: ExternalDraftTokensConfig | None = None,
        client_id: int | None = None,
    ) -> None:
        self.input_token_ids = list(input_token_ids)
        self.max_tokens = max_tokens
        self.streaming = streaming
        self.sampling_config = sampling_config or SamplingConfig()
        self.output_config = output_config or OutputConfig()
        self.end_id, self.pad_id = end_id, pad_id
        self.external_draft_tokens_config = external_draft_tokens_config
        self.client_id = client_id


@dataclass
class Result:
    is_final: bool
    output_token_ids: list[list[int]]
    finish_reasons: list[FinishReason]
    generation_logits: Any = None


@dataclass
class Response:
    request_id: int
    result: Result | None = None
    error_msg: str = ""

    def has_error(self) -> bool:
        return bool(self.error_msg)


class Executor:
    poisoned: ClassVar[set[int]] = set()  # client ids that fail (class-wide: set by tests)
    enqueued: ClassVar[list[Request]] = []  # every request, for tests that look at what was sent
    stalled: ClassVar[bool] = False  # True: no response is ever ready (a hung executor)

    def __init__(self, model_path: Path, model_type: ModelType, executor_config: ExecutorConfig) -> None:
        path = Path(model_path)
        config = json.loads((path / "config.json").read_text())
        self.max_draft_len = int(config["build_config"].get("max_draft_len") or 0)
        model = json.loads((path / "standin.json").read_text())
        key = json.dumps(model, sort_keys=True)
        if key not in ENGINES:
            args = tiny_args(vocab_size=int(config["pretrained_config"]["vocab_size"]))
            ENGINES[key] = TorchEngine.from_random(args, int(model["seed"]), num_blocks=4096, block_size=8)
        self.engine = ENGINES[key]
        self.config = executor_config
        # an engine built for tp_size GPUs runs on that many; from one process, several GPUs need
        # orchestrator mode with a worker executable (leader mode wants one MPI rank per GPU, i.e.
        # mpirun: tensorrtllm_backend README, "Leader mode" / "Orchestrator mode")
        tp_size = int(config["pretrained_config"].get("mapping", {}).get("tp_size", 1))
        parallel = executor_config.parallel_config
        devices = (parallel.device_ids if parallel else None) or [0]
        if len(devices) != tp_size:
            raise RuntimeError(f"[TensorRT-LLM][ERROR] engine tp_size {tp_size}, {len(devices)} device ids")
        if tp_size > 1 and (
            parallel is None
            or parallel.communication_mode is not CommunicationMode.ORCHESTRATOR
            or parallel.orchestrator_config is None
            or not parallel.orchestrator_config.worker_executable_path
        ):
            raise RuntimeError("[TensorRT-LLM][ERROR] MPI world size 1 < tp_size: run one rank per GPU")
        self._ids = itertools.count(1)
        self._responses: dict[int, Response] = {}
        self.cancelled: list[int] = []

    def enqueue_request(self, request: Request) -> int:
        Executor.enqueued.append(request)
        rid = next(self._ids)
        draft = request.external_draft_tokens_config
        if draft is not None and len(draft.tokens) > self.max_draft_len:
            # checked in the executor's next iteration (verifyRequests in forwardAsync), which then
            # terminates EVERY active request on this executor with the error
            error = (
                "Encountered an error in forwardAsync function: Number of draft tokens "
                f"({len(draft.tokens)}) is larger than maximum number of draft tokens ({self.max_draft_len})"
            )
            for active in [*self._responses, rid]:
                self._responses[active] = Response(active, error_msg=error)
            return rid
        if request.client_id in Executor.poisoned:
            self._responses[rid] = Response(rid, error_msg="[TensorRT-LLM][ERROR] simulated device fault")
        else:
            self._responses[rid] = Response(rid, self._generate(request))
        return rid

    def await_responses(self, ids: Any = None, timeout: datetime.timedelta | None = None) -> list[Any]:
        """``await_responses(ids, timeout)``: one list of responses per id (the bindings' overload)."""
        if Executor.stalled:
            return [[] for _ in ids] if isinstance(ids, list) else []
        if isinstance(ids, list):
            return [[self._responses.pop(i)] if i in self._responses else [] for i in ids]
        ready = list(self._responses.values())
        self._responses.clear()
        return ready

    def cancel_request(self, request_id: int) -> None:
        self.cancelled.append(request_id)
        if request_id in self._responses:
            prior = self._responses[request_id].result
            tokens = prior.output_token_ids if prior else [[]]
            self._responses[request_id] = Response(request_id, Result(True, tokens, [FinishReason.CANCELLED]))

    def shutdown(self) -> None:
        self._responses.clear()

    # -- the documented semantics, computed for real on a tiny model ---------------------------
    def _generate(self, request: Request) -> Result:
        engine, sampling = self.engine, request.sampling_config
        params = OurSampling(
            temperature=sampling.temperature or 0.0, top_k=sampling.top_k or 0, top_p=sampling.top_p or 1.0
        )
        generator = None if params.greedy else torch.Generator().manual_seed(sampling.seed or 0)
        sid = -next(_seq_ids)
        prompt = request.input_token_ids
        engine.add_sequence(sid, len(prompt) + request.max_tokens + self.max_draft_len + 1)
        try:
            draft = request.external_draft_tokens_config
            if draft is not None:
                new, reason, logits = self._verify(sid, prompt, draft, params, generator, request)
            else:
                new, reason, logits = self._decode(sid, prompt, params, generator, request)
        finally:
            engine.free(sid)
        out = new if request.output_config.exclude_input_from_output else [*prompt, *new]
        gen_logits = torch.stack(logits)[None] if request.output_config.return_generation_logits else None
        return Result(True, [out], [reason], gen_logits)

    def _decode(self, sid, prompt, params, generator, request):  # type: ignore[no-untyped-def]
        rows = self.engine.forward([ForwardInput(sid, prompt, 1)])[0]
        new: list[int] = []
        logits: list[torch.Tensor] = []
        while True:
            token = int(sample(logits_to_probs(rows[-1:], params), generator)[0])
            new.append(token)
            logits.append(rows[-1].float())
            if token == request.end_id:
                return new, FinishReason.END_ID, logits
            if len(new) == request.max_tokens:
                return new, FinishReason.LENGTH, logits
            rows = self.engine.forward([ForwardInput(sid, [token], 1)])[0]

    def _verify(self, sid, prompt, draft, params, generator, request):  # type: ignore[no-untyped-def]
        k = len(draft.tokens)
        rows = self.engine.forward([ForwardInput(sid, [*prompt, *draft.tokens], k + 1)])[0]
        if params.greedy or draft.logits is None:
            result = (
                greedy_accept(draft.tokens, rows)
                if params.greedy
                else _token_match(draft.tokens, rows, params, generator)
            )
        else:
            q = logits_to_probs(torch.as_tensor(draft.logits, dtype=torch.float32), params)
            result = speculative_accept(draft.tokens, q, logits_to_probs(rows, params), generator)
        new = result.tokens[: request.max_tokens]
        if request.end_id in new:
            return new[: new.index(request.end_id) + 1], FinishReason.END_ID, []
        return new, FinishReason.LENGTH, []


def _token_match(draft, rows, params, generator):  # type: ignore[no-untyped-def]
    """Sampled request, drafts without logits: sample the target at each position, keep the draft
    while the sample equals it."""
    from trispec.accept import AcceptResult

    out = []
    for i, token in enumerate([*draft, None]):
        x = int(sample(logits_to_probs(rows[i : i + 1], params), generator)[0])
        out.append(x)
        if token is None or x != token:
            return AcceptResult(i, out)
    raise AssertionError


_seq_ids = itertools.count(1)


def write_engine(
    path: Path, *, vocab_size: int, seed: int, spec_mode: object = 1, max_draft_len: int = 0, **overrides: Any
) -> Path:
    """An engine directory in TensorRT-LLM's documented config.json schema, plus the stand-in's
    ``standin.json`` naming the tiny model it runs."""
    path.mkdir(parents=True, exist_ok=True)
    config = engine_config(
        vocab_size=vocab_size, spec_mode=spec_mode, max_draft_len=max_draft_len, **overrides
    )
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "standin.json").write_text(json.dumps({"seed": seed}))
    return path


def engine_config(
    *, vocab_size: int = 320, spec_mode: object = 1, max_draft_len: int = 0, **overrides: Any
) -> dict:
    """config.json as trtllm-build writes it (EngineConfig.to_dict()) for ``--max_seq_len 1000``:
    for an external-draft target it writes max_seq_len + max_draft_len (the room for the drafts);
    ``overrides`` by dotted key."""
    from trispec.runners.trtllm_engines import spec_mode_name

    external = spec_mode_name(spec_mode) == "DRAFT_TOKENS_EXTERNAL"
    config: dict[str, Any] = {
        "version": "1.2.1",
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "bfloat16",
            "vocab_size": vocab_size,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_size": 16,
            "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
            "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
        },
        "build_config": {
            "max_batch_size": 64,
            "max_input_len": 900,
            "max_seq_len": 1000 + (max_draft_len if external else 0),
            "max_num_tokens": 8192,
            "max_beam_width": 1,
            "kv_cache_type": "PAGED",
            "gather_generation_logits": False,
            "speculative_decoding_mode": spec_mode,
            "max_draft_len": max_draft_len,
            "plugin_config": {
                "gemm_plugin": "bfloat16",
                "gpt_attention_plugin": "auto",
                "context_fmha": True,
                "paged_kv_cache": True,
                "remove_input_padding": True,
                "use_paged_context_fmha": True,
                "tokens_per_block": 32,
            },
        },
    }
    for dotted, value in overrides.items():
        node = config
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node[key]
        node[leaf] = value
    return config
