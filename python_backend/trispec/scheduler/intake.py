"""The scheduler's thread side: requests and cancellations come in from any thread (a server's
request threads) through a lock-guarded inbox; a request becomes a ``Sequence`` once validated
against the runner's limits, now or, with ``tokenize_later``, on the thread that steps the engine."""

from __future__ import annotations

import itertools
import secrets
import threading
from collections.abc import Callable
from dataclasses import replace

from trispec.config import SchedulerConfig
from trispec.detokenize import StopTextTracker
from trispec.errors import InvalidInputError
from trispec.guided.compiler import CompiledGrammar, GrammarCompiler
from trispec.request import GenerationRequest, Limits, validate_request
from trispec.runners.base import SpecRunner
from trispec.sampling_params import SamplingParams
from trispec.scheduler.outputs import RequestOutput
from trispec.sequence import FinishReason, Sequence
from trispec.stats import AcceptanceStats


def limits_for(runner: SpecRunner, config: SchedulerConfig) -> Limits:
    """What a request may ask of this runner under this config."""
    max_k = config.max_num_draft_tokens if runner.can_draft else 0
    max_context, context_note = runner.max_context, runner.max_context_note
    if config.max_context is not None and config.max_context < max_context:
        max_context, context_note = config.max_context, "scheduler.max_context"
    return Limits(
        max_context=max_context,
        context_note=context_note,
        max_num_draft_tokens=max_k,
        default_num_draft_tokens=min(config.default_num_draft_tokens, max_k),
        vocab_size=runner.vocab_size,
    )


class Intake:
    """Requests in, from any thread (a part of ``Scheduler``): the inbox, the cancellations, and
    request -> ``Sequence``."""

    # the scheduler's
    runner: SpecRunner
    clock: Callable[[], float]

    def __init__(
        self,
        limits: Limits,
        *,
        encode: Callable[[str], list[int]],
        make_text_tracker: Callable[[list[str]], StopTextTracker],
        eos_ids: frozenset[int],
        encode_words: Callable[[str], list[int]] | None,
        grammars: GrammarCompiler | None = None,
    ) -> None:
        self.encode = encode
        # compiles guided requests' grammars (cached); None: guided decoding is not served
        self.grammars = grammars
        # a piece of text inside a sequence (bad words): no BOS
        self.encode_words = encode_words or encode
        self.make_text_tracker = make_text_tracker
        self.eos_ids = eos_ids
        self.limits = limits
        self._ids = itertools.count()
        # guards the inbox and the waiting queue, which other threads read (queued_ids, has_work)
        # while schedule() changes them
        self._lock = threading.Lock()
        self._inbox: list[Sequence] = []
        self._untokenized: list[tuple[int, GenerationRequest, float, CompiledGrammar | None]] = []
        self._cancels: set[int] = set()
        # outputs that arise while scheduling (cancellations), returned by the next postprocess
        self._pending_outputs: list[RequestOutput] = []

    # -- called from any thread ------------------------------------------------------------
    def add_request(self, request: GenerationRequest, tokenize_later: bool = False) -> int:
        """Validate and queue a request; returns its id. Raises InvalidInputError naming the field.

        ``tokenize_later``: a text prompt is tokenised (and what depends on its length validated) by
        the next ``schedule()``, on the thread that steps the engine, so that the caller (a server's
        request thread) never spends time on it; an invalid one then ends with an output whose
        ``invalid`` says why."""
        if request.prompt_token_ids is None and (not isinstance(request.prompt, str) or not request.prompt):
            raise InvalidInputError("prompt", "must be a non-empty string")
        # on the caller's thread, never the step loop's: a bad guide is refused before admission
        grammar = self.compile_guide(request)
        if tokenize_later and request.prompt_token_ids is None:
            with self._lock:
                seq_id = next(self._ids)
                self._untokenized.append((seq_id, request, self.clock(), grammar))
            return seq_id
        seq = self._sequence(request, arrived_at=self.clock(), grammar=grammar)
        with self._lock:
            seq.seq_id = next(self._ids)
            self._inbox.append(seq)
        return seq.seq_id

    def compile_guide(self, request: GenerationRequest) -> CompiledGrammar | None:
        """A guided request's compiled grammar (None unguided); raises ``InvalidInputError``."""
        if request.guide is None:
            return None
        if self.grammars is None:
            raise InvalidInputError(request.guide.field, "guided decoding is not served by this engine")
        refusal = getattr(self.runner, "guide_refusals", {}).get(request.guide.kind)
        if refusal is not None:
            raise InvalidInputError("guided_decoding_guide_type", refusal)
        if request.num_draft_tokens and not getattr(self.runner, "guided_drafts", False):
            # TensorRT-LLM 1.2.x: its GuidedDecoder masks one logits row per request and advances
            # the matcher by the last token only (batch_manager/guidedDecoder.cpp, build/execute)
            raise InvalidInputError(
                "num_draft_tokens",
                "guided decoding cannot be combined with draft tokens on this engine (TensorRT-LLM "
                "masks only the first row of a verify pass); send 0 or leave it unset",
            )
        return self.grammars.compile(request.guide)

    def _logit_bias(self, request: GenerationRequest) -> tuple[tuple[int, float], ...]:
        """The request's biases by token id: its own, plus each embedding-bias word's weight on every
        token of that word (tokenised as TensorRT-LLM's preprocessing does it, as a prompt)."""
        bias: dict[int, float] = {int(t): float(b) for t, b in request.logit_bias.items()}
        for word, weight in request.embedding_bias:
            for token in self.encode(word):
                bias[token] = bias.get(token, 0.0) + float(weight)
        return tuple(sorted((t, b) for t, b in bias.items() if b != 0.0))

    def _sequence(
        self,
        request: GenerationRequest,
        seq_id: int = -1,
        arrived_at: float = 0.0,
        grammar: CompiledGrammar | None = None,
    ) -> Sequence:
        if request.prompt_token_ids is not None:
            prompt_ids = list(request.prompt_token_ids)
        else:
            prompt_ids = self.encode(request.prompt)  # type: ignore[arg-type]
        num_draft_tokens = validate_request(request, prompt_ids, self.limits)
        if request.end_id is None:
            end_ids = self.eos_ids
        else:
            # -1, or an id the model cannot produce: no end id at all
            no_end = request.end_id == -1 or request.end_id >= self.limits.vocab_size
            end_ids = frozenset() if no_end else frozenset([request.end_id])
        # what shapes the distribution and depends on the tokenizer or the prompt (logits_rules.py),
        # and how the runner samples; every sampled request has a seed (a fresh random one when the
        # caller gave none, reported in its outputs), so its text can be reproduced and resumed
        sampling = replace(
            request.sampling,
            bad_words_ids=tuple(tuple(ids) for ids in map(self.encode_words, request.bad_words) if ids),
            logit_bias=self._logit_bias(request),
            # a piece of text inside a sequence: no BOS
            prediction=tuple(self.encode_words(request.prediction)) if request.prediction else (),
            end_ids=end_ids,
            prompt_len=len(prompt_ids),
            rule=self.runner.sampling_rule,
            grammar=grammar,
        )
        if grammar is not None and not getattr(self.runner, "guided_drafts", False):
            num_draft_tokens = 0  # the runtime masks only a verify pass's first row: decode plain
        if not sampling.greedy and sampling.seed is None:
            sampling = replace(sampling, seed=secrets.randbits(63))
        if not self.runner.shapes_logits:
            _refuse_logits_rules(sampling)
        return Sequence(
            seq_id=seq_id,
            prompt_ids=prompt_ids,
            max_tokens=request.max_tokens,
            num_draft_tokens=num_draft_tokens,
            sampling=sampling,
            text=self.make_text_tracker(list(request.stop)),
            drafts=num_draft_tokens > 0,
            arrived_at=arrived_at,
            skip_output_tokens=request.skip_output_tokens,
            cache_salt=request.cache_salt or "",
        )

    def cancel(self, request_id: int) -> None:
        """Stop a request at the next step; its KV blocks return to the pool."""
        with self._lock:
            self._cancels.add(request_id)

    def _tokenize_arrivals(self) -> list[Sequence]:
        """Requests queued with ``tokenize_later``, tokenised and validated; invalid ones end here."""
        with self._lock:
            untokenized, self._untokenized = self._untokenized, []
        arrived = []
        for seq_id, request, arrived_at, grammar in untokenized:
            try:
                seq = self._sequence(request, seq_id, arrived_at, grammar)
            except InvalidInputError as exc:
                refused = RequestOutput(
                    seq_id, [], "", True, FinishReason.ERROR, AcceptanceStats(), str(exc), exc
                )
                self._pending_outputs.append(refused)
                continue
            arrived.append(seq)
        return arrived


def _refuse_logits_rules(sampling: SamplingParams) -> None:
    """For a runner that does not apply them: refuse, naming the request field, rather than ignore."""
    defaults = SamplingParams()
    for name, field_name in (
        ("logit_bias", "logit_bias"),
        ("prediction", "prediction"),
        ("bad_words_ids", "bad_words"),
        ("repetition_penalty", "repetition_penalty"),
        ("presence_penalty", "presence_penalty"),
        ("frequency_penalty", "frequency_penalty"),
        ("min_tokens", "min_tokens"),
        ("return_log_probs", "return_log_probs"),
        ("prompt_log_probs", "prompt_log_probs"),
    ):
        if getattr(sampling, name) != getattr(defaults, name):
            raise InvalidInputError(field_name, "is not supported by this engine (engine.kind trtllm) yet")
