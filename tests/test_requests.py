"""Request lifecycle through the llm: bad input, end ids, stop strings, max_tokens, cancel."""

from __future__ import annotations

import pytest
from tiny import ascii_tokenizer, model_drafter, run_to_completion, spec_engine, tiny_engine, tokens_of
from trispec.errors import InvalidInputError
from trispec.llm import Scheduler
from trispec.request import GenerationRequest
from trispec.sequence import FinishReason


@pytest.fixture
def llm() -> Scheduler:
    return spec_engine(tiny_engine(0, num_blocks=64), model_drafter(5), ascii_tokenizer(), max_context=256)


BAD_REQUESTS = [
    ({"prompt": ""}, "prompt"),
    ({"prompt_token_ids": []}, "prompt_token_ids"),
    ({"prompt_token_ids": [1, 2, 99999]}, "prompt_token_ids"),
    ({"prompt": "x" * 300}, "prompt"),  # longer than the 256-token context
    ({"prompt": "hello", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hello", "max_tokens": -3}, "max_tokens"),
    ({"prompt": "hello", "max_tokens": 1000}, "max_tokens"),  # prompt + max_tokens > context
    ({"prompt": "hello", "num_draft_tokens": 9}, "num_draft_tokens"),  # above the configured max 8
    ({"prompt": "hello", "num_draft_tokens": -1}, "num_draft_tokens"),
    ({"prompt": "hello", "temperature": -0.5}, "temperature"),
    ({"prompt": "hello", "temperature": float("nan")}, "temperature"),
    ({"prompt": "hello", "top_p": 0.0}, "top_p"),
    ({"prompt": "hello", "top_p": 1.5}, "top_p"),
    ({"prompt": "hello", "top_k": -1}, "top_k"),
    ({"prompt": "hello", "seed": -2}, "seed"),
    ({"prompt": "hello", "stop": [""]}, "stop"),
    ({"prompt": "hello", "end_id": -2}, "end_id"),
]


@pytest.mark.parametrize(("fields", "field"), BAD_REQUESTS)
def test_bad_request_names_the_field_and_spares_the_batch(llm: Scheduler, fields: dict, field: str) -> None:
    good = llm.add_request(GenerationRequest(prompt="abc", max_tokens=12, num_draft_tokens=3))
    first = llm.step()
    with pytest.raises(InvalidInputError) as info:
        llm.add_request(GenerationRequest(**fields))
    assert info.value.field == field
    outputs = run_to_completion(llm)
    assert len(tokens_of([*first, *outputs[good]])) == 12
    assert set(outputs) == {good}  # the bad request never entered the batch


def test_end_id_finishes_and_is_not_in_text(llm: Scheduler) -> None:
    rid = llm.add_request(GenerationRequest(prompt="abcd", max_tokens=30, num_draft_tokens=4))
    free_run = tokens_of(run_to_completion(llm)[rid])
    end_id = free_run[5]
    first = free_run.index(end_id)
    rid = llm.add_request(GenerationRequest(prompt="abcd", max_tokens=30, num_draft_tokens=4, end_id=end_id))
    outputs = run_to_completion(llm)[rid]
    assert tokens_of(outputs) == free_run[: first + 1]
    assert outputs[-1].finish_reason is FinishReason.STOP
    text = "".join(o.new_text for o in outputs)
    assert text == ascii_tokenizer().decode(free_run[:first])


def test_stop_string_across_tokens_emits_nothing_past_it(llm: Scheduler) -> None:
    rid = llm.add_request(GenerationRequest(prompt="hello", max_tokens=40, num_draft_tokens=6))
    outputs = run_to_completion(llm)[rid]
    full_ids = tokens_of(outputs)
    full_text = "".join(o.new_text for o in outputs)
    assert full_text == ascii_tokenizer().decode(full_ids)
    # a stop string spanning several byte tokens in the middle of the output
    stop = full_text[10:13]
    assert len(stop) == 3
    cut = full_text.index(stop)
    rid = llm.add_request(GenerationRequest(prompt="hello", max_tokens=40, num_draft_tokens=6, stop=[stop]))
    outputs = run_to_completion(llm)[rid]
    assert "".join(o.new_text for o in outputs) == full_text[:cut]
    kept = tokens_of(outputs)
    # tokens end with the one that completed the stop string, none after it
    assert ascii_tokenizer().decode(kept).endswith(stop)
    assert not ascii_tokenizer().decode(kept[:-1]).endswith(stop)
    assert outputs[-1].finish_reason is FinishReason.STOP


def test_max_tokens_is_exact_for_every_k(llm: Scheduler) -> None:
    ids = {
        k: llm.add_request(GenerationRequest(prompt="xyz", max_tokens=7, num_draft_tokens=k))
        for k in range(9)
    }
    outputs = run_to_completion(llm)
    for rid in ids.values():
        assert len(tokens_of(outputs[rid])) == 7
        assert outputs[rid][-1].finish_reason is FinishReason.LENGTH
    assert len({tuple(tokens_of(outputs[rid])) for rid in ids.values()}) == 1


def test_cancel_frees_kv_and_spares_others(llm: Scheduler) -> None:
    target = llm.runner.target  # type: ignore[attr-defined]
    requests = {
        name: GenerationRequest(prompt=name, max_tokens=30, num_draft_tokens=2)
        for name in ("keep", "now", "later")
    }
    alone = {}
    for name, request in requests.items():
        rid = llm.add_request(request)
        alone[name] = tokens_of(run_to_completion(llm)[rid])
    ids = {name: llm.add_request(request) for name, request in requests.items()}
    outputs: dict[int, list] = {}

    def step() -> None:
        for out in llm.step():
            outputs.setdefault(out.request_id, []).append(out)

    step()
    step()
    llm.cancel(ids["now"])
    step()
    assert outputs[ids["now"]][-1].finish_reason is FinishReason.CANCELLED
    step()
    llm.cancel(ids["later"])
    step()
    assert outputs[ids["later"]][-1].finish_reason is FinishReason.CANCELLED
    for rid, outs in run_to_completion(llm).items():
        outputs.setdefault(rid, []).extend(outs)
    # nothing arrives after the final (cancelled) response, and what did arrive was correct
    for name in ("now", "later"):
        outs = outputs[ids[name]]
        assert sum(o.finished for o in outs) == 1 and outs[-1].finished
        assert tokens_of(outs) == alone[name][: len(tokens_of(outs))]
    assert tokens_of(outputs[ids["keep"]]) == alone["keep"]
    assert target.kv_usage().used_blocks == 0
    assert llm.runner.drafter.engine.kv_usage().used_blocks == 0  # type: ignore[union-attr]
