"""Prefix routing (no server): requests that begin alike go to one replica, in one failover order, with
the cache salt taking part; the client sends a conversation's turns there with its salt; the CLI's
summary says the cached prompt tokens."""

from __future__ import annotations

import pytest
from client_stand_ins import STATS, Fleet
from trispec_client import Completion, InvalidRequestError, SpecDecClient, StreamChunk, cli


def test_requests_that_begin_alike_go_to_the_same_replica_and_fail_over_in_one_order() -> None:
    from trispec_client.routing import Router

    urls = ["a:1", "b:2", "c:3"]
    router = Router(urls)
    system = "You are a helpful assistant. " * 40  # 1,160 characters: past the 1,024 that place it
    turns = [system + "Hi", system + "Hi\nHello! How can I help?\nTell me a joke."]
    orders = [router.order(t) for t in turns]
    assert orders[0] == orders[1] and sorted(orders[0]) == [0, 1, 2]  # every replica, once
    assert Router(urls).order(turns[0]) == orders[0]  # any client places it alike: no shared state
    assert (
        router.order(turns[0], cache_salt="tenant-b") != orders[0]
        or router.order(turns[0], cache_salt="tenant-c") != orders[0]
    )  # the salt takes part
    # different conversations spread over the replicas; dropping one moves only its own requests
    prompts = [f"conversation {i}: " + "x" * 30 for i in range(600)]
    homes = [router.order(p)[0] for p in prompts]
    assert all(homes.count(r) > 150 for r in range(3))
    fewer = Router(["a:1", "c:3"])
    for prompt, home in zip(prompts, homes):
        if home != 1:
            assert ["a:1", "c:3"][fewer.order(prompt)[0]] == urls[home]
    # round-robin: in turn, whatever the text
    rr = Router(urls, "round-robin")
    assert [rr.order(turns[0])[0] for _ in range(4)] == [0, 1, 2, 0]
    with pytest.raises(ValueError, match="routing"):
        Router(urls, "random")  # type: ignore[arg-type]


def test_a_client_sends_a_conversations_turns_to_one_replica_and_its_salt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = SpecDecClient(["a:1", "b:2", "c:3", "d:4"], timeout_s=30)
    final = StreamChunk("", 1, final=True, finish_reason="length", stats=STATS, cached_tokens=12)
    fleet = Fleet(client, monkeypatch, **{f"r{i}": [[final]] * 4 for i in range(4)})
    history = "Some long shared context. " * 50
    for turn in ("one", "two", "three"):
        history += turn
        assert client.generate(history, cache_salt="s3cret").cached_tokens == 12
    places = {index for index, _ in fleet.sent}
    assert len(places) == 1 and all(r.cache_salt == "s3cret" for _, r in fleet.sent)
    assert fleet.sent[0][1].sent_values()["cache_salt"] == "s3cret"
    with pytest.raises(InvalidRequestError, match="cache_salt"):
        client.generate("x", cache_salt="")


def test_cli_summary_says_the_cached_prompt_tokens() -> None:
    completion = Completion("x", 2, "length", None, cached_tokens=48)
    assert cli.summary(completion) == "[2 tokens, length, 48 prompt tokens cached]"
    assert cli.summary(Completion("x", 2, "length", None, cached_tokens=0)) == "[2 tokens, length]"
