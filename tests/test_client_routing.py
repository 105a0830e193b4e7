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


URLS = ["a:1", "b:2", "c:3", "d:4"]


def _by_index(cut_on: int, gone: set[int], n: int = len(URLS)) -> int:
    """Where the old rule (the next replica by index) resumed a stream cut on ``cut_on``."""
    return next(i for i in ((cut_on + k) % n for k in range(1, n + 1)) if i not in gone)


def _prompt_that_index_order_misplaces() -> tuple[str, list[int]]:
    """A prompt whose rendezvous order is not the index order after its first two replicas."""
    from trispec_client.routing import Router

    router = Router(URLS)
    for i in range(1000):
        prompt = f"conversation {i}: " + "x" * 30
        order = router.order(prompt)
        if order[1] != _by_index(order[0], {order[0]}) and order[2] != _by_index(order[1], set(order[:2])):
            return prompt, order
    raise AssertionError("no such prompt among 1,000")


def test_a_resume_goes_where_the_key_fails_over_and_removing_a_replica_moves_only_its_keys() -> None:
    """The replica a cut stream resumes on is the next by rendezvous weight for the request's key: the
    one any client picks for that key once the replica is gone (its later turns meet the KV the
    resumed stream left there)."""
    from trispec_client.routing import Router, resume_order

    router = Router(URLS)
    prompts = [f"conversation {i}: " + "x" * 30 for i in range(400)]
    for prompt in prompts:
        order = router.order(prompt)
        assert resume_order(order, order[0]) == order[1:] + order[:1]
        assert resume_order(order, order[1]) == [order[0], *order[2:], order[1]]
        # without its home, the key's new home is the replica its stream resumed on; the others stay
        for gone in range(len(URLS)):
            fewer = [url for i, url in enumerate(URLS) if i != gone]
            home = fewer[Router(fewer).order(prompt)[0]]
            want = order[1] if order[0] == gone else order[0]
            assert home == URLS[want], (prompt, gone)
    # round-robin: the next replica in turn, as before
    rr = Router(URLS, "round-robin")
    order = rr.order("x")
    assert resume_order(order, order[0]) == [(order[0] + k) % 4 for k in range(1, 5)]


def test_a_client_resumes_a_cut_stream_on_the_replica_of_next_highest_weight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """4 replicas, prefix routing: the home replica cuts the stream and is gone, so it resumes on the
    second by weight; that one cuts it too and goes, so on the third: never the next by index."""
    from trispec_client import SpecDecConnectionError
    from trispec_client.resume import text_digest

    prompt, order = _prompt_that_index_order_misplaces()
    client = SpecDecClient(URLS, timeout_s=30, resume_timeout_s=5)
    cut = SpecDecConnectionError("Stream removed")
    first = {"model_fingerprint": "aaaa"}  # an attempt's first chunk names the model
    # the attempts in turn, whichever replica takes each: the stream goes on wherever it resumes
    attempts = [
        [StreamChunk("Bon", 2, seed=7, **first), cut],
        [StreamChunk("jour", 4, skipped_text_sha256=text_digest("Bon"), **first), cut],
        [
            StreamChunk(" à", 6, skipped_text_sha256=text_digest("Bonjour"), **first),
            StreamChunk("", 6, final=True, finish_reason="length", stats=STATS),
        ],
    ]
    fleet = Fleet(client, monkeypatch, **{f"r{i}": [] for i in range(4)})

    def attempt_then_gone(index: int, request: object, timeout_s: float) -> object:
        fleet.outcomes[index].append(attempts[len(fleet.sent)])
        fleet.ready[index] = False  # the replica that took it dies with the stream
        return Fleet.attempt(fleet, index, request, timeout_s)  # type: ignore[arg-type]

    monkeypatch.setattr(client.replicas, "attempt", attempt_then_gone)
    chunks = list(client.stream(prompt, temperature=0.8))
    assert [index for index, _ in fleet.sent] == order[:3]
    assert "".join(c.text for c in chunks) == "Bonjour à" and chunks[-1].stats.resumed == 2


def test_the_openai_endpoint_resumes_a_cut_stream_on_the_replica_of_next_highest_weight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """specdec-openai's generator, its replicas stood in for: the same order as the client's."""
    import asyncio

    from trispec_client import GenerationRequest
    from trispec_client.resume import text_digest
    from trispec_openai.errors import OpenAIError
    from trispec_openai.triton import Piece, TritonGenerator, _Cut

    prompt, order = _prompt_that_index_order_misplaces()
    generator = TritonGenerator(URLS, "specdec", timeout_s=30, resume_timeout_s=5)
    cut = _Cut(OpenAIError(502, "Stream removed"))
    first = {"model_fingerprint": "aaaa"}
    # the attempts in turn, whichever replica takes each: the stream goes on wherever it resumes
    attempts = [
        [Piece("Bon", 2, seed=7, **first), cut],
        [Piece("jour", 4, skipped_text_sha256=text_digest("Bon"), **first), cut],
        [
            Piece(" à", 6, skipped_text_sha256=text_digest("Bonjour"), **first),
            Piece("", 6, final=True, finish_reason="length"),
        ],
    ]
    ready = dict.fromkeys(range(4), True)
    sent: list[int] = []

    async def attempt(request: object, asked: object, request_id: str, extra: object, replica: int = 0):  # type: ignore[no-untyped-def]
        items = attempts[len(sent)]
        sent.append(replica)
        ready[replica] = False  # the replica that took it dies with the stream
        for item in items:
            if isinstance(item, Exception):
                raise item
            yield item

    async def replica_ready(index: int, timeout_s: float = 5.0) -> bool:
        return ready[index]

    monkeypatch.setattr(generator, "_attempt", attempt)
    monkeypatch.setattr(generator, "replica_ready", replica_ready)

    async def run() -> list[Piece]:
        request = GenerationRequest(prompt, temperature=0.8)
        return [p async for p in generator.stream(request, logprobs=False, request_id="r")]

    pieces = asyncio.run(run())
    assert sent == order[:3]
    assert "".join(p.text for p in pieces) == "Bonjour à" and generator.resumed_total == 2
