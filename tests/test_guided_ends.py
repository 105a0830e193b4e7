"""Where a guided request ends, and why it stops, on the torch runner with tiny random models: a
request end id the grammar needs as text is text there (the request ends where the grammar may end,
and there the end id ends it); a row the request's own rules empty says which rule did; and the
grammar's matcher survives whatever its draft checks meet (guided/state.py)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from tiny import TINY_VOCAB, byte_tokenizer, model_drafter, run_to_completion, spec_engine, tiny_engine
from trispec import verifier
from trispec.accept import AcceptResult
from trispec.drafters.ngram import NgramDrafter
from trispec.guided import Guide
from trispec.guided.compiler import GrammarCompiler
from trispec.guided.state import NO_ALLOWED_TOKEN, GrammarError, GrammarState
from trispec.request import GenerationRequest
from trispec.runners import torch_runner
from trispec.sequence import FinishReason

TOK = byte_tokenizer()


def _id(text: str) -> int:
    (token,) = TOK.encode(text, add_bos=False)
    return token


def _answer(guide: Guide, drafter: str, k: int = 4, **kw: object) -> tuple[str, object]:
    made = {"model": model_drafter(1), "ngram": NgramDrafter(TINY_VOCAB), "none": None}[drafter]
    llm = spec_engine(tiny_engine(0), made)
    kw.setdefault("max_tokens", 40)
    request = GenerationRequest(prompt="go", num_draft_tokens=k if made else 0, guide=guide, **kw)
    rid = llm.add_request(request)
    outs = run_to_completion(llm)[rid]
    return "".join(o.new_text for o in outs), outs[-1]


# (regex, the end id's text, the answer): the end id is a character the grammar needs inside the
# answer, once or more; the answer is the only text the regex allows
NEEDED_AS_TEXT = [
    ("ab\ncd", "\n", "ab\ncd"),
    ("x,y,z", ",", "x,y,z"),
    ("(no)-(no)", "-", "no-no"),
    ("[.]{3}a", ".", "...a"),
]


@pytest.mark.parametrize(("regex", "end", "want"), NEEDED_AS_TEXT)
@pytest.mark.parametrize("drafter", ["model", "ngram", "none"])
def test_an_end_id_the_grammar_needs_as_text_is_text_there(
    regex: str, end: str, want: str, drafter: str
) -> None:
    text, last = _answer(Guide("regex", regex), drafter, end_id=_id(end))
    assert (text, last.finish_reason, last.error) == (want, FinishReason.STOP, None)


@pytest.mark.parametrize("rule", ["coupled", "rejection"])
def test_sampled_the_end_id_is_text_inside_and_the_end_after_whatever_k(rule: str) -> None:
    regex = "[a-d]{2}\n[a-d]{2}(\n[a-d])?"
    texts = set()
    for k in (0, 4):
        llm = spec_engine(tiny_engine(0), model_drafter(1), sampling_rule=rule)
        guide = Guide("regex", regex)
        request = GenerationRequest(
            prompt="go",
            max_tokens=20,
            num_draft_tokens=k,
            guide=guide,
            end_id=_id("\n"),
            temperature=0.9,
            seed=3,
        )
        rid = llm.add_request(request)
        outs = run_to_completion(llm)[rid]
        text = "".join(o.new_text for o in outs)
        # the newline inside is text; after the fifth letter the grammar may end: a newline ends it
        assert re.fullmatch("[a-d]{2}\n[a-d]{2}", text) and outs[-1].finish_reason is FinishReason.STOP, text
        texts.add(text)
    assert len(texts) == 1 or rule == "rejection", texts  # the rejection rule's draws depend on k


def test_where_the_grammar_may_end_the_end_id_ends_it() -> None:
    # after "ab" the grammar may end or go on with "\n...": the end id "\n" there is the end
    for drafter in ("model", "none"):
        text, last = _answer(Guide("regex", "ab(\ncd)?"), drafter, end_id=_id("\n"))
        assert (text, last.finish_reason) == ("ab", FinishReason.STOP)
    # and once complete, the same end id (which the grammar took as text before) ends it
    ids = TOK.encode("ab\ncd", add_bos=False)
    llm = spec_engine(tiny_engine(0), model_drafter(1))
    guide = Guide("regex", "ab\ncd")
    rid = llm.add_request(GenerationRequest(prompt="go", max_tokens=9, guide=guide, end_id=_id("\n")))
    outs = run_to_completion(llm)[rid]
    assert [t for o in outs for t in o.new_token_ids] == [*ids, _id("\n")]
    assert outs[-1].finish_reason is FinishReason.STOP


def test_min_tokens_does_not_hold_back_an_end_id_that_is_text() -> None:
    text, last = _answer(Guide("regex", "ab\ncd"), "model", end_id=_id("\n"), min_tokens=4)
    assert (text, last.finish_reason) == ("ab\ncd", FinishReason.STOP)


@pytest.mark.parametrize(
    ("guide", "rules", "rule", "text"),
    [
        # the grammar allows only "a" then "b"; bad_words forbids "b" after "a"
        (Guide("regex", "ab"), {"bad_words": ["ab"]}, "bad_words", "a"),
        # after "ab" the grammar allows only its end (the end id "\n"), which min_tokens holds back
        (Guide("regex", "ab\n?"), {"end_id": _id("\n"), "min_tokens": 5}, "min_tokens", "ab"),
        # a bias that is -inf in float32 takes "b" out
        (Guide("regex", "ab"), {"logit_bias": {_id("b"): -1e39}}, "logit_bias", "a"),
    ],
    ids=["bad_words", "min_tokens", "logit_bias"],
)
def test_a_row_the_requests_rules_empty_says_which_rule_did(
    guide: Guide, rules: dict, rule: str, text: str
) -> None:
    for drafter in ("model", "none"):
        got, last = _answer(guide, drafter, **rules)
        assert (got, last.finish_reason) == (text, FinishReason.GRAMMAR_DEAD_END)
        assert rule in last.error and NO_ALLOWED_TOKEN not in last.error, last.error
        assert "every token the grammar allows" in last.error


# -- the matcher survives -----------------------------------------------------------------------
class FailingMatcher:
    """An llguidance matcher whose ``compute_bitmask`` raises after ``masks`` calls, or whose
    ``refuse``-th consume is refused (returns False / 0, consuming nothing)."""

    def __init__(self, matcher: object, masks: int = -1, refuse: int = -1) -> None:
        self.matcher, self.masks, self.refuse = matcher, masks, refuse

    def compute_bitmask(self) -> bytes:
        if self.masks == 0:
            raise RuntimeError("the matcher failed")
        self.masks -= 1
        return self.matcher.compute_bitmask()  # type: ignore[attr-defined]

    def consume_token(self, token: int) -> bool:
        return self.try_consume_tokens([token]) == 1

    def try_consume_tokens(self, tokens: list[int]) -> int:
        self.refuse -= 1
        if self.refuse == 0:
            return 0
        return self.matcher.try_consume_tokens(tokens)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.matcher, name)


def _state(regex: str = "(ab|cd)[0-9]{4}") -> GrammarState:
    compiled = GrammarCompiler(TOK.backend, TOK.eos_ids, TINY_VOCAB).compile(Guide("regex", regex))
    state = GrammarState(compiled, TOK.eos_ids, 2, TINY_VOCAB)
    state.sync([0, 1, *TOK.encode("a", add_bos=False)])
    return state


def test_a_draft_check_that_fails_leaves_the_grammar_where_it_was() -> None:
    state = _state()
    before = state.allowed_after([])
    drafts = TOK.encode("b12", add_bos=False)
    state.matcher = FailingMatcher(state.matcher, masks=2)  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="the matcher failed"):
        state.check_drafts(drafts)  # fails with two drafts consumed
    state.matcher = state.matcher.matcher  # type: ignore[attr-defined]
    assert np.array_equal(state.allowed_after([]), before)
    assert state.check_drafts(drafts)[0] == 3


def test_a_draft_the_matcher_refuses_is_an_error_naming_it_and_the_grammar_survives() -> None:
    state = _state()
    drafts = TOK.encode("b12", add_bos=False)
    state.matcher = FailingMatcher(state.matcher, refuse=2)  # type: ignore[assignment]
    with pytest.raises(GrammarError, match=r"draft token \d+ \('1'\)"):
        state.check_drafts(drafts)
    state.matcher = state.matcher.matcher  # type: ignore[attr-defined]
    assert not state.matcher.is_error()
    assert state.check_drafts(drafts)[0] == 3


def test_an_output_token_the_grammar_refuses_is_an_error_naming_it() -> None:
    state = _state()
    refused = TOK.encode("x", add_bos=False)[0]
    with pytest.raises(GrammarError, match=rf"output token {refused} \('x'\) at output position 1"):
        state.sync([0, 1, *TOK.encode("a", add_bos=False), refused])
    # the matcher keeps the tokens before, in no error state: the rest of the grammar still works
    assert not state.matcher.is_error()
    assert state.check_drafts(TOK.encode("b1", add_bos=False))[0] == 2


def test_a_verified_token_the_grammar_refuses_fails_the_request_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A runner slip that verifies a token the grammar refuses: the request fails there, saying which
    token, rather than ending later at a dead end the matcher's error state made."""
    real, refused = torch_runner.verify_round, _id("x")

    def first_token_wrong(*args: object, **kw: object) -> list[verifier.Verified]:
        out = real(*args, **kw)  # type: ignore[arg-type]
        if not first_token_wrong.done:  # type: ignore[attr-defined]
            first_token_wrong.done = True  # type: ignore[attr-defined]
            out[0] = dataclasses.replace(out[0], accepted=AcceptResult(0, [refused]))
        return out

    first_token_wrong.done = False  # type: ignore[attr-defined]
    monkeypatch.setattr(torch_runner, "verify_round", first_token_wrong)
    _, last = _answer(Guide("regex", "(ab|cd)[0-9]{4}"), "none")
    assert last.finish_reason is FinishReason.ERROR, last
    assert (
        f"GrammarError: the grammar refused output token {refused} ('x') at output position 0" in last.error
    )
