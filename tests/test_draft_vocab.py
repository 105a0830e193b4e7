"""``drafter.draft_vocab``: a draft whose LM head computes only N token ids, the most frequent in a
corpus (``drafters/draft_vocab.py``).

The ids: ranked by the corpus, unseen ones in id order, end-of-sequence ids always, the ranking kept
in the cache. The head: its logits for those ids are the whole head's, the rest -inf, on every way an
engine builds its head (dense, bfloat16, int8, GGUF blocks; tied or not). The drafter never proposes
another id; speculation with it gives plain decoding's text (greedy, seeded, guided: where a grammar
admits only ids the head leaves out, the draft stops instead of guessing); the config refuses it
where it cannot apply."""

from __future__ import annotations

import json

import pytest
import torch
from gguf_files import random_gguf
from tiny import (
    TINY_VOCAB,
    ascii_tokenizer,
    repeating_prompts,
    run_to_completion,
    spec_engine,
    tiny_args,
    tiny_engine,
    tokens_of,
)
from trispec.config import parse_config
from trispec.drafters.draft_vocab import draft_vocab_ids, rank_ids, stdlib_corpus
from trispec.drafters.model_drafter import ModelDrafter
from trispec.engine import build
from trispec.engine.base import ForwardInput
from trispec.engine.cpu.linear import RowSplitLinear
from trispec.engine.torch_engine import TorchEngine
from trispec.errors import ConfigError
from trispec.guided import Guide
from trispec.request import GenerationRequest

# every third id of TINY_VOCAB = 320, and a run: not a prefix, and a random model's outputs fall on
# both sides
HEAD_IDS = torch.tensor(sorted({*range(0, TINY_VOCAB, 3), *range(100, 140)}))


def _logits(engine: TorchEngine, prompt: list[int]) -> torch.Tensor:
    engine.add_sequence(1, 64)
    try:
        return engine.forward([ForwardInput(1, prompt, len(prompt))])[0]
    finally:
        engine.free(1)


def _counting(encoder: object) -> tuple[object, list[int]]:
    """``encoder`` with a count of the texts it was given to encode."""
    calls: list[int] = []

    class Counting:
        def encode_batch(self, texts, add_special_tokens=True):  # type: ignore[no-untyped-def]
            calls.append(len(texts))
            return encoder.encode_batch(texts, add_special_tokens=add_special_tokens)  # type: ignore[attr-defined]

        def to_str(self) -> str:
            return encoder.to_str()  # type: ignore[attr-defined]

    return Counting(), calls


def test_ids_are_ranked_by_the_corpus_then_by_id_with_the_end_ids_always(tmp_path) -> None:
    tok = ascii_tokenizer()  # one id per printable char (id = code - 32), and two-char merges
    corpus = [tmp_path / "a.py", tmp_path / "b.py"]
    corpus[0].write_text("zzzz yyy")  # z: 4, y: 3, space: 1
    corpus[1].write_text("xx")  # x: 2
    encoder, calls = _counting(tok.backend)
    z, y, x, space = (ord(c) - 32 for c in "zyx ")
    ranking = rank_ids(encoder, TINY_VOCAB, [p.read_text() for p in corpus])
    assert ranking[:4].tolist() == [z, y, x, space]
    assert ranking[4:10].tolist() == [i for i in range(TINY_VOCAB) if i not in (z, y, x, space)][:6]
    ids = draft_vocab_ids(encoder, TINY_VOCAB, 5, always=[300], cache_dir=tmp_path / "cache", corpus=corpus)
    assert ids.tolist() == sorted([300, z, y, x, space])
    assert draft_vocab_ids(encoder, TINY_VOCAB, 2, cache_dir=tmp_path / "cache", corpus=corpus).tolist() == [
        y,
        z,
    ]
    assert len(calls) == 2  # the second call read the cached ranking
    corpus[1].write_text("xxxxxxxxxx")  # another corpus: ranked again
    assert draft_vocab_ids(encoder, TINY_VOCAB, 1, cache_dir=tmp_path / "cache", corpus=corpus).tolist() == [
        x
    ]
    with pytest.raises(ValueError, match=r"draft_vocab 321 outside 1\.\.320"):
        draft_vocab_ids(encoder, TINY_VOCAB, TINY_VOCAB + 1, corpus=corpus)


def test_the_corpus_is_the_standard_library_without_installed_packages(tmp_path) -> None:
    for rel in ("os.py", "json/decoder.py", "site-packages/torch/x.py", "notes.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x" * 100)
    assert [p.relative_to(tmp_path).as_posix() for p in stdlib_corpus(tmp_path)] == [
        "json/decoder.py",
        "os.py",
    ]
    assert len(stdlib_corpus(tmp_path, max_bytes=100)) == 1  # an even sample where it holds more
    assert len(stdlib_corpus()) > 100  # this Python's own


@pytest.mark.parametrize(
    "build",
    [
        {"tie": False},
        {"tie": True},
        {"tie": False, "dtype": "bfloat16"},
        {"tie": False, "weight_quant": "int8"},
        {"tie": True, "weight_quant": "int8"},
    ],
    ids=["fp32", "fp32-tied", "bf16", "int8", "int8-tied"],
)
def test_the_head_s_ids_get_the_whole_head_s_logits_and_the_rest_minus_inf(build: dict) -> None:
    args = tiny_args(tie_embeddings=build.pop("tie"))
    full = TorchEngine.from_random(args, 3, num_blocks=16, block_size=8, **build)
    part = TorchEngine.from_random(args, 3, num_blocks=16, block_size=8, head_ids=HEAD_IDS, **build)
    assert (part.head_vocab, part.vocab_size, full.head_vocab) == (len(HEAD_IDS), TINY_VOCAB, TINY_VOCAB)
    a, b = _logits(full, [5, 9, 200, 31]), _logits(part, [5, 9, 200, 31])
    assert b.shape == a.shape and b.dtype == torch.float32
    torch.testing.assert_close(b[:, HEAD_IDS], a[:, HEAD_IDS], rtol=1e-5, atol=1e-5)
    assert torch.equal(b.argmax(-1), HEAD_IDS[a[:, HEAD_IDS].argmax(-1)])
    assert torch.all(b[:, _left_out(HEAD_IDS)] == float("-inf"))


def test_a_head_read_in_blocks_of_rows_keeps_the_ids_of_every_block(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "HEAD_BLOCK_ROWS", 64)  # TINY_VOCAB's head in 5 blocks (dense_head)
    args = tiny_args()
    full = TorchEngine.from_random(args, 3, num_blocks=16, block_size=8)
    part = TorchEngine.from_random(args, 3, num_blocks=16, block_size=8, head_ids=HEAD_IDS)
    assert isinstance(part.model.lm_head, RowSplitLinear) and len(part.model.lm_head.parts) == 5
    a, b = _logits(full, [5, 9, 200, 31]), _logits(part, [5, 9, 200, 31])
    torch.testing.assert_close(b[:, HEAD_IDS], a[:, HEAD_IDS], rtol=1e-5, atol=1e-5)
    assert torch.all(b[:, _left_out(HEAD_IDS)] == float("-inf"))


@pytest.mark.parametrize("tie", [False, True])
def test_a_gguf_head_s_first_rows_are_the_same_bits(tie: bool) -> None:
    path = random_gguf(tiny_args("qwen2", tie_embeddings=tie), seed=5)
    full = TorchEngine.from_checkpoint(path, num_blocks=16, block_size=8, weight_quant="gguf")
    part = TorchEngine.from_checkpoint(
        path, num_blocks=16, block_size=8, weight_quant="gguf", head_ids=HEAD_IDS
    )
    a, b = _logits(full, [7, 70, 250]), _logits(part, [7, 70, 250])
    assert torch.equal(b[:, HEAD_IDS], a[:, HEAD_IDS])  # one fixed order per output: the same bits
    assert torch.all(b[:, _left_out(HEAD_IDS)] == float("-inf"))


def _left_out(ids: torch.Tensor) -> torch.Tensor:
    keep = torch.zeros(TINY_VOCAB, dtype=torch.bool)
    keep[ids] = True
    return (~keep).nonzero().flatten()


@pytest.mark.parametrize(
    ("ids", "message"),
    [([3, 320], "ids in 0..319"), ([], "non-empty"), ([5, 4], "sorted"), ([4, 4], "each id once")],
)
def test_head_ids_outside_the_vocabulary_or_unsorted_are_refused(ids: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TorchEngine.from_random(tiny_args(), 0, num_blocks=16, head_ids=torch.tensor(ids, dtype=torch.int64))


class _Recording(ModelDrafter):
    """Records every token it proposes, how many of those asked for it gave, and the best logit of
    every row it drew from."""

    def __init__(self, engine: TorchEngine) -> None:
        super().__init__(engine)
        self.proposed: list[int] = []
        self.short = 0  # proposals shorter than asked
        self.row_max: list[float] = []

    def propose(self, requests):  # type: ignore[no-untyped-def]
        out = super().propose(requests)
        self.proposed += [t for p in out for t in p.tokens]
        self.short += sum(len(p.tokens) < r.num_draft_tokens for p, r in zip(out, requests))
        return out

    def _draw(self, requests, drafted, logits, probs):  # type: ignore[no-untyped-def, override]
        self.row_max += logits.amax(-1).tolist()
        return super()._draw(requests, drafted, logits, probs)


def _generate(
    drafter: ModelDrafter | None, batch: list[GenerationRequest], **config: object
) -> tuple[list[list[int]], list[str], object]:
    target = tiny_engine(0, num_blocks=512)
    llm = spec_engine(target, drafter, max_batch_size=32, max_num_draft_tokens=8, **config)
    ids = [llm.add_request(r) for r in batch]
    outputs = run_to_completion(llm)
    texts = ["".join(o.new_text for o in outputs[i]) for i in ids]
    return [tokens_of(outputs[i]) for i in ids], texts, llm.stats


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_speculation_with_a_partial_draft_head_gives_the_plain_text(sampled: bool) -> None:
    settings = {"temperature": 0.8, "top_k": 50} if sampled else {}

    def batch(k: int) -> list[GenerationRequest]:
        return [
            GenerationRequest(prompt_token_ids=p, max_tokens=24, num_draft_tokens=k, seed=i, **settings)
            for i, p in enumerate(repeating_prompts(6, seed=8))
        ]

    plain, _, _ = _generate(None, batch(0))
    # the target's own weights drafting: agreement everywhere the head reaches
    drafter = _Recording(tiny_engine(0, head_ids=HEAD_IDS))
    tokens, _, stats = _generate(drafter, batch(4))
    assert tokens == plain
    left_out = set(_left_out(HEAD_IDS).tolist())
    assert any(t in left_out for seq in plain for t in seq)  # the limit mattered
    assert drafter.proposed and not left_out & set(drafter.proposed)
    assert stats.accepted_tokens > 0  # type: ignore[attr-defined]


def test_a_grammar_that_admits_only_ids_past_the_head_stops_the_draft() -> None:
    # byte tokens (tiny.byte_tokenizer): ids 0-59 are '!' to '\\' (digits, '"', ':', ',', capitals);
    # '{', '}' and the keys' lower-case letters lie past a head of 60
    head = torch.arange(60)
    schema = {
        # compact JSON (under xgrammar's whitespace, the default, a random model pads its answer)
        "x-guidance": {"whitespace_flexible": False},
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}, "w": {"enum": ["YES", "no"]}},
        "required": ["n", "w"],
        "additionalProperties": False,
    }

    def batch(k: int) -> list[GenerationRequest]:
        guide = Guide("json_schema", json.dumps(schema))
        return [
            GenerationRequest(prompt=f"go {i}", max_tokens=30, num_draft_tokens=k, guide=guide)
            for i in range(3)
        ]

    plain, plain_texts, _ = _generate(None, batch(0), grammar_drafts=False)
    drafter = _Recording(tiny_engine(0, head_ids=head))
    tokens, texts, _ = _generate(drafter, batch(4), grammar_drafts=False)
    assert tokens == plain and texts == plain_texts
    assert all(json.loads(t)["w"] in ("YES", "no") for t in texts)
    assert drafter.proposed and max(drafter.proposed) < 60
    # where the grammar left the head nothing the proposal ended there, never drawn from -inf alone
    assert drafter.short > 0
    assert min(drafter.row_max) > float("-inf")


@pytest.mark.parametrize(
    ("drafter", "engine", "key", "message"),
    [
        ({"kind": "suffix", "draft_vocab": 1000}, {}, "drafter", "draft_vocab goes with a model draft"),
        ({"kind": "self", "draft_vocab": 0}, {}, "drafter.draft_vocab", "greater than or equal to 1"),
        (
            {"kind": "self", "precision": "int8", "draft_vocab": 1000},
            {"kind": "trtllm"},
            "drafter.draft_vocab",
            "TensorRT-LLM's draft engine computes its whole vocabulary",
        ),
    ],
)
def test_the_config_refuses_a_draft_vocab_where_it_cannot_apply(
    drafter: dict, engine: dict, key: str, message: str
) -> None:
    data = {"target": {"checkpoint": {"path": "/x"}}, "drafter": drafter, "engine": engine}
    with pytest.raises(ConfigError, match=message) as err:
        parse_config(data)
    assert err.value.field == key
