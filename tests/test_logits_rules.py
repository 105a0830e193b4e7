"""Request rules that reshape the distribution (penalties, bad words, min_tokens), end_id -1 and
log-probabilities: the pure function with hand-made logits, then through the whole loop.

The chi-square test that penalties keep speculative sampling lossless is in
test_speculative_sampling.py.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from tiny import ascii_tokenizer, model_drafter, run_to_completion, spec_engine, tiny_engine, tokens_of
from trispec.engine.base import ForwardInput
from trispec.errors import InvalidInputError
from trispec.logits_rules import apply_rules, log_probs_of, top_log_probs_of
from trispec.request import GenerationRequest
from trispec.sampling import logits_to_probs
from trispec.sampling_params import SamplingParams

PROMPT = [11, 40, 7, 93, 12, 40]


def test_penalties_follow_the_tokens_seen_row_by_row() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]] * 3)
    params = SamplingParams(repetition_penalty=2.0, presence_penalty=0.25, frequency_penalty=0.5)
    # context [0, 1, 0]; row 1 has also seen draft 2, row 2 drafts 2 and 3
    out = apply_rules(logits, params, [0, 1, 0], drafts=[2, 3])
    # token 0 seen twice: 2/2 - 0.25 - 2*0.5; token 1 once: -2*2 - 0.25 - 0.5
    assert out[0].tolist() == pytest.approx([-0.25, -4.75, 1.0, 0.5])
    assert out[1].tolist() == pytest.approx([-0.25, -4.75, 0.5 - 0.75, 0.5])
    assert out[2].tolist() == pytest.approx([-0.25, -4.75, -0.25, 0.25 - 0.75])
    assert torch.equal(logits, torch.tensor([[2.0, -2.0, 1.0, 0.5]] * 3))  # input untouched


def test_bad_words_and_min_tokens_mask_where_they_apply() -> None:
    logits = torch.zeros(3, 6)
    params = SamplingParams(
        bad_words_ids=((5,), (1, 2), (3, 4, 0)), min_tokens=3, end_ids=frozenset({1}), prompt_len=2
    )
    out = apply_rules(logits, params, [9 % 6, 1], drafts=[3, 4])
    masked = [[i for i, v in enumerate(row) if v == -math.inf] for row in out.tolist()]
    # row 0: after [.., 1] -> 2 banned; 0 generated < 3 -> end id 1 banned; 5 always
    # row 1: after [.., 1, 3] -> only 5 and the end id; row 2: after [.., 3, 4] -> 0 banned too
    assert masked == [[1, 2, 5], [1, 5], [0, 1, 5]]
    # generated count reaches min_tokens: the end id is allowed again
    later = apply_rules(logits, params, [0, 1, 7, 7, 7], drafts=[])
    assert later[0, 1] == 0.0


def test_rules_are_off_by_default() -> None:
    assert not SamplingParams(temperature=0.7, top_k=5).shapes_logits
    assert SamplingParams(min_tokens=1).shapes_logits and SamplingParams(presence_penalty=0.1).shapes_logits
    assert SamplingParams(logit_bias=((3, 1.0),)).shapes_logits


def test_logit_bias_comes_first_then_the_penalties() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]] * 2)
    # token 0 seen: (2 + 1) / 2, the bias first (TensorRT-LLM adds its bias before the penalties);
    # row 1 has seen draft 2 as well; a repeated id has its biases summed
    params = SamplingParams(repetition_penalty=2.0, logit_bias=((0, 1.0), (3, -0.25), (3, -0.25)))
    out = apply_rules(logits, params, [0], drafts=[2])
    assert out.tolist() == [[1.5, -2.0, 1.0, 0.0], [1.5, -2.0, 0.5, 0.0]]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("repetition_penalty", 0.0),
        ("presence_penalty", float("nan")),
        ("min_tokens", -1),
        ("bad_words", [""]),
        ("logit_bias", {10**6: 1.0}),
        ("logit_bias", {-1: 1.0}),
        ("logit_bias", {3: float("inf")}),
        ("logit_bias", [(3, 1.0)]),
        ("embedding_bias_weights", [("a", float("nan"))]),
        ("embedding_bias_words", [("", 1.0)]),
    ],
)
def test_bad_values_name_the_field(field: str, value: object) -> None:
    llm = spec_engine(tiny_engine(0), None)
    given = "embedding_bias" if field.startswith("embedding_bias") else field
    with pytest.raises(InvalidInputError) as info:
        llm.add_request(GenerationRequest(prompt_token_ids=PROMPT, **{given: value}))  # type: ignore[arg-type]
    assert info.value.field == field


TOKENIZER = ascii_tokenizer()


def generate(k: int, **fields: object) -> list[int]:
    llm = spec_engine(tiny_engine(0), model_drafter(5), TOKENIZER, max_context=256)
    rid = llm.add_request(
        GenerationRequest(prompt_token_ids=PROMPT, max_tokens=40, num_draft_tokens=k, **fields)
    )  # type: ignore[arg-type]
    return tokens_of(run_to_completion(llm)[rid])


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_bad_words_never_appear(sampled: bool) -> None:
    sampling: dict[str, object] = {"temperature": 0.9, "seed": 3} if sampled else {}
    free = generate(4, **sampling)
    single = max(set(free), key=free.count)  # the token it emits most
    pair = next((a, b) for a, b in itertools.pairwise(free) if single not in (a, b))
    words = [TOKENIZER.decode([single]), TOKENIZER.decode(list(pair))]
    assert [TOKENIZER.encode(w) for w in words] == [[single], list(pair)]  # the words are these tokens
    banned = generate(4, bad_words=words, **sampling)
    assert single not in banned
    assert all((a, b) != pair for a, b in itertools.pairwise(banned))
    assert banned != free and len(banned) == 40


def test_min_tokens_holds_the_end_id_back_and_end_id_minus_one_means_none() -> None:
    free = generate(4)
    end = free[2]  # an end id the request would emit as its third token
    assert len(generate(4, end_id=end)) == 3
    held = generate(4, end_id=end, min_tokens=10)
    assert end not in held[:10] and len(held) >= 11
    assert generate(4, end_id=-1) == free  # no end id at all: only max_tokens ends it
    # an id past the vocabulary can never be generated: none either (min_tokens masks nothing for it)
    assert generate(4, end_id=1_048_576, min_tokens=5) == free


@pytest.mark.parametrize("k", [0, 4])
def test_log_probs_equal_the_target_only_run(k: int) -> None:
    llm = spec_engine(tiny_engine(0), model_drafter(5), max_context=256)
    rid = llm.add_request(
        GenerationRequest(prompt_token_ids=PROMPT, max_tokens=24, num_draft_tokens=k, return_log_probs=True)
    )
    outputs = run_to_completion(llm)[rid]
    tokens = tokens_of(outputs)
    log_probs = [lp for out in outputs for lp in (out.new_log_probs or [])]
    assert len(log_probs) == len(tokens) == 24
    # target alone, one token per forward: log-softmax of its logits at each emitted token
    target = tiny_engine(0)
    target.add_sequence(0, len(PROMPT) + 24)
    logits = target.forward([ForwardInput(0, PROMPT, 1)])[0]
    expected = []
    for token in tokens:
        expected.append(float(torch.log_softmax(logits[-1], -1)[token]))
        logits = target.forward([ForwardInput(0, [token], 1)])[0]
    assert log_probs == pytest.approx(expected, abs=1e-4)


def test_sampled_log_probs_are_those_of_the_distribution_sampled_from() -> None:
    fields = {"temperature": 0.7, "top_k": 5, "seed": 2, "return_log_probs": True}
    llm = spec_engine(tiny_engine(0), model_drafter(5), max_context=256)
    rid = llm.add_request(
        GenerationRequest(prompt_token_ids=PROMPT, max_tokens=12, num_draft_tokens=4, **fields)
    )  # type: ignore[arg-type]
    outputs = run_to_completion(llm)[rid]
    tokens = tokens_of(outputs)
    log_probs = [lp for out in outputs for lp in (out.new_log_probs or [])]
    assert len(log_probs) == len(tokens) == 12
    # each under the target's own distribution after temperature and top-k
    params = SamplingParams(temperature=0.7, top_k=5)
    target = tiny_engine(0)
    target.add_sequence(0, len(PROMPT) + 12)
    logits = target.forward([ForwardInput(0, PROMPT, 1)])[0]
    for token, lp in zip(tokens, log_probs):
        assert lp == pytest.approx(math.log(float(logits_to_probs(logits[-1:], params)[0, token])), abs=1e-4)
        logits = target.forward([ForwardInput(0, [token], 1)])[0]


def test_alternatives_are_the_most_likely_tokens_in_a_canonical_order() -> None:
    # token 3 and token 1 tie; the lower id comes first whatever topk returns
    logits = torch.tensor([[0.0, 2.0, -1.0, 2.0, 1.0], [5.0, 0.0, 0.0, 0.0, 0.0]])
    greedy = SamplingParams(return_log_probs=True, top_log_probs=3)
    rows = top_log_probs_of(logits, greedy, 2)
    assert rows[0].token_ids == (1, 3, 4) and rows[1].token_ids == (0, 1, 2)
    log_softmax = torch.log_softmax(logits, -1)
    assert rows[0].log_probs == pytest.approx([float(log_softmax[0, i]) for i in (1, 3, 4)])
    # the emitted token's own log-prob is its entry among them
    assert log_probs_of(logits, greedy, [3, 0]) == pytest.approx([rows[0].log_probs[1], rows[1].log_probs[0]])
    # sampled with top_k 2: only what the distribution can give, fewer than asked for
    sampled = SamplingParams(temperature=0.5, top_k=2, seed=1, return_log_probs=True, top_log_probs=4)
    probs = logits_to_probs(logits, sampled)
    cut = top_log_probs_of(logits, sampled, 2, probs)
    assert cut[0].token_ids == (1, 3) and cut[0].log_probs == pytest.approx([math.log(0.5)] * 2)
    assert len(cut[1].token_ids) == 2 and cut[1].token_ids[0] == 0
    assert top_log_probs_of(logits, greedy, 0) == []


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"top_log_probs": 2}, "needs return_log_probs"),
        ({"top_log_probs": 21, "return_log_probs": True}, r"must be in \[0, 20\]"),
        ({"top_log_probs": -1, "return_log_probs": True}, r"must be in \[0, 20\]"),
        ({"top_log_probs": True, "return_log_probs": True}, "must be an integer"),
    ],
)
def test_bad_alternative_counts_are_refused_by_name(fields: dict, message: str) -> None:
    with pytest.raises(InvalidInputError, match=f"top_log_probs.*{message}"):
        SamplingParams(**fields)


@pytest.mark.parametrize("fields", [{}, {"temperature": 0.8, "top_k": 3, "seed": 3}])
def test_alternatives_are_the_target_only_runs_whatever_k(fields: dict) -> None:
    """Alternatives come from the verify rows, bit for bit what a k = 0 run gives; and they are the
    top of the target's own distribution at each emitted token, which ranks among them (sampled with
    top_k 3: three of the five asked for, the only tokens that could be drawn)."""
    runs = {}
    for k in (0, 4):
        llm = spec_engine(tiny_engine(0), model_drafter(5), max_context=256)
        request = GenerationRequest(
            prompt_token_ids=PROMPT,
            max_tokens=16,
            num_draft_tokens=k,
            return_log_probs=True,
            top_log_probs=5,
            **fields,
        )
        rid = llm.add_request(request)
        outputs = run_to_completion(llm)[rid]
        top = [alt for out in outputs for alt in (out.new_top_log_probs or [])]
        log_probs = [lp for out in outputs for lp in (out.new_log_probs or [])]
        runs[k] = (tokens_of(outputs), log_probs, top)
    assert runs[0] == runs[4]
    tokens, log_probs, top = runs[0]
    assert len(top) == len(tokens) == 16
    params = SamplingParams(**{k: v for k, v in fields.items() if k != "seed"})
    target = tiny_engine(0)
    target.add_sequence(0, len(PROMPT) + 16)
    logits = target.forward([ForwardInput(0, PROMPT, 1)])[0]
    for token, lp, alternatives in zip(tokens, log_probs, top):
        row = logits[-1:]
        dist = torch.log_softmax(row, -1) if params.greedy else torch.log(logits_to_probs(row, params))
        values, ids = torch.topk(dist[0], 5)
        kept = [(float(v), int(i)) for v, i in zip(values, ids) if v != -math.inf]
        assert set(alternatives.token_ids) == {i for _, i in kept}
        assert list(alternatives.log_probs) == pytest.approx(
            sorted((v for v, _ in kept), reverse=True), abs=1e-4
        )
        assert len(alternatives.token_ids) == (5 if params.greedy else 3)
        assert token in alternatives.token_ids
        assert alternatives.log_probs[alternatives.token_ids.index(token)] == lp
        logits = target.forward([ForwardInput(0, [token], 1)])[0]


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_a_logit_bias_steers_every_k_alike(sampled: bool) -> None:
    """A bias of -100 bans the token plain decoding emits most, +100 on another token makes it the
    only one emitted; speculation (the draft model biased as the target is) changes neither text."""
    sampling: dict[str, object] = {"temperature": 0.9, "seed": 3} if sampled else {}
    free = generate(0, **sampling)
    common = max(set(free), key=free.count)
    banned = {k: generate(k, logit_bias={common: -100.0}, **sampling) for k in (0, 4)}
    assert banned[0] == banned[4] and common not in banned[0] and banned[0] != free
    rare = next(t for t in range(32, 127) if t not in free)
    forced = {k: generate(k, logit_bias={rare: 100.0}, **sampling) for k in (0, 4)}
    assert forced[0] == forced[4] == [rare] * 40
    # the same as an embedding bias on the words those tokens spell (the ASCII tokenizer: one a byte)
    words = [(TOKENIZER.decode([common]), -60.0), (TOKENIZER.decode([common]), -40.0)]
    assert generate(4, embedding_bias=words, **sampling) == banned[0]
