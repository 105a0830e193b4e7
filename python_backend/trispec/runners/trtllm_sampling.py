"""What a request's sampling settings become on TensorRT-LLM's side (no TensorRT-LLM import here).

TensorRT-LLM 1.2.x reads unset ``top_k`` / ``top_p`` as 0 / 0.0 and its kernel turns that pair into
top-k 1: GREEDY, whatever the temperature (cpp/tensorrt_llm/layers/defaultDecodingParams.h;
kernels/samplingTopKKernels.cu ``setupTopKRuntimeArgs``: "if (k == 0 && p == 0.0f)"). So a sampled
request always sends ``top_p`` (1.0 when the request leaves it off), and ``top_k`` only when set,
clipped at the kernel's TOP_K_MAX (1024) as the kernel itself would.

With draft logits, TensorRT-LLM's acceptance compares the target's probability p (temperature and
top-k/top-p applied) with q = a PLAIN softmax of the logits it is given
(kernels/speculativeDecoding/externalDraftTokensKernels.cu ``acceptDraftTokensKernel``,
layers/externalDraftTokensLayer.cpp ``invokeAddBiasSoftMax``). The draft engine returns raw logits,
so they are divided by the temperature and masked to the top-k/top-p set here: softmax of what is
sent is then the distribution the draft really sampled from, and the p/q rule is the lossless one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from trispec.sampling import filtered_logits
from trispec.sampling_params import SamplingParams

TOP_K_MAX = 1024  # TensorRT-LLM kernels/samplingTopKKernels.h


def as_runtime(params: SamplingParams) -> SamplingParams:
    """The settings TensorRT-LLM will actually sample with (top-k clipped at TOP_K_MAX)."""
    if params.top_k > TOP_K_MAX:
        return dataclasses.replace(params, top_k=TOP_K_MAX)
    return params


def sampling_config_kwargs(params: SamplingParams, seed: int) -> dict[str, Any]:
    """Keyword arguments of ``SamplingConfig(beam_width=1, ...)`` for one request."""
    if params.greedy:
        return {"top_k": 1}  # explicit: greedy does not rest on the unset-means-greedy default
    runtime = as_runtime(params)
    kwargs: dict[str, Any] = {"temperature": runtime.temperature, "top_p": runtime.top_p, "seed": seed}
    if runtime.top_k > 0:
        kwargs["top_k"] = runtime.top_k
    return kwargs


def draft_logits_for_acceptance(logits: Any, params: SamplingParams, vocab_size: int) -> torch.Tensor:
    """``[k, V_padded]`` raw draft logits -> float32 logits whose plain softmax is the draft's
    sampling distribution (padded vocabulary entries -inf, as the sampling kernels ignore them)."""
    rows = torch.as_tensor(logits).float()
    shaped = torch.full_like(rows, float("-inf"))
    shaped[:, :vocab_size] = filtered_logits(rows[:, :vocab_size], as_runtime(params))
    return shaped
