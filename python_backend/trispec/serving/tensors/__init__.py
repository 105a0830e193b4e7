"""The served model's tensors: NVIDIA's ``tensorrt_llm_bls`` contract, plus our own outputs.

One table drives the generated config.pbtxt, the parsing of requests and docs/serving.md's tensor table, so
the three never drift. Every input and output of the BLS model (TensorRT-LLM
``triton_backend/all_models/inflight_batcher_llm/tensorrt_llm_bls/config.pbtxt``) is declared with its
dtype and dims, so a BLS client never meets "unexpected inference input/output". Each is either the
same as there, our extension, or refused: an input we cannot honour is refused with a message saying
why (INVALID_ARG), never silently ignored.
"""

from trispec.serving.tensors.requests import (
    MAX_RETURN_SEQUENCES,
    TRITON_PARAMETER_PREFIX,
    GetInput,
    ParsedRequest,
    as_tensor_error,
    check_one_response,
    check_parameters,
    parse_batch,
    parse_inputs,
)
from trispec.serving.tensors.responses import PerfMetrics, response_tensors, skipped_digest
from trispec.serving.tensors.table import INPUTS, OUTPUTS, REFUSED_INPUTS, Status, TensorSpec

__all__ = [
    "INPUTS",
    "MAX_RETURN_SEQUENCES",
    "OUTPUTS",
    "REFUSED_INPUTS",
    "TRITON_PARAMETER_PREFIX",
    "GetInput",
    "ParsedRequest",
    "PerfMetrics",
    "Status",
    "TensorSpec",
    "as_tensor_error",
    "check_one_response",
    "check_parameters",
    "parse_batch",
    "parse_inputs",
    "response_tensors",
    "skipped_digest",
]
