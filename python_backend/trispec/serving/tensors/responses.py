"""One response's output tensors: text, counts, and what the request asked to have reported."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from trispec.stats import AcceptanceStats
from trispec.step import KVCacheMetrics, PromptLogProbs, TokenAlternatives

if TYPE_CHECKING:
    from trispec.serving.tensors.requests import ParsedRequest


@dataclass(frozen=True)
class PerfMetrics:
    """What ``return_perf_metrics`` reports for one sequence (times: time.time_ns)."""

    arrival_ns: int
    first_scheduled_ns: int
    first_token_ns: int
    last_token_ns: int
    # its prompt's blocks in the target's KV pool (None: not known, reported as zeros)
    kv: KVCacheMetrics | None


def _cell(value: object, dtype: type | str) -> np.ndarray:
    # [batch 1, 1 value]: one row of the batch per response
    return np.array([[value]], dtype=dtype)


def response_tensors(
    text: str,
    token_count: int,
    finish_reason: str | None = None,
    stats: AcceptanceStats | None = None,
    *,
    batch_index: int = 0,
    sequence_index: int = 0,
    log_probs: Sequence[float] | None = None,
    cum_log_prob: float = 0.0,
    top_log_probs: tuple[int, Sequence[TokenAlternatives]] | None = None,
    prompt_log_probs: tuple[int, PromptLogProbs] | None = None,
    perf: PerfMetrics | None = None,
    num_input_tokens: int | None = None,
    num_output_tokens: int | None = None,
    seed: int | None = None,
    skipped_text_sha256: str | None = None,
    model_fingerprint: str | None = None,
    cached_tokens: int | None = None,
) -> dict[str, np.ndarray]:
    """Output tensors of one response. ``finish_reason`` and ``stats`` on the final one; ``stats`` so
    far with ``perf``; ``log_probs`` (this response's tokens) when the request asked for them, and
    ``top_log_probs`` (N asked for, and each of those tokens' alternatives) beside them;
    ``prompt_log_probs`` (N, and the prompt's scores) on the first response of a request that asked."""
    tensors = {
        # [1], as the BLS model's postprocessing sends it: clients do ``output[0].decode()``
        "text_output": np.array([text.encode("utf-8")], dtype=object),
        "output_token_count": _cell(token_count, np.int32),
        "batch_index": _cell(batch_index, np.int32),
        "sequence_index": _cell(sequence_index, np.int32),
    }
    if log_probs is not None:
        tensors["cum_log_probs"] = _cell(cum_log_prob, np.float32)
        # [batch, beam, tokens]
        tensors["output_log_probs"] = np.array([[list(log_probs)]], dtype=np.float32).reshape(1, 1, -1)
    if top_log_probs is not None:
        tensors.update(_alternatives(*top_log_probs))
    if prompt_log_probs is not None:
        count, prompt = prompt_log_probs
        tensors["prompt_log_probs"] = np.array([prompt.log_probs], dtype=np.float32).reshape(1, -1)
        if prompt.top is not None:
            ids, values = _alternatives(count, prompt.top).values()
            tensors.update(prompt_top_token_ids=ids[0], prompt_top_log_probs=values[0])
    if seed is not None:
        tensors["sampling_seed"] = _cell(seed, np.uint64)
    if skipped_text_sha256 is not None:
        tensors["skipped_text_sha256"] = _cell(skipped_text_sha256.encode("ascii"), object)
    if model_fingerprint is not None:
        tensors["model_fingerprint"] = _cell(model_fingerprint.encode("ascii"), object)
    if num_input_tokens is not None:
        tensors["num_input_tokens"] = _cell(num_input_tokens, np.int32)
    if num_output_tokens is not None:
        tensors["num_output_tokens"] = _cell(num_output_tokens, np.int32)
    if cached_tokens is not None and (perf is not None or finish_reason is not None):
        tensors["cached_tokens"] = _cell(cached_tokens, np.int32)
    if perf is not None:
        kv = perf.kv or KVCacheMetrics(0, 0, 0, 0)
        tensors.update(
            kv_cache_alloc_new_blocks=_cell(kv.alloc_new_blocks, np.int32),
            kv_cache_reused_blocks=_cell(kv.reused_blocks, np.int32),
            kv_cache_alloc_total_blocks=_cell(kv.alloc_total_blocks, np.int32),
            kv_cache_missed_blocks=_cell(kv.missed_blocks, np.int32),
            kv_cache_hit_rate=_cell(kv.hit_rate, np.float32),
            arrival_time_ns=_cell(perf.arrival_ns, np.int64),
            first_scheduled_time_ns=_cell(perf.first_scheduled_ns, np.int64),
            first_token_time_ns=_cell(perf.first_token_ns, np.int64),
            last_token_time_ns=_cell(perf.last_token_ns, np.int64),
        )
    if stats is not None and (perf is not None or finish_reason is not None):
        tensors.update(
            acceptance_rate=_cell(stats.acceptance_rate, np.float32),
            total_accepted_draft_tokens=_cell(stats.accepted_tokens, np.int32),
            total_draft_tokens=_cell(stats.draft_tokens, np.int32),
        )
    if finish_reason is not None:
        tensors["finish_reason"] = _cell(finish_reason.encode("utf-8"), object)
    if finish_reason is not None and stats is not None:
        tensors.update(
            draft_tokens=_cell(stats.draft_tokens, np.int32),
            accepted_tokens=_cell(stats.accepted_tokens, np.int32),
            verify_rounds=_cell(stats.rounds, np.int32),
            mean_accepted_length=_cell(stats.mean_accepted_length, np.float32),
            mean_num_draft_tokens=_cell(stats.mean_num_draft_tokens, np.float32),
        )
    return tensors


# a padded place (the distribution gives fewer tokens than asked for): id -1, the lowest float32
# rather than -inf, which Triton's JSON (HTTP) responses cannot carry
_PAD_ID = -1
_PAD_LOG_PROB = float(np.finfo(np.float32).min)


def _alternatives(count: int, rows: Sequence[TokenAlternatives]) -> dict[str, np.ndarray]:
    """``[batch 1, beam 1, tokens, count]`` ids and log-probs, each row padded to ``count``."""
    ids = np.full((1, 1, len(rows), count), _PAD_ID, dtype=np.int32)
    values = np.full((1, 1, len(rows), count), _PAD_LOG_PROB, dtype=np.float32)
    for t, row in enumerate(rows):
        n = min(len(row.token_ids), count)
        ids[0, 0, t, :n] = row.token_ids[:n]
        values[0, 0, t, :n] = row.log_probs[:n]
    return {"output_top_token_ids": ids, "output_top_log_probs": values}


def skipped_digest(request: ParsedRequest, skipped_text: str) -> str | None:
    """What a resumed request's first response confirms (``skipped_text_sha256``): the SHA-256 of the
    text of the tokens it skipped, which the client compares with the text it already has."""
    if not request.generation.skip_output_tokens:
        return None
    return hashlib.sha256(skipped_text.encode("utf-8")).hexdigest()
