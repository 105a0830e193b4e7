"""The plain types of the TensorRT-LLM 1.2.x executor bindings that ``trtllm_standin`` models (enums,
configs, requests, responses, stats): each as the bindings take or give it (TRT = NVIDIA/TensorRT-LLM,
release/1.2.1; see ``trtllm_standin``'s docstring). Re-exported by ``trtllm_standin``, the module
that stands in for ``tensorrt_llm.bindings.executor``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from trtllm_standin_guided import GuidedDecodingConfig, GuidedDecodingParams
from trtllm_standin_kv import KvCacheMetrics


class ModelType(enum.Enum):
    DECODER_ONLY = 0


class FinishReason(enum.Enum):
    NOT_FINISHED = 0
    END_ID = 1
    STOP_WORDS = 2
    LENGTH = 3
    TIMED_OUT = 4
    CANCELLED = 5


class CommunicationMode(enum.Enum):
    LEADER = 0
    ORCHESTRATOR = 1


@dataclass
class KvCacheConfig:
    enable_block_reuse: bool = True
    max_tokens: int | None = None
    max_attention_window: list[int] | None = None
    sink_token_length: int | None = None
    free_gpu_memory_fraction: float | None = None


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
    enable_chunked_context: bool = False
    max_num_tokens: int | None = None
    parallel_config: ParallelConfig | None = None
    gather_generation_logits: bool = False
    guided_decoding_config: GuidedDecodingConfig | None = None


@dataclass
class SamplingConfig:
    beam_width: int = 1
    top_k: int | None = None
    top_p: float | None = None
    temperature: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        # executor/samplingConfig.cpp checkTopK / checkTopP / checkTemperature (TLLM_CHECK)
        if self.top_k is not None and self.top_k < 0:
            raise RuntimeError("[TensorRT-LLM][ERROR] Assertion failed: topK.value() >= 0")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise RuntimeError("[TensorRT-LLM][ERROR] Assertion failed: topP.value() > 0.f")
        if self.temperature is not None and self.temperature < 0:
            raise RuntimeError("[TensorRT-LLM][ERROR] Assertion failed: temperature.value() >= 0.f")


@dataclass
class OutputConfig:
    return_log_probs: bool = False
    return_context_logits: bool = False
    return_generation_logits: bool = False
    exclude_input_from_output: bool = False
    return_encoder_output: bool = False
    return_perf_metrics: bool = False


class ExternalDraftTokensConfig:
    def __init__(
        self,
        tokens: list[int],
        logits: Any = None,
        acceptance_threshold: float | None = None,
        fast_logits: bool | None = None,
    ) -> None:
        if not tokens:
            raise RuntimeError("[TensorRT-LLM][ERROR] Assertion failed: !mTokens.empty()")
        self.tokens = list(tokens)
        self.logits = logits
        self.acceptance_threshold = acceptance_threshold
        self.fast_logits = fast_logits


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
        guided_decoding_params: GuidedDecodingParams | None = None,
        cache_salt_id: int | None = None,
    ) -> None:
        self.cache_salt_id = cache_salt_id
        self.guided_decoding_params = guided_decoding_params
        self.input_token_ids = list(input_token_ids)
        self.max_tokens = max_tokens
        self.streaming = streaming
        self.sampling_config = sampling_config or SamplingConfig()
        self.output_config = output_config or OutputConfig()
        self.end_id, self.pad_id = end_id, pad_id
        self.external_draft_tokens_config = external_draft_tokens_config
        self.client_id = client_id


@dataclass
class RequestPerfMetrics:
    kv_cache_metrics: KvCacheMetrics = field(default_factory=KvCacheMetrics)


@dataclass
class Result:
    is_final: bool
    output_token_ids: list[list[int]]
    finish_reasons: list[FinishReason]
    generation_logits: Any = None
    request_perf_metrics: RequestPerfMetrics | None = None


@dataclass
class Response:
    request_id: int
    result: Result | None = None
    error_msg: str = ""
    client_id: int | None = None

    def has_error(self) -> bool:
        return bool(self.error_msg)


@dataclass
class KvCacheStats:
    max_num_blocks: int
    free_num_blocks: int
    used_num_blocks: int
    tokens_per_block: int


@dataclass
class IterationStats:
    iter: int
    num_active_requests: int
    kv_cache_stats: KvCacheStats | None


@dataclass
class ActiveRequest:
    """The stand-in's own record of a fetched request after ``validate()``'s edits (no binding)."""

    request: Request
    max_new_tokens: int
    drafts: list[int]
