"""The whole stack from YAML with ``engine.kind: trtllm``, as a user runs it: ``specdec-generate`` in
its own process, with the stand-in of TensorRT-LLM 1.2.x's executor bindings installed as the
``tensorrt_llm`` package (``trtllm_standin``: the end token never comes back as a token, unset
top_k/top_p decode greedily, ...). Greedy output equals the target's own output token for token with
most prompts ending on the tokenizer's end token, at k = 0 and k = 4; seeded T = 1.0 requests sample."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from tiny import TINY_VOCAB, ascii_tokenizer, reference_greedy
from trtllm_files import write_hf
from trtllm_standin_engine import write_engine

TESTS = Path(__file__).parent
BIN = Path(sys.executable).parent
MAX_TOKENS = 24
CANDIDATES = [
    "hello there", "the rain in spain", "abcabcabc", "def main():", "print(x)", "once upon a time",
    "we hold these truths", "for i in range(10):", "zyx", "to be or not", "import torch", "yes",
    "select * from t", "the quick brown fox", "if x > 0:", "good morning",
]  # fmt: skip


def prompts_and_end_token() -> tuple[list[str], int]:
    """The token most target-only outputs reach early becomes the tokenizer's end token; the prompts
    are those that reach it, plus two that do not (they end on max_tokens)."""
    tok = ascii_tokenizer()
    refs = {p: reference_greedy(tok.encode(p), MAX_TOKENS) for p in CANDIDATES}
    counts = Counter(t for ref in refs.values() for t in set(ref[: MAX_TOKENS - 4]))
    eos = counts.most_common(1)[0][0]
    ending = [p for p in CANDIDATES if eos in refs[p][: MAX_TOKENS - 4]]
    others = [p for p in CANDIDATES if eos not in refs[p]][:2]
    return ending + others, eos


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    tmp = tmp_path_factory.mktemp("trtllm-generate")
    prompts, eos = prompts_and_end_token()
    write_hf(tmp / "target", "llama", 0)  # tiny_engine(0)'s weights: what reference_greedy runs
    eos_text = ascii_tokenizer().backend.id_to_token(eos)
    (tmp / "target" / "tokenizer_config.json").write_text(json.dumps({"eos_token": eos_text}))
    write_engine(tmp / "out/engines/target", vocab_size=TINY_VOCAB, seed=0, spec_mode=2, max_draft_len=8)
    write_engine(tmp / "out/engines/draft", vocab_size=TINY_VOCAB, seed=0, noise=0.1)
    write_hf(tmp / "draft", "llama", 7)  # named by the config; the draft engine is what runs
    (tmp / "pair.yaml").write_text(
        "engine: {kind: trtllm}\ntarget: {checkpoint: {path: target}}\n"
        "drafter: {kind: model, model: {checkpoint: {path: draft}}}\n"
        "trtllm: {engines_dir: out, kv_cache: {gib: 1}}\n"
        "scheduler: {max_num_draft_tokens: 4, default_num_draft_tokens: 4, adaptive_speculation: false}\n"
    )
    (tmp / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    # the stand-in as the tensorrt_llm package, for a process of its own
    shim = tmp / "shim" / "tensorrt_llm" / "bindings"
    shim.mkdir(parents=True)
    (shim.parent / "__init__.py").write_text("")
    (shim / "__init__.py").write_text("")
    (shim / "executor.py").write_text(
        "import sys\nimport trtllm_standin\nsys.modules[__name__] = trtllm_standin\n"
    )
    return {"tmp": tmp, "prompts": prompts, "eos": eos}


def generate(stack: dict[str, object], *args: str, file: str = "prompts.jsonl") -> list[dict]:
    tmp = stack["tmp"]
    assert isinstance(tmp, Path)
    env = {**os.environ, "PYTHONPATH": f"{tmp / 'shim'}{os.pathsep}{TESTS}"}
    run = subprocess.run(
        [str(BIN / "specdec-generate"), "--config", str(tmp / "pair.yaml"), "--prompts-file",
         str(tmp / file), "--max-tokens", str(MAX_TOKENS), "--json", *args],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("k", [0, 4])
def test_greedy_output_is_the_targets_own_with_most_prompts_ending_on_the_end_token(
    stack: dict[str, object], k: int
) -> None:
    prompts, eos = stack["prompts"], stack["eos"]
    assert isinstance(prompts, list) and isinstance(eos, int)
    results = generate(stack, "--num-draft-tokens", str(k))
    tok = ascii_tokenizer()
    stopped = 0
    for prompt, result in zip(prompts, results, strict=True):
        ref = reference_greedy(tok.encode(prompt), MAX_TOKENS)
        want = ref[: ref.index(eos) + 1] if eos in ref else ref
        assert result["token_ids"] == want, prompt
        assert result["finish_reason"] == ("stop" if eos in ref else "length")
        stopped += result["finish_reason"] == "stop"
        if k:
            assert result["stats"]["draft_tokens"] > 0 or len(want) <= 1
    assert stopped >= len(prompts) - 2 and stopped >= 4


def test_seeded_sampled_requests_sample(stack: dict[str, object]) -> None:
    """T = 1.0 with a seed: the outputs are not the greedy ones (TensorRT-LLM decodes greedily when
    top_k and top_p are left unset), and the same prompt with the same seed gives the same output
    whatever it is batched with."""
    prompts, tmp = stack["prompts"], stack["tmp"]
    assert isinstance(prompts, list) and isinstance(tmp, Path)
    twice = [*prompts, *prompts[:3]]
    (tmp / "twice.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in twice))
    results = [
        r["token_ids"] for r in generate(stack, "--temperature", "1.0", "--seed", "1", file="twice.jsonl")
    ]
    tok = ascii_tokenizer()
    greedy = [reference_greedy(tok.encode(p), MAX_TOKENS) for p in prompts]
    assert sum(r[: len(g)] != g for r, g in zip(results, greedy)) >= len(prompts) - 1
    assert results[len(prompts) :] == results[:3]
