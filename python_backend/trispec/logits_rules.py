"""Request rules that reshape a distribution before sampling: logit bias, penalties, bad words,
min_tokens.

Speculative sampling stays lossless only if the draft's ``q`` and the target's ``p`` are the
distributions tokens are really drawn from, so the drafter and the verifier both call
:func:`apply_rules` on their logits for the same positions, with the same context: row ``i`` of a
verify pass sees the verified tokens plus the first ``i`` drafts, exactly what the drafter saw when
it proposed draft ``i``. Then temperature / top-k / top-p follow (``sampling.logits_to_probs``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from trispec.sampling_params import SamplingParams
from trispec.step import TokenAlternatives


def apply_rules(
    logits: torch.Tensor,
    params: SamplingParams,
    context: Sequence[int],
    drafts: Sequence[int] = (),
    may_end: Sequence[bool] | None = None,
) -> torch.Tensor:
    """``logits`` ``[n, V]`` for the positions after ``context``, ``context + drafts[:1]``, ... ->
    new float32 logits with the request's rules applied (the input is not modified). ``may_end``: a
    guided request's rows, whether its grammar may end there (``GuidedRows``): elsewhere an end id can
    only be text, which ``min_tokens`` does not hold back."""
    out = logits.float().clone()
    vocab_size = out.shape[-1]
    rows = out.shape[0]
    tokens = [*context, *drafts[: max(rows - 1, 0)]]
    if params.logit_bias:
        # first, as TensorRT-LLM adds its embedding bias (kernels/penaltyKernels.cu batchApplyPenalty)
        ids, biases = zip(*params.logit_bias)
        bias = torch.tensor(biases, dtype=out.dtype).expand(rows, -1)
        out.index_add_(1, torch.tensor(ids, dtype=torch.long), bias)  # a repeated id: its biases summed
    if params.penalised:
        counts = _counts_per_row(tokens, len(context), rows, vocab_size)
        seen = counts > 0
        if params.repetition_penalty != 1.0:
            rp = params.repetition_penalty
            out = torch.where(seen, torch.where(out > 0, out / rp, out * rp), out)
        if params.presence_penalty != 0.0:
            out -= params.presence_penalty * seen.float()
        if params.frequency_penalty != 0.0:
            out -= params.frequency_penalty * counts
    for row in range(rows):
        row_context = tokens[: len(context) + row]
        if _holds_back_end(params, row_context, may_end is None or may_end[row]):
            for end_id in params.end_ids:
                out[row, end_id] = -math.inf
        for word in params.bad_words_ids:
            if _completes(word, row_context):
                out[row, word[-1]] = -math.inf
    return out


def forbidding_rules(
    params: SamplingParams, context: Sequence[int], tokens: Sequence[int], may_end: bool = True
) -> list[str]:
    """The request's rules that took ``tokens`` (a guided row's allowed tokens, all at -inf after
    :func:`apply_rules`) out at the position after ``context``, by their request field: what emptied
    the row. ``logits`` when none of them did (the model's own logits were -inf)."""
    bias = dict(params.logit_bias)
    rules: list[str] = []
    for token in tokens:
        if token in params.end_ids and _holds_back_end(params, context, may_end):
            rule = "min_tokens"
        elif any(word[-1] == token and _completes(word, context) for word in params.bad_words_ids):
            rule = "bad_words"
        elif token in bias:
            rule = "logit_bias"
        elif params.penalised:
            rule = "repetition_penalty/presence_penalty/frequency_penalty"
        else:
            rule = "logits"
        if rule not in rules:
            rules.append(rule)
    return rules


def _holds_back_end(params: SamplingParams, context: Sequence[int], may_end: bool) -> bool:
    """``min_tokens`` forbids the end ids after ``context`` (not where they can only be text)."""
    return bool(params.min_tokens) and may_end and len(context) - params.prompt_len < params.min_tokens


def _completes(word: Sequence[int], context: Sequence[int]) -> bool:
    """A bad word's last token would complete it after ``context``."""
    head = list(word[:-1])
    return not head or list(context[len(context) - len(head) :]) == head


def _counts_per_row(tokens: list[int], context_len: int, rows: int, vocab_size: int) -> torch.Tensor:
    """``[rows, V]`` occurrences of each token in row i's context (``tokens[: context_len + i]``)."""
    ids = torch.as_tensor(tokens, dtype=torch.long)
    base = torch.bincount(ids[:context_len], minlength=vocab_size).float()
    counts = base.expand(rows, vocab_size).clone()
    for row in range(1, rows):  # each later row has seen one more draft
        counts[row:, tokens[context_len + row - 1]] += 1
    return counts


def log_probs_of(
    logits: torch.Tensor, params: SamplingParams, tokens: Sequence[int], probs: torch.Tensor | None = None
) -> list[float]:
    """Log-probability of ``tokens[i]`` under row i's distribution: after temperature / top-k /
    top-p when sampling (``probs``, from ``logits_to_probs``), the plain softmax of the (rule-shaped)
    logits when greedy, as TensorRT-LLM reports them."""
    return _gather(_log_prob_rows(logits, params, len(tokens), probs), tokens)


def top_log_probs_of(
    logits: torch.Tensor, params: SamplingParams, rows: int, probs: torch.Tensor | None = None
) -> list[TokenAlternatives]:
    """The ``params.top_log_probs`` most likely tokens of each of the first ``rows`` rows, under the
    distribution :func:`log_probs_of` reads (so a token's own log-prob is among them when it ranks)."""
    return _most_likely(_log_prob_rows(logits, params, rows, probs), params.top_log_probs)


def log_probs_with_alternatives(
    logits: torch.Tensor, params: SamplingParams, tokens: Sequence[int], probs: torch.Tensor | None = None
) -> tuple[list[float], list[TokenAlternatives] | None]:
    """:func:`log_probs_of` and, when ``params`` asks for them, :func:`top_log_probs_of` of the same
    rows, from one pass over the vocabulary."""
    values = _log_prob_rows(logits, params, len(tokens), probs)
    top = _most_likely(values, params.top_log_probs) if params.top_log_probs else None
    return _gather(values, tokens), top


def _gather(values: torch.Tensor, tokens: Sequence[int]) -> list[float]:
    ids = torch.as_tensor(list(tokens), dtype=torch.long).view(-1, 1)
    return values.gather(1, ids).view(len(tokens)).tolist()


def _most_likely(values: torch.Tensor, count: int) -> list[TokenAlternatives]:
    """Each row's ``count`` highest log-probs, most likely first, ties by id, -inf left out."""
    rows = values.shape[0]
    count = min(count, values.shape[-1])
    if rows == 0 or count == 0:
        return [TokenAlternatives((), ()) for _ in range(rows)]
    floors = torch.topk(values, count, dim=-1).values[:, -1].tolist()
    alternatives = []
    for row, floor in zip(values, floors):
        # every token at or above the count-th value, so that ties at the edge are chosen by id, not
        # by how topk happens to pick; -inf: a token the distribution cannot give, never listed
        found = torch.nonzero(row >= floor if floor != -math.inf else row > floor).view(-1)
        ranked = sorted(zip((-row[found]).tolist(), found.tolist()))[:count]
        alternatives.append(TokenAlternatives(tuple(i for _, i in ranked), tuple(-lp for lp, _ in ranked)))
    return alternatives


def _log_prob_rows(
    logits: torch.Tensor, params: SamplingParams, rows: int, probs: torch.Tensor | None
) -> torch.Tensor:
    """``[rows, V]`` log-probabilities: of ``probs`` when sampling, the softmax of ``logits`` when greedy."""
    if params.greedy or probs is None:
        return torch.log_softmax(logits[:rows].float(), dim=-1)
    return torch.log(probs[:rows])
