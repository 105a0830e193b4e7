"""Predicted outputs (OpenAI's ``prediction``): drafts copied from the caller's text, verified as any
draft, so the text is plain decoding's whatever the prediction, and a good one saves rounds."""

from __future__ import annotations

import pytest
from tiny import ascii_tokenizer, run_to_completion, spec_engine, tiny_engine, tokens_of
from trispec.drafters.model_drafter import ModelDrafter
from trispec.request import GenerationRequest

TOKENIZER = ascii_tokenizer()
PROMPT = [11, 40, 7, 93, 12, 40]
MAX_TOKENS = 40


class CountingDrafter(ModelDrafter):
    """The draft model, counting the sequences it is asked to draft for."""

    proposed = 0

    def propose(self, requests):  # type: ignore[no-untyped-def]
        CountingDrafter.proposed += len(requests)
        return super().propose(requests)


def run(sampling: dict[str, object], **fields: object):  # type: ignore[no-untyped-def]
    drafter = CountingDrafter(tiny_engine(5))
    # adaptive k on: a prediction request drafts its own k all the same
    llm = spec_engine(tiny_engine(0), drafter, TOKENIZER, max_context=256, adaptive_speculation=True)
    request = GenerationRequest(prompt_token_ids=PROMPT, max_tokens=MAX_TOKENS, **sampling, **fields)  # type: ignore[arg-type]
    rid = llm.add_request(request)
    outputs = run_to_completion(llm)[rid]
    return tokens_of(outputs), outputs[-1].stats


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "seed": 4}], ids=["greedy", "sampled"])
def test_a_prediction_saves_rounds_and_never_changes_the_text(sampling: dict[str, object]) -> None:
    plain, plain_stats = run(sampling, num_draft_tokens=0)
    assert plain_stats.rounds == MAX_TOKENS
    answer = TOKENIZER.decode(plain)
    CountingDrafter.proposed = 0
    exact, stats = run(sampling, num_draft_tokens=4, prediction=answer)
    assert exact == plain and stats.rounds <= MAX_TOKENS // 2
    # the tiny model's text repeats itself: a few drafts follow the wrong occurrence
    assert stats.accepted_tokens >= 0.7 * stats.draft_tokens
    assert CountingDrafter.proposed == 0  # the draft model never ran for it
    edited = answer[:15] + "#####" + answer[20:]  # the caller's guess, wrong in the middle
    partly, partly_stats = run(sampling, num_draft_tokens=4, prediction=edited)
    assert partly == plain and stats.rounds < partly_stats.rounds < MAX_TOKENS
    unrelated, unrelated_stats = run(sampling, num_draft_tokens=4, prediction="~~~~")
    assert unrelated == plain and unrelated_stats.draft_tokens == 0


def test_model_drafts_go_on_for_requests_without_one() -> None:
    CountingDrafter.proposed = 0
    tokens, _ = run({}, num_draft_tokens=4)
    assert CountingDrafter.proposed > 0 and tokens == run({}, num_draft_tokens=0)[0]
