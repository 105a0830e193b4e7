"""Per-request sampling settings, validated (no tensors here: the scheduler side imports this)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trispec.errors import InvalidInputError

if TYPE_CHECKING:
    from trispec.guided.compiler import CompiledGrammar

# torch.Generator.manual_seed accepts any value representable in 64 bits; we keep seeds non-negative.
_MAX_SEED = 2**64 - 1
# how a sampled token is drawn and drafts checked (``speculation.sampling_rule``, sampling/coupled.py)
SAMPLING_RULES = ("coupled", "rejection")
# the most alternatives a token's log-prob comes with (OpenAI's top_logprobs allows 20)
MAX_TOP_LOG_PROBS = 20


def _real(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidInputError(field, f"must be a number, got {value!r}")
    return float(value)


def _integral(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidInputError(field, f"must be an integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings. Invalid values raise :class:`InvalidInputError` naming the field."""

    temperature: float = 0.0  # 0 => greedy
    top_k: int = 0  # 0 => off
    top_p: float = 1.0  # 1.0 => off
    seed: int | None = None
    # penalties over the whole sequence so far (prompt + output), as TensorRT-LLM applies them:
    # repetition divides a seen token's positive logit (multiplies a negative one); presence
    # subtracts once per seen token, frequency once per occurrence
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # report the log-probability of each emitted token
    return_log_probs: bool = False
    # with return_log_probs: also the this-many most likely tokens at each position, with their
    # log-probs under the same distribution (OpenAI's top_logprobs; 0: none)
    top_log_probs: int = 0
    # the log-prob of each prompt token after the first under the model's own distribution (the
    # softmax of its logits; with top_log_probs, alternatives too): computes the whole prompt, no
    # prefix-cache reuse
    prompt_log_probs: bool = False
    # resolved by the scheduler from the request: token sequences never emitted (the last token is
    # masked where the sequence so far ends with the others), end ids masked until ``min_tokens``
    # tokens were generated, and the prompt length (where generated tokens start)
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    # (token id, bias) pairs added to the logits before the penalties, ids ascending, each once
    logit_bias: tuple[tuple[int, float], ...] = ()
    # the caller's predicted output, tokenised: drafts are copied from it (drafters/prediction.py)
    prediction: tuple[int, ...] = ()
    min_tokens: int = 0
    end_ids: frozenset[int] = field(default_factory=frozenset)
    prompt_len: int = 0
    # the serving runner's sampling rule, resolved by the scheduler: "coupled" (a seed's tokens do not
    # depend on the drafts) or "rejection" (they do)
    rule: str = "coupled"
    # guided decoding: the compiled grammar every emitted token must follow (resolved by the scheduler)
    grammar: CompiledGrammar | None = None

    def __post_init__(self) -> None:
        # Values often arrive as numpy scalars (Triton request tensors): accept any real / integral
        # number, then store builtin float / int so the params hash, compare and print plainly.
        # bool is an Integral too; `top_k=True` is almost certainly a client bug, so it is refused.
        temperature = _real("temperature", self.temperature)
        if not math.isfinite(temperature) or temperature < 0:
            raise InvalidInputError("temperature", f"must be finite and >= 0, got {self.temperature!r}")
        top_k = _integral("top_k", self.top_k)
        if top_k < 0:
            raise InvalidInputError("top_k", f"must be >= 0 (0 = off), got {self.top_k!r}")
        top_p = _real("top_p", self.top_p)
        # top_p == 0 would keep nothing; the nucleus always keeps the top token anyway, so ask for > 0.
        if not 0.0 < top_p <= 1.0:  # also refuses NaN
            raise InvalidInputError("top_p", f"must be in (0, 1] (1 = off), got {self.top_p!r}")
        seed = None if self.seed is None else _integral("seed", self.seed)
        if seed is not None and not 0 <= seed <= _MAX_SEED:
            raise InvalidInputError("seed", f"must be in [0, 2**64), got {self.seed!r}")
        repetition = _real("repetition_penalty", self.repetition_penalty)
        if not math.isfinite(repetition) or repetition <= 0:
            raise InvalidInputError("repetition_penalty", f"must be > 0 (1 = off), got {repetition!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not math.isfinite(_real(name, getattr(self, name))):
                raise InvalidInputError(name, f"must be finite (0 = off), got {getattr(self, name)!r}")
            object.__setattr__(self, name, float(getattr(self, name)))
        min_tokens = _integral("min_tokens", self.min_tokens)
        if min_tokens < 0:
            raise InvalidInputError("min_tokens", f"must be >= 0, got {self.min_tokens!r}")
        top_log_probs = _integral("top_log_probs", self.top_log_probs)
        if not 0 <= top_log_probs <= MAX_TOP_LOG_PROBS:
            raise InvalidInputError(
                "top_log_probs", f"must be in [0, {MAX_TOP_LOG_PROBS}], got {self.top_log_probs!r}"
            )
        if top_log_probs and not self.return_log_probs:
            raise InvalidInputError("top_log_probs", "needs return_log_probs (alternatives come beside them)")
        if self.rule not in SAMPLING_RULES:
            raise InvalidInputError(
                "sampling_rule", f"must be one of {', '.join(SAMPLING_RULES)}, got {self.rule!r}"
            )
        object.__setattr__(self, "repetition_penalty", repetition)
        object.__setattr__(self, "min_tokens", min_tokens)
        object.__setattr__(self, "return_log_probs", bool(self.return_log_probs))
        object.__setattr__(self, "top_log_probs", top_log_probs)
        object.__setattr__(self, "prompt_log_probs", bool(self.prompt_log_probs))
        object.__setattr__(self, "temperature", temperature)
        object.__setattr__(self, "top_k", top_k)
        object.__setattr__(self, "top_p", top_p)
        object.__setattr__(self, "seed", seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalised(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def shapes_logits(self) -> bool:
        """Whether logits go through ``logits_rules.apply_rules`` before sampling (logit bias,
        penalties, bad words, min_tokens); off by default, then nothing is spent on it."""
        return self.penalised or bool(self.bad_words_ids) or self.min_tokens > 0 or bool(self.logit_bias)

    @property
    def guided(self) -> bool:
        return self.grammar is not None

    @property
    def seeded(self) -> bool:
        """Sampled with a seed: the same output is promised on every run."""
        return not self.greedy and self.seed is not None

    @property
    def samples_by_rejection(self) -> bool:
        return not self.greedy and self.rule == "rejection"

    @property
    def output_depends_on_drafts(self) -> bool:
        """Seeded and sampled by the rejection rule, whose draws depend on how many drafts each round
        checks and which: to keep the seed's promise it drafts its own k, from its own tokens only,
        whatever it shares. Under the coupled rule a seed's tokens are plain sampling's, whatever was
        drafted."""
        return self.seeded and self.rule == "rejection"
