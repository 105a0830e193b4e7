"""What one step's ``SeqResult`` means for one request: the tokens it emits and the text safe to
show, and whether it ends (end id, max_tokens, stop string), with its log-probabilities."""

from __future__ import annotations

from dataclasses import dataclass, replace

from trispec.errors import InvalidInputError
from trispec.sequence import FinishReason, Sequence
from trispec.stats import AcceptanceStats, EngineStats
from trispec.step import GRAMMAR_COMPLETE, KVCacheMetrics, PromptLogProbs, SeqResult, TokenAlternatives


@dataclass(frozen=True)
class RequestOutput:
    """What one step produced for one request: only verified tokens, and text safe to show."""

    request_id: int
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: FinishReason | None
    stats: AcceptanceStats
    # why the request failed (finish_reason ERROR): the runner failed on this sequence alone
    error: str | None = None
    # a request queued with ``tokenize_later`` that turned out invalid once tokenised (too long, ...)
    invalid: InvalidInputError | None = None
    # log-probability of each of ``new_token_ids`` when the request asked for them
    new_log_probs: list[float] | None = None
    # beside ``new_log_probs`` when the request asked for alternatives (top_log_probs): one per token
    new_top_log_probs: list[TokenAlternatives] | None = None
    # on the request's first output, when it asked for them: its prompt tokens' log-probs (from
    # prompt token 1 on; token 0 has nothing before it)
    prompt_log_probs: PromptLogProbs | None = None
    num_prompt_tokens: int = 0
    # wall clock (time.time_ns) when the request was first admitted into the batch
    first_scheduled_ns: int | None = None
    # the text of this step's tokens that fall within the request's skip_output_tokens (not in new_text)
    skipped_text: str = ""
    # a sampled request's seed (the caller's, or the one it was given): the same seed, prompt and
    # settings give the same text again; None for greedy requests
    seed: int | None = None
    # prompt tokens taken from the prefix cache (not computed), once its first token is verified
    cached_tokens: int = 0
    # its prompt's blocks in the target's KV pool (perf metrics), once its first token is verified
    kv_metrics: KVCacheMetrics | None = None


def apply_result(seq: Sequence, result: SeqResult, planned_k: int, stats: EngineStats) -> RequestOutput:
    """Account, emit and finish one sequence after its verify."""
    first = not seq.output_ids
    seq.stats.record_round(result.num_drafted, result.num_accepted, planned_k)
    stats.record_round(result.num_drafted, result.num_accepted, planned_k)
    new_ids: list[int] = []
    ended = False  # on an end id: emitted as a token id, but its text is not part of the output
    for i, token in enumerate(result.new_token_ids):
        new_ids.append(token)
        if token in seq.end_ids and i not in result.end_ids_as_text:
            seq.finish_reason, ended = FinishReason.STOP, True
            break
        if len(seq.output_ids) + len(new_ids) >= seq.max_tokens:
            seq.finish_reason = FinishReason.LENGTH
            break
    if result.grammar_end is not None and len(new_ids) == len(result.new_token_ids) and not ended:
        # the grammar ended it after its tokens: complete (before max_tokens could), or a dead end
        seq.finish_reason = FinishReason.STOP
        if result.grammar_end != GRAMMAR_COMPLETE:
            seq.finish_reason, seq.error = FinishReason.GRAMMAR_DEAD_END, result.grammar_end
    kept, skipped, text, stopped = _push(seq, new_ids[:-1] if ended else new_ids)
    if stopped:
        # a stop string completed: drop every token after the one that completed it
        seq.finish_reason = FinishReason.STOP
        new_ids = new_ids[:kept]
    seq.output_ids.extend(new_ids)
    stats.generated_tokens += len(new_ids)
    if seq.finished:
        tail = seq.text.finish()
        if len(seq.output_ids) > seq.skip_output_tokens:
            text += tail
        else:
            skipped += tail
    log_probs = None if result.log_probs is None else result.log_probs[: len(new_ids)]
    top = None if result.top_log_probs is None else result.top_log_probs[: len(new_ids)]
    output = request_output(seq, new_ids, text, log_probs, top)
    if first and seq.sampling.prompt_log_probs:
        top_prompt = seq.prompt_top_log_probs if seq.sampling.top_log_probs else None
        output = replace(output, prompt_log_probs=PromptLogProbs(1, seq.prompt_log_probs, top_prompt))
    return replace(output, skipped_text=skipped) if skipped else output


def _push(seq: Sequence, ids: list[int]) -> tuple[int, str, str, bool]:
    """Detokenise a step's ids: (ids kept, text of those within ``skip_output_tokens``, the rest of
    the text, stopped). Pushed in two parts where the skip ends inside the step, so the skipped text
    is exactly what the text of the first ``skip_output_tokens`` tokens was when streamed."""
    skip_left = seq.skip_output_tokens - len(seq.output_ids)
    if skip_left <= 0:
        kept, text, stopped = seq.text.push(ids)
        return kept, "", text, stopped
    if skip_left >= len(ids):
        kept, text, stopped = seq.text.push(ids)
        return kept, text, "", stopped
    first = seq.text.push(ids[:skip_left])
    if first.stopped:
        return first.kept, first.text, "", True
    second = seq.text.push(ids[skip_left:])
    return first.kept + second.kept, first.text, second.text, second.stopped


def request_output(
    seq: Sequence,
    new_ids: list[int],
    text: str,
    log_probs: list[float] | None = None,
    top_log_probs: list[TokenAlternatives] | None = None,
) -> RequestOutput:
    """The request's output for this step (log-probabilities and alternatives empty, not absent, when
    it asked for them)."""
    if log_probs is None and seq.sampling.return_log_probs:
        log_probs = []
    if top_log_probs is None and seq.sampling.top_log_probs:
        top_log_probs = []
    return RequestOutput(
        seq.seq_id,
        new_ids,
        text,
        seq.finished,
        seq.finish_reason,
        seq.stats,
        seq.error,
        new_log_probs=log_probs,
        new_top_log_probs=top_log_probs,
        num_prompt_tokens=len(seq.prompt_ids),
        first_scheduled_ns=seq.first_scheduled_ns,
        seed=None if seq.sampling.greedy else seq.sampling.seed,
        cached_tokens=seq.kv_metrics.cached_tokens if seq.kv_metrics is not None else 0,
        kv_metrics=seq.kv_metrics,
    )
