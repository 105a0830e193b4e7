"""What one choice has produced so far, fed piece by piece, and the request's ``usage`` over all choices.

``usage`` carries OpenAI's three counts and, as our extension, the speculation totals over every choice:
``draft_tokens``, ``accepted_tokens``, ``acceptance_rate`` (accepted / drafted), ``verify_rounds``,
``mean_accepted_length`` (tokens per round) and ``mean_num_draft_tokens`` (the k planned per round).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from trispec_client.results import SpeculationStats

from trispec_openai.tokens import ServedTokenizer
from trispec_openai.triton import Piece


@dataclass(frozen=True)
class Alternative:
    """One of the most likely tokens at a position (``top_logprobs``)."""

    token: str
    logprob: float
    bytes: tuple[int, ...]


@dataclass(frozen=True)
class Delta:
    """What one piece adds to a choice: its text and, when log-probs were asked for, its tokens (an
    echoed prompt's first token has no log-prob: None)."""

    text: str
    tokens: tuple[str, ...] = ()
    logprobs: tuple[float | None, ...] = ()
    offsets: tuple[int, ...] = ()  # each token's character offset in the choice's text
    # beside each token when alternatives were asked for: the most likely tokens there
    top: tuple[tuple[Alternative, ...] | None, ...] = ()
    # the seed the choice samples with, on the piece that first said it
    seed: int | None = None


@dataclass
class Choice:
    index: int
    prompt_index: int
    text: str = ""
    tokens: list[str] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    top: list[tuple[Alternative, ...] | None] = field(default_factory=list)
    token_count: int = 0
    finish_reason: str | None = None
    stats: SpeculationStats | None = None
    prompt_tokens: int | None = None
    # the seed it samples with (the server's choice when the request had none); None: greedy
    seed: int | None = None
    # prompt tokens the server's prefix cache held (from the final response)
    cached_tokens: int | None = None
    # completions' echo: this prompt (text or token ids) goes before the answer (with its tokens'
    # log-probs when scored)
    echo: str | list[int] | None = None
    # False for max_tokens 0 with echo: the one token the model had to generate is not part of it
    keep_output: bool = True

    def add(self, piece: Piece, tokenizer: ServedTokenizer) -> Delta:
        text_from, token_from = len(self.text), len(self.tokens)
        if self.echo is not None:
            self._echo(self.echo, piece, tokenizer)
            self.echo = None  # once, whatever a resumed stream sends again
        if not self.keep_output:
            reason = "length" if piece.final else None
            piece = replace(piece, text="", token_count=0, logprobs=(), top_logprobs=(), finish_reason=reason)
        tokens = tokenizer.split(piece.text, len(piece.logprobs))
        self.offsets += _offsets(tokens, len(self.text))
        self.text += piece.text
        self.tokens += tokens
        self.logprobs += piece.logprobs
        self.top += [_named(tokenizer, row) for row in piece.top_logprobs]
        self.token_count = piece.token_count
        # kept from whichever response carried them (the final one, unless it came empty)
        self.finish_reason = piece.finish_reason or self.finish_reason
        self.stats = piece.stats or self.stats
        self.prompt_tokens = piece.prompt_tokens if piece.prompt_tokens is not None else self.prompt_tokens
        self.cached_tokens = piece.cached_tokens if piece.cached_tokens is not None else self.cached_tokens
        new_seed = piece.seed if self.seed is None else None
        self.seed = self.seed if self.seed is not None else piece.seed
        return Delta(
            self.text[text_from:],
            tuple(self.tokens[token_from:]),
            tuple(self.logprobs[token_from:]),
            tuple(self.offsets[token_from:]),
            tuple(self.top[token_from:]),
            new_seed,
        )

    def _echo(self, prompt: str | list[int], piece: Piece, tokenizer: ServedTokenizer) -> None:
        """The prompt before the answer; scored (echo with logprobs), its tokens too. The model scores
        every prompt token but the first; a BOS the tokenizer adds to a text prompt is that first one,
        and has no text, so then every token of the text has a log-prob, else the first is None."""
        if isinstance(prompt, str):
            text, count = prompt, len(tokenizer.tokenizer.encode(prompt, add_bos=False))
        else:  # token ids: exactly the prompt the model scored
            text, count = tokenizer.tokenizer.decode(prompt, skip_special_tokens=False), len(prompt)
        self.text = text
        if piece.prompt_logprobs is None:
            return
        tokens = tokenizer.split(text, count)
        scored = list(piece.prompt_logprobs)[-count:] if count else []
        unscored = count - len(scored)
        self.tokens = tokens
        self.logprobs = [None] * unscored + scored
        self.offsets = _offsets(tokens, 0)
        if piece.prompt_top_logprobs:
            rows = [_named(tokenizer, row) for row in piece.prompt_top_logprobs]
            self.top = [None] * unscored + rows[len(rows) - len(scored) :]


def _offsets(tokens: list[str], start: int) -> list[int]:
    """Each token's character offset, the first at ``start``."""
    offsets = []
    for token in tokens:
        offsets.append(start)
        start += len(token)
    return offsets


def _count(prompt: str | list[int], tokenizer: ServedTokenizer) -> int:
    return tokenizer.count(prompt) if isinstance(prompt, str) else len(prompt)


def _named(tokenizer: ServedTokenizer, row: tuple[tuple[int, float], ...]) -> tuple[Alternative, ...]:
    """(token id, log-prob) pairs -> alternatives named by their tokens."""
    return tuple(Alternative(tokenizer.token_string(i), lp, tuple(tokenizer.token_bytes(i))) for i, lp in row)


def usage(
    choices: list[Choice],
    prompts: Sequence[str | list[int]],
    tokenizer: ServedTokenizer,
    predicted: bool = False,
) -> dict[str, Any]:
    """Prompt tokens count each prompt once (however many choices it has), as OpenAI does; the model's
    own count is used where it sent one, else the same tokenizer counts here. ``cached_tokens``: of a
    prompt's tokens, the most any of its choices found in the prefix cache (sibling choices are sent
    at the same time, so some may find fewer; OpenAI reports one figure per prompt)."""
    prompt_tokens = cached_tokens = 0
    for prompt_index, prompt in enumerate(prompts):
        mine = [c for c in choices if c.prompt_index == prompt_index]
        counted = [c.prompt_tokens for c in mine if c.prompt_tokens]
        prompt_tokens += counted[0] if counted else _count(prompt, tokenizer)
        cached_tokens += max((c.cached_tokens or 0 for c in mine), default=0)
    completion_tokens = sum(c.token_count for c in choices)
    stats = [c.stats for c in choices if c.stats is not None]
    draft = sum(s.draft_tokens for s in stats)
    accepted = sum(s.accepted_tokens for s in stats)
    rounds = sum(s.verify_rounds for s in stats)
    planned = sum(s.mean_num_draft_tokens * s.verify_rounds for s in stats)
    details = {}
    if predicted:  # a request with a prediction drafts from it alone: its drafts are prediction tokens
        details = {
            "completion_tokens_details": {
                "accepted_prediction_tokens": accepted,
                "rejected_prediction_tokens": draft - accepted,
            }
        }
    return {
        **details,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
        "draft_tokens": draft,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / draft if draft else 0.0,
        "verify_rounds": rounds,
        # as the model defines it: one token per round plus the accepted drafts
        "mean_accepted_length": 1.0 + accepted / rounds if rounds else 0.0,
        "mean_num_draft_tokens": planned / rounds if rounds else 0.0,
    }
