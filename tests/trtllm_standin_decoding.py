"""TensorRT-LLM 1.2.x's decoding rules, as the stand-in executor applies them (tests only).

Written from TensorRT-LLM's source (TRT = NVIDIA/TensorRT-LLM, release/1.2.1 tree; each function
names its file and a string to grep there), in plain torch. It imports nothing from ``trispec``: the
rules under test are TensorRT-LLM's, so they must not be ours reused (a stand-in that decides
acceptance with our ``accept.py`` can only agree with us).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# TRT cpp/tensorrt_llm/kernels/samplingTopKKernels.h: TOP_K_MAX = 1024 ("Clip k value. A topk sampling
# kernel supports up to TOP_K_MAX")
TOP_K_MAX = 1024


@dataclass(frozen=True)
class RuntimeSampling:
    """A request's sampling as the decoder runs it, after TRT's defaults and fix-ups."""

    top_k: int
    top_p: float
    temperature: float


def runtime_sampling(top_k: int | None, top_p: float | None, temperature: float | None) -> RuntimeSampling:
    """Unset fields take TRT's defaults: topK 0, topP 0.0, temperature 1.0
    (TRT cpp/tensorrt_llm/layers/defaultDecodingParams.h: getTopK / getTopP / getTemperature); then
    ``setupTopKRuntimeArgs`` (TRT kernels/samplingTopKKernels.cu): "if (k == 0 && p == 0.0f)" -> k = 1
    (greedy, WHATEVER the temperature), "if (k > 0 && p == 0.0f)" -> p = 1.0, and k clipped at
    TOP_K_MAX."""
    k = 0 if top_k is None else int(top_k)
    p = 0.0 if top_p is None else float(top_p)
    t = 1.0 if temperature is None else float(temperature)
    if k == 0 and p == 0.0:
        k = 1
    if k > 0 and p == 0.0:
        p = 1.0
    return RuntimeSampling(min(k, TOP_K_MAX), p, t)


def target_probs(logits: torch.Tensor, sampling: RuntimeSampling, vocab_size: int) -> torch.Tensor:
    """``[V]`` raw logits -> the distribution the target samples from: logits / temperature (TRT
    kernels/penaltyKernels.cu, temperature applied before sampling), entries outside the top-k /
    top-p set masked to -inf (TRT kernels/speculativeDecoding/externalDraftTokensKernels.cu
    ``maskTargetLogitsKernel``: "Masking the selected token to -inf"), softmax. Top-p is taken on the
    top-k set renormalised (TRT kernels/samplingTopKKernels.cu: ``randNum * probThreshold * sSum``,
    sSum being the top-k mass); padded vocabulary entries never count."""
    scaled = logits.float()[:vocab_size] / sampling.temperature
    order = torch.argsort(scaled, descending=True, stable=True)
    keep = torch.zeros(vocab_size, dtype=torch.bool)
    kept = order[: sampling.top_k] if sampling.top_k > 0 else order
    mass = torch.softmax(scaled[kept], dim=0)
    before = torch.cumsum(mass, dim=0) - mass
    keep[kept[before < sampling.top_p]] = True
    keep[kept[0]] = True  # the most likely token is always selected
    masked = scaled.masked_fill(~keep, float("-inf"))
    return torch.softmax(masked, dim=0)


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=generator)[0])


@dataclass(frozen=True)
class VerifyStep:
    """What one generation step with external drafts emits: the accepted drafts, then the token
    drawn where the first draft was rejected (or the bonus token after them all), cut at the end id."""

    tokens: list[int]
    ended: bool  # an accepted draft or the drawn token was end_id (not in ``tokens``)
    accepted: int


def verify_external_drafts(
    drafts: list[int],
    target_logits: torch.Tensor,
    sampling: RuntimeSampling,
    vocab_size: int,
    generator: torch.Generator,
    *,
    draft_logits: torch.Tensor | None,
    acceptance_threshold: float | None,
    end_id: int | None,
) -> VerifyStep:
    """TRT layers/externalDraftTokensLayer.cpp with kernels/speculativeDecoding/externalDraftTokensKernels.cu,
    over ``target_logits`` ``[len(drafts) + 1, V]`` (the target's rows after the prompt, then after
    each draft).

    Position i < len(drafts) (``acceptDraftTokensKernel``):
    * with draft logits: q = a PLAIN softmax of the logits passed (``invokeAddBiasSoftMax``: no
      temperature, no top-k/top-p), p = :func:`target_probs`; accepted unless
      ``targetProb / draftProb < threshold`` ("rateQP < threshold"), the threshold being a uniform
      draw (``curand_uniform``) or ``acceptance_threshold``; on reject the next token is drawn from
      p - q clamped at 0, renormalised;
    * without: accepted iff the target's own sample equals the draft ("Check if draft tokens are the
      same as target tokens"); on reject a fresh draw from the unadjusted p ("-= ... useDraftLogits ?
      draftProbsBatch[vIdx] : zeroVal").
    After all drafts are accepted the bonus token is drawn from p at the last row. An accepted draft
    equal to end_id finishes the sequence without being appended (``forwardAcceptedTokensKernel``:
    "Do not increase seq len when EOS is generated"); so does a drawn end_id (the sampling kernels
    carry the same line)."""
    out: list[int] = []
    for i, draft in enumerate(drafts):
        p = target_probs(target_logits[i], sampling, vocab_size)
        if draft_logits is not None:
            q = torch.softmax(draft_logits[i].float()[:vocab_size], dim=0)
            threshold = (
                float(torch.rand((), generator=generator))
                if acceptance_threshold is None
                else acceptance_threshold
            )
            # a NaN ratio (0 / 0) compares false with "<": the kernel accepts it
            rejected = bool(p[draft] / q[draft] < threshold)
            residual = (p - q).clamp_min(0.0)
        else:
            rejected = draw(p, generator) != draft
            residual = p
        if rejected:
            token = draw(residual / residual.sum(), generator)
            return _emit(out, token, end_id, accepted=i)
        if draft == end_id:
            return VerifyStep(out, True, i + 1)
        out.append(draft)
    bonus = draw(target_probs(target_logits[len(drafts)], sampling, vocab_size), generator)
    return _emit(out, bonus, end_id, accepted=len(drafts))


def _emit(out: list[int], token: int, end_id: int | None, *, accepted: int) -> VerifyStep:
    if token == end_id:
        return VerifyStep(out, True, accepted)
    return VerifyStep([*out, token], False, accepted)
