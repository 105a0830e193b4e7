"""``specdec-bench --workloads multiturn``: conversations against the prefix cache, in one run with
llama.cpp's ``llama-server`` on the same GGUF file (``--llama-server PATH``).

Scenarios, each from a cold cache, each turn sent when the one before it has ended (one request at a
time, as one user per slot would):

``one-user``     one conversation of ``--turns`` turns;
``interleaved``  ``--users`` conversations, their turns taken in turn (user 1 turn 1, user 2 turn 1,
                 ...): what a server with fewer slots than users sees;
``shared-system`` ``--users`` conversations opening with the same long system prompt, two turns each;
``repeat``       one prompt of about ``--repeat-tokens`` tokens, sent twice;
``cold``         ours only: 8 first turns no request shares, with the prefix cache on and off in
                 turn (the same engine, twice each): what the bookkeeping costs a cold prompt and
                 decoding.

A conversation opens with a system prompt of about ``--system-tokens`` tokens (HumanEval code as
reference material; its own per user, except in ``shared-system``); user turns are ShareGPT first
turns of at most 300 characters; each answer (``--max-tokens``, greedy, the model's chat template)
goes into the history, so each system continues its own conversation. Per turn: the first-token time,
prompt tokens, tokens taken from the cache and computed, and the tokens new since the conversation's
previous prompt and answer (ours: by token ids). Summary: ours against llama-server per turn, computed
/ new over the turns after the first, the hit rate.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from trispec.bench.llama_server import LlamaServer, Reply
from trispec.bench.workloads import _code, _read_humaneval, _read_sharegpt, humaneval_path, sharegpt_path
from trispec.config import SpecDecConfig
from trispec.errors import InvalidInputError
from trispec.request import GenerationRequest

SCENARIOS = ("one-user", "interleaved", "shared-system", "repeat")
USER_TURN_CHARS = 300
SYSTEM_OPENING = "You are a helpful coding assistant. This code is the context of the conversation:\n\n"
REPEAT_OPENING = "Explain, function by function, what this code does:\n\n"


class ChatSystem(Protocol):
    name: str

    def reply(self, prompt: str, max_tokens: int) -> Reply: ...

    def cold(self) -> None: ...

    def close(self) -> None: ...


class Ours:
    """Our engine, offline: the config's pair, speculation and prefix cache."""

    name = "ours"

    def __init__(self, config: SpecDecConfig) -> None:
        from trispec.llm import SpeculativeLLM

        self.llm = SpeculativeLLM.from_config(config)

    def reply(self, prompt: str, max_tokens: int) -> Reply:
        engine, ids = self.llm.engine, self.llm.tokenizer.encode(prompt)
        start = time.perf_counter()
        rid = engine.add_request(GenerationRequest(prompt_token_ids=ids, max_tokens=max_tokens))
        ttft, text, tokens, cached = None, "", [], 0
        while engine.has_work():
            for out in engine.step():
                if out.request_id != rid:
                    continue
                if out.new_token_ids and ttft is None:
                    ttft = time.perf_counter() - start
                text += out.new_text
                tokens += out.new_token_ids
                cached = out.cached_tokens
        assert ttft is not None
        total = time.perf_counter() - start
        return Reply(text, ttft, len(ids), cached, len(tokens), tuple(ids), tuple(tokens), total)

    def _engines(self) -> list[Any]:
        runner: Any = self.llm.engine.runner
        draft = getattr(getattr(runner.drafter, "model", runner.drafter), "engine", None)
        return [runner.target] + ([draft] if draft is not None else [])

    def cold(self) -> None:
        for engine in self._engines():
            engine.drop_prefix_cache()

    def caching(self, on: bool) -> None:
        for engine in self._engines():
            engine.blocks.prefix_caching = on

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class TurnRow:
    system: str
    scenario: str
    user: int
    turn: int
    reply: Reply
    new_tokens: int | None  # ours: tokens not in the conversation's previous prompt + answer

    def to_dict(self) -> dict[str, Any]:
        r = self.reply
        return {
            "row": "multiturn", "system": self.system, "scenario": self.scenario, "user": self.user,
            "turn": self.turn, "ttft_s": round(r.ttft_s, 4), "prompt_tokens": r.prompt_tokens,
            "cached_tokens": r.cached_tokens, "computed_tokens": r.computed_tokens,
            "new_tokens": self.new_tokens, "output_tokens": r.output_tokens,
        }  # fmt: skip


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _text_of_tokens(tokenizer: Any, opening: str, pieces: list[str], tokens: int) -> str:
    text = opening
    for piece in pieces:
        if len(tokenizer.encode(text)) >= tokens:
            break
        text += piece + "\n\n"
    return text


class Conversations:
    """The texts of a run: system prompts, user turns and the long repeated prompt."""

    def __init__(self, tokenizer: Any, seed: int, system_tokens: int, repeat_tokens: int) -> None:
        self.tokenizer = tokenizer
        problems = list(_read_humaneval(humaneval_path()))
        random.Random(seed).shuffle(problems)
        self.code = [_code(p, True) for p in problems]
        turns = [text for _, text in _read_sharegpt(sharegpt_path()) if len(text) <= USER_TURN_CHARS]
        self.turns = random.Random(seed).sample(turns, min(len(turns), 200))
        self.system_tokens = system_tokens
        self.repeat = _text_of_tokens(tokenizer, REPEAT_OPENING, self.code[50:], repeat_tokens)

    def system(self, user: int) -> str:
        pieces = self.code[user * 5 : user * 5 + 5]
        return _text_of_tokens(self.tokenizer, SYSTEM_OPENING, pieces, self.system_tokens)

    def user_turn(self, user: int, turn: int) -> str:
        return self.turns[(user * 17 + turn) % len(self.turns)]

    def prompt(self, messages: list[dict[str, str]]) -> str:
        """The conversation in the model's chat template; a base model without one gets a transcript
        (each prompt still starts with the previous prompt and its answer)."""
        if self.tokenizer.info.chat_template is not None:
            return self.tokenizer.apply_chat_template(messages)
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def run_scenario(
    system: ChatSystem, scenario: str, texts: Conversations, *, users: int, turns: int, max_tokens: int
) -> Iterator[TurnRow]:
    system.cold()
    if scenario == "repeat":
        prompt = texts.prompt([{"role": "user", "content": texts.repeat}])
        for turn in (1, 2):
            yield TurnRow(system.name, scenario, 1, turn, system.reply(prompt, max_tokens), None)
        return
    n_users = 1 if scenario == "one-user" else users
    n_turns = 2 if scenario == "shared-system" else turns
    histories = [
        [{"role": "system", "content": texts.system(0 if scenario == "shared-system" else u)}]
        for u in range(n_users)
    ]
    previous: list[tuple[int, ...] | None] = [None] * n_users
    for turn in range(1, n_turns + 1):
        for u in range(n_users):
            histories[u].append({"role": "user", "content": texts.user_turn(u, turn)})
            reply = system.reply(texts.prompt(histories[u]), max_tokens)
            histories[u].append({"role": "assistant", "content": reply.text})
            new = None
            if reply.prompt_ids:
                seen = previous[u] or ()
                new = len(reply.prompt_ids) - _common_prefix(reply.prompt_ids, seen)
                previous[u] = reply.prompt_ids + reply.output_ids
            yield TurnRow(system.name, scenario, u + 1, turn, reply, new)


COLD_PROMPTS = 8


def cold_on_and_off(ours: Ours, texts: Conversations, max_tokens: int) -> dict[str, Any]:
    """Cold prompts with the prefix cache on and off, in turn on the same engine: first-token time
    (prefill) and decode speed, on over off."""
    prompts = [
        texts.prompt(
            [
                # a number first: no two share even their first block
                {"role": "system", "content": f"Session {1000 + i}. " + texts.system(10 + i)},
                {"role": "user", "content": texts.user_turn(10 + i, 1)},
            ]
        )
        for i in range(COLD_PROMPTS)
    ]
    replies: dict[bool, list[Reply]] = {True: [], False: []}
    for order in ((True, False), (False, True)):
        for on in order:
            ours.caching(on)
            ours.cold()
            replies[on] += [ours.reply(p, max_tokens) for p in prompts]
    ours.caching(True)

    def ttft(on: bool) -> float:
        return statistics.mean(r.ttft_s for r in replies[on])

    def decode_tok_s(on: bool) -> float:
        return sum(r.output_tokens - 1 for r in replies[on]) / sum(r.total_s - r.ttft_s for r in replies[on])

    # the prompts share only the chat template's first tokens ("<|im_start|>system\nSession 10"), which
    # a partial-block hit copies with the cache on: reported, and never more than those
    lead = max(r.cached_tokens for r in replies[True])
    assert lead < 16 and all(r.cached_tokens == 0 for r in replies[False]), "cold prompts hit the cache"
    return {
        "row": "multiturn_summary",
        "scenario": "cold",
        "prompts": COLD_PROMPTS * 2,
        "cached_tokens_max_on": lead,
        "ttft_off_s": round(ttft(False), 4),
        "ttft_on_s": round(ttft(True), 4),
        "cold_prompt_speed_on_over_off": round(ttft(False) / ttft(True), 4),
        "decode_speed_on_over_off": round(decode_tok_s(True) / decode_tok_s(False), 4),
    }


def summary(rows: list[TurnRow]) -> list[dict[str, Any]]:
    """Per scenario: ours against llama-server, computed / new after the first turn, the hit rate."""
    out = []
    for scenario in SCENARIOS:
        mine = [r for r in rows if r.scenario == scenario and r.system == "ours"]
        if not mine:
            continue
        later = [r for r in mine if r.turn > 1]
        prompt = sum(r.reply.prompt_tokens for r in mine)
        row: dict[str, Any] = {
            "row": "multiturn_summary",
            "scenario": scenario,
            "hit_rate": round(sum(r.reply.cached_tokens for r in mine) / prompt, 4) if prompt else 0.0,
            "ttft_first_turn_s": round(statistics.mean(r.reply.ttft_s for r in mine if r.turn == 1), 4),
        }
        if later:
            new = sum(r.new_tokens or 0 for r in later)
            row["computed_over_new"] = (
                round(sum(r.reply.computed_tokens for r in later) / new, 4) if new else None
            )
            row["ttft_later_turns_s"] = round(statistics.mean(r.reply.ttft_s for r in later), 4)
        peer = {(r.user, r.turn): r for r in rows if r.scenario == scenario and r.system == "llama-server"}
        pairs = [(r, peer[(r.user, r.turn)]) for r in later if (r.user, r.turn) in peer]
        if pairs:
            row["turns_not_slower_than_llama_server"] = (
                f"{sum(o.reply.ttft_s <= p.reply.ttft_s for o, p in pairs)}/{len(pairs)}"
            )
            row["ttft_ratio_later_turns"] = round(
                statistics.mean(o.reply.ttft_s / p.reply.ttft_s for o, p in pairs), 4
            )
        out.append(row)
    return out


def run(args: Any, config: SpecDecConfig) -> int:
    """The multiturn benchmark (``specdec-bench --workloads multiturn``); prints rows and summaries."""
    import json

    from trispec.checkpoints import load_tokenizer, resolve_checkpoint

    if args.kv_cache_mb is not None:  # pool pressure: eviction must degrade to cold, never fail
        target = config.target.model_copy(update={"kv_cache_mb": args.kv_cache_mb})
        # the longest sequence: what the smaller pool holds (a config's max_context may not fit it)
        scheduler = config.scheduler.model_copy(update={"max_context": None})
        config = config.model_copy(update={"target": target, "scheduler": scheduler})
    texts = Conversations(
        load_tokenizer(config.target, "target"), args.seed, args.system_tokens, args.repeat_tokens
    )
    systems: list[ChatSystem] = [Ours(config)]
    if args.llama_server is not None:
        model = resolve_checkpoint(config.target.checkpoint, "target.checkpoint")
        if model.suffix != ".gguf":
            raise SystemExit(f"--llama-server: the target is not a GGUF file ({model})")
        systems.append(
            LlamaServer(args.llama_server, model, threads=args.threads, slots=args.llama_server_slots)
        )
    rows: list[TurnRow] = []
    try:
        for scenario in SCENARIOS:
            for system in systems:
                try:
                    for row in run_scenario(
                        system,
                        scenario,
                        texts,
                        users=args.users,
                        turns=args.turns,
                        max_tokens=args.max_tokens,
                    ):
                        rows.append(row)
                        print(json.dumps(row.to_dict()) if args.json else _line(row), flush=True)
                except InvalidInputError as exc:  # e.g. a prompt longer than a --kv-cache-mb pool
                    refused = _refused(system.name, scenario, exc)
                    print(
                        json.dumps(refused) if args.json else f"{system.name} {scenario}: refused: {exc}",
                        flush=True,
                    )
        try:
            cold = cold_on_and_off(systems[0], texts, args.max_tokens)  # type: ignore[arg-type]
        except InvalidInputError as exc:
            cold = _refused(systems[0].name, "cold", exc)
    finally:
        for system in systems:
            system.close()
    for s in [*summary(rows), cold]:
        print(json.dumps(s) if args.json else "  ".join(f"{k}={v}" for k, v in s.items()), flush=True)
    return 0


def _refused(system: str, scenario: str, exc: InvalidInputError) -> dict[str, Any]:
    """A scenario the system refused (a prompt longer than the pool): its row, the reason."""
    return {"row": "multiturn_refused", "system": system, "scenario": scenario, "reason": str(exc)}


def _line(row: TurnRow) -> str:
    r = row.reply
    new = "" if row.new_tokens is None else f", {row.new_tokens} new"
    return (
        f"{row.system:12} {row.scenario:13} user {row.user} turn {row.turn}: first token {r.ttft_s:.3f} s; "
        f"prompt {r.prompt_tokens} tokens, {r.cached_tokens} cached, {r.computed_tokens} computed{new}; "
        f"{r.output_tokens} out"
    )
