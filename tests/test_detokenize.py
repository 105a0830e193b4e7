"""Incremental detokenizing and stop strings, with a hand-built byte tokenizer and the real one."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
import tokenizers
from tiny import byte_tokenizer
from tokenizers import decoders, models
from trispec.checkpoints import smollm2_gguf
from trispec.detokenize import IncrementalDetokenizer, StopMatcher, StopTextTracker
from trispec.errors import InvalidInputError
from trispec.gguf_tokenizer import load_tokenizer_for_gguf
from trispec.tokenizer import Tokenizer

TEXTS = [
    "plain ascii",
    "héllo wörld",
    "emoji 😀🎉👍🏽!",
    "中文字符，你好。",
    "mixed 日本 e\u0301 ∑x² 👨\u200d👩\u200d👧 end",
]


@pytest.fixture(scope="module")
def byte_tok() -> Tokenizer:
    """One token per byte, no merges: every non-ASCII character spans several tokens."""
    return byte_tokenizer()


@pytest.fixture(scope="module")
def smollm(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    # the session's base temp dir is shared, so the conversion is reused across test modules
    return load_tokenizer_for_gguf(smollm2_gguf(), tmp_path_factory.getbasetemp() / "tokcache")


def stream(detok: IncrementalDetokenizer, ids: Sequence[int], sizes: Sequence[int]) -> list[str]:
    pieces, i = [], 0
    for n in sizes:
        pieces.append(detok.push(ids[i : i + n]))
        i += n
    pieces.append(detok.push(ids[i:]))
    return [*pieces, detok.flush()]


def random_sizes(rng: random.Random, total: int) -> list[int]:
    sizes = []
    while sum(sizes) < total:
        sizes.append(rng.randint(0, 4))
    return sizes


# --- IncrementalDetokenizer ---------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_byte_tokens_one_at_a_time(byte_tok: Tokenizer, text: str):
    ids = byte_tok.encode(text)
    assert len(ids) == len(text.encode())
    pieces = stream(IncrementalDetokenizer(byte_tok), ids, [1] * len(ids))
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)  # never a half character
    if text != text.encode("ascii", "ignore").decode():
        assert "" in pieces[:-1]  # something really was held back


def test_random_chunks_concatenate_to_decode(byte_tok: Tokenizer):
    rng = random.Random(1)
    for _ in range(200):
        text = "".join(rng.choice("ab 😀中é\n") for _ in range(rng.randint(0, 12)))
        ids = byte_tok.encode(text)
        pieces = stream(IncrementalDetokenizer(byte_tok), ids, random_sizes(rng, len(ids)))
        assert "".join(pieces) == text == byte_tok.decode(ids)


def test_truncated_character_released_by_flush(byte_tok: Tokenizer):
    ids = byte_tok.encode("ok 😀")[:-2]  # generation ended mid-emoji
    detok = IncrementalDetokenizer(byte_tok)
    assert detok.push(ids) == "ok "
    assert detok.flush() == byte_tok.decode(ids)[3:] == "\ufffd"


def test_literal_replacement_character_is_emitted_eventually(byte_tok: Tokenizer):
    ids = byte_tok.encode("a\ufffd")
    detok = IncrementalDetokenizer(byte_tok)
    assert detok.push(ids) == "a"  # cannot tell it from an incomplete character yet
    assert detok.push(byte_tok.encode("b")) == "\ufffdb"


def test_context_sensitive_decoder():
    # sentencepiece-style decoders drop the space of a string's first token: decoding each token
    # alone would lose the spaces between words
    vocab = {"▁hello": 0, "▁world": 1, "!": 2}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="!"))
    tok.decoder = decoders.Metaspace()
    assert tok.decode([1]) == "world"
    pieces = stream(IncrementalDetokenizer(tok), [0, 1, 2, 1], [1, 1, 1, 1])
    assert "".join(pieces) == tok.decode([0, 1, 2, 1]) == "hello world! world"


@pytest.mark.real_model
def test_real_tokenizer_split_characters(smollm: Tokenizer):
    rng = random.Random(2)
    split_seen = False
    for text in [*TEXTS, "🦜🦜 鸚鵡 ☃️", "<|im_start|>ok<|im_end|> 😀"]:
        ids = smollm.encode(text)
        split_seen |= any(smollm.decode([i]).endswith("\ufffd") for i in ids)
        for sizes in ([1] * len(ids), random_sizes(rng, len(ids))):
            pieces = stream(IncrementalDetokenizer(smollm), ids, sizes)
            assert "".join(pieces) == smollm.decode(ids)
            assert not any("\ufffd" in p for p in pieces)
    assert split_seen  # the cases above really do split characters across tokens


@pytest.mark.real_model
def test_real_tokenizer_keeps_special_tokens_when_asked(smollm: Tokenizer):
    ids = smollm.encode("<|im_start|>hi 😀<|im_end|>")
    pieces = stream(IncrementalDetokenizer(smollm, skip_special_tokens=False), ids, [1] * len(ids))
    assert "".join(pieces) == "<|im_start|>hi 😀<|im_end|>"


# --- StopMatcher --------------------------------------------------------------------------------


def test_stop_validation():
    for bad in ([""], ["ok", ""], "###", [None]):
        with pytest.raises(InvalidInputError) as err:
            StopMatcher(bad)  # type: ignore[arg-type]
        assert err.value.field == "stop"


def test_no_stops_is_a_no_op():
    m = StopMatcher([])
    assert m.push("abc") == "abc" and m.push("") == "" and m.finish() == ""
    assert m.check("abc").safe_len == 3 and not m.check("abc").stopped


def test_check_earliest_stop_and_hold_back():
    m = StopMatcher(["###", "END", "!"])
    assert m.check("a END b ### !") == m.check("a END")  # earliest wins
    assert (m.check("a END b").stopped, m.check("a END b").keep_len) == (True, 2)
    hold = m.check("text ##")
    assert (hold.stopped, hold.keep_len, hold.safe_len) == (False, 7, 5)
    assert m.check("text EN").safe_len == 5
    assert m.check("text #a").safe_len == 7


def test_push_across_pieces():
    m = StopMatcher(["###"])
    assert m.push("hel") == "hel"
    assert m.push("lo #") == "lo "  # "#" might start a stop
    assert m.push("#") == ""
    assert m.push("#tail") == ""  # stop: nothing at or after it
    assert m.stopped and m.push("more") == "" and m.finish() == ""


def test_held_prefix_released_when_not_a_stop():
    m = StopMatcher(["###"])
    assert m.push("a ##") == "a "
    assert m.push("x") == "##x"
    assert m.push("b #") == "b "
    assert m.finish() == "#"  # generation ended: the tail was never a stop


def test_overlapping_prefixes():
    m = StopMatcher(["aab"])
    assert [m.push(c) for c in "aaab"] == ["", "", "a", ""]
    assert m.stopped


# --- StopTextTracker (what the scheduler calls) -------------------------------------------------


def test_several_tokens_with_stop_in_the_middle(byte_tok: Tokenizer):
    ids = byte_tok.encode("foo STOP bar")
    t = StopTextTracker(byte_tok, ["STOP"])
    kept, text, stopped = t.push(ids)
    assert (kept, text, stopped) == (len("foo STOP"), "foo ", True)
    assert t.push(byte_tok.encode("x")) == (0, "", True)
    assert t.finish() == ""


def test_stop_across_steps(byte_tok: Tokenizer):
    t = StopTextTracker(byte_tok, ["STOP"])
    assert t.push(byte_tok.encode("foo ST")) == (6, "foo ", False)
    assert t.push(byte_tok.encode("OP bar")) == (2, "", True)


def test_stop_on_multibyte_character(byte_tok: Tokenizer):
    t = StopTextTracker(byte_tok, ["😀"])
    ids = byte_tok.encode("hi 😀 there")
    assert t.push(ids) == (3 + 4, "hi ", True)  # kept up to the 4th byte, which completes the emoji


def test_no_stop_finish_releases_held_text(byte_tok: Tokenizer):
    t = StopTextTracker(byte_tok, ["##"])
    assert t.push(byte_tok.encode("abc #")) == (5, "abc ", False)
    # half an emoji: the detokenizer holds it, so "#" cannot be judged yet either
    assert t.push(byte_tok.encode("😀")[:2]) == (2, "", False)
    assert t.finish() == "#\ufffd"


def test_tracker_without_stops(byte_tok: Tokenizer):
    t = StopTextTracker(byte_tok)
    ids = byte_tok.encode("no stops 😀")
    assert t.push(ids[:-1]) == (len(ids) - 1, "no stops ", False)
    assert t.push(ids[-1:]) == (1, "😀", False)


def test_tracker_matches_reference(byte_tok: Tokenizer):
    rng = random.Random(3)
    for _ in range(300):
        text = "".join(rng.choice("ab#\n😀") for _ in range(rng.randint(0, 14)))
        stops = [
            "".join(rng.choice("ab#\n😀") for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(0, 2))
        ]
        ids = byte_tok.encode(text)
        t = StopTextTracker(byte_tok, stops)
        out, kept, i = [], 0, 0
        for n in random_sizes(rng, len(ids)):
            step = t.push(ids[i : i + n])
            out.append(step.text)
            kept += step.kept
            i += n
            if step.stopped:
                break
        else:
            out.append(t.finish())
        hits = [j for j in (text.find(s) for s in stops) if j >= 0]
        if hits:
            assert "".join(out) == text[: min(hits)], (text, stops)
            # the last kept token is exactly the one that completes the stop
            assert StopMatcher(stops).find(byte_tok.decode(ids[:kept])) is not None
            assert StopMatcher(stops).find(byte_tok.decode(ids[: kept - 1])) is None
        else:
            assert "".join(out) == text and kept == len(ids), (text, stops)


@pytest.mark.real_model
def test_real_tokenizer_stop_spanning_tokens(smollm: Tokenizer):
    text = "The answer is 42.\nDone. More text after."
    stop = "42.\nDo"
    ids = smollm.encode(text)
    assert not any(stop in smollm.decode([i]) for i in ids)  # the stop spans several tokens
    t = StopTextTracker(smollm, [stop])
    kept, out, stopped = t.push(ids)
    assert stopped and out == "The answer is "
    assert stop in smollm.decode(ids[:kept]) and stop not in smollm.decode(ids[: kept - 1])
