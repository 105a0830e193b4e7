"""One guided sequence's grammar matcher through speculation.

The matcher holds exactly the sequence's verified output tokens: each round first catches up with the
tokens verified since (``sync``), so accepted drafts are committed and rejected ones were never
consumed. Drafts are consumed only to compute the masks of the rows after them, then rolled back
(``_lookahead``: on every path, an exception included): row ``i`` of a verify pass is masked by the
grammar's state after the first ``i`` drafts, as the row would be in plain decoding had those drafts
been emitted. Greedy and coupled-sampled tokens are then those of target-only guided decoding, whatever
k, drafter or batch. A token the matcher refuses (a verified one, or a draft its own mask allowed) is
a ``GrammarError`` naming it, never a matcher left in its error state to end the request later.

End of sequence: llguidance's end token stands for the request's own end ids. Where the grammar may
end, an end id ends the request; where it may not, an end id the grammar allows as text (a newline
end id inside a multi-line regex) is text there and the request goes on (``GuidedRows.may_end``,
``text_end_ids``). A grammar that is complete with no end id to emit ends the request as done.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from trispec.guided.compiler import CompiledGrammar

NO_ALLOWED_TOKEN = "the grammar allows no token here"


class GrammarError(RuntimeError):
    """The grammar's matcher refused a token it had to take: the sequence fails, saying which."""


@dataclass(frozen=True)
class GuidedRows:
    """A guided sequence's verify rows: ``allowed`` ``[n + 1, V]`` (row ``i``: what may follow the
    verified tokens and the first ``i`` drafts) and, per row, whether the grammar may end there (where
    it may, the request's end ids end it; elsewhere they can only be text)."""

    allowed: torch.Tensor
    may_end: tuple[bool, ...]

    def __getitem__(self, rows: slice) -> GuidedRows:
        return GuidedRows(self.allowed[rows], self.may_end[rows])


class GrammarState:
    def __init__(
        self, compiled: CompiledGrammar, end_ids: Iterable[int], prompt_len: int, vocab_size: int
    ) -> None:
        """``end_ids``: the request's own (its sampling's ``end_ids``), which the grammar's end
        token stands for; ``prompt_len``: where the sequence's output starts."""
        self.compiled = compiled
        self.matcher = compiled.new_matcher()
        self.grammar_end_ids = list(compiled.tokenizer.eos_tokens)
        self.grammar_end_ids_in_vocab = [i for i in self.grammar_end_ids if i < vocab_size]
        # bits to unpack: the vocabulary, and the grammar's end ids past it (an added end token)
        self._unpack = max([vocab_size, *(i + 1 for i in self.grammar_end_ids)])
        self.end_ids = sorted(i for i in end_ids if i < vocab_size)
        self._end_set = frozenset(self.end_ids)
        self.prompt_len = prompt_len
        self.vocab_size = vocab_size
        self.consumed: list[int] = []

    # -- the verified tokens ------------------------------------------------------------------------
    def sync(self, token_ids: Sequence[int]) -> None:
        """Consume the output tokens verified since the last round (all of them after a restart);
        raises ``GrammarError`` naming a token the grammar refuses (the matcher keeps the ones before)."""
        output = token_ids[self.prompt_len :]
        n = len(self.consumed)
        if len(output) < n or (n and output[n - 1] != self.consumed[-1]):
            self._restart([])  # not a continuation (only a protocol slip does this): start over
            n = 0
        new = [int(t) for t in output[n:]]
        if not new:
            return
        taken = self.matcher.try_consume_tokens(new)
        self.consumed.extend(new[:taken])
        if taken < len(new):
            raise GrammarError(
                f"the grammar refused output token {self.describe(new[taken])} at output position {n + taken}"
            )

    @property
    def complete(self) -> bool:
        """The grammar is satisfied and admits nothing more (only its end)."""
        return self.matcher.is_stopped() and not self.matcher.is_error()

    def dead_end_reason(self) -> str:
        error = self.matcher.get_error() if self.matcher.is_error() else ""
        return f"{NO_ALLOWED_TOKEN}: {error}" if error else NO_ALLOWED_TOKEN

    def describe(self, token: int) -> str:
        """A token as an error names it: its id and its text."""
        try:
            text = self.compiled.tokenizer.decode_str([token])
        except Exception:  # an id past the tokenizer's: the id alone
            return str(token)
        return f"{token} ({text!r})"

    # -- drafts -------------------------------------------------------------------------------------
    def forced(self, limit: int) -> list[int]:
        """Tokens the grammar forces next (one continuation only), at most ``limit``: free drafts."""
        if limit <= 0 or self.matcher.is_stopped():
            return []
        return [t for t in self.matcher.compute_ff_tokens()[:limit] if t < self.vocab_size]

    def allowed_after(self, pending: Sequence[int]) -> np.ndarray | None:
        """``[V]`` bool: the tokens allowed after the verified tokens and ``pending``; None when the
        grammar does not allow ``pending`` itself."""
        pending = [int(t) for t in pending]
        if pending and self.matcher.validate_tokens(pending) < len(pending):
            return None
        with self._lookahead() as consume:
            for token in pending:
                consume(token)
            return self._row()[0]

    def mask_logits(self, logits: torch.Tensor, pending: Sequence[int]) -> torch.Tensor:
        """A drafter's row ``[1, V]`` masked as the verifier will mask the target's at that position
        (left as it is where nothing is allowed: that draft is cut before the verify anyway)."""
        allowed = self.allowed_after(pending)
        if allowed is None or not allowed.any():
            return logits
        return logits.masked_fill(torch.from_numpy(~allowed), -math.inf)

    def check_drafts(self, drafts: Sequence[int]) -> tuple[int, GuidedRows]:
        """How many of ``drafts`` in a row the grammar allows, and the verify rows for them: row ``i``
        what may follow the first ``i`` drafts. An end id where the grammar may end is the request's
        end: the last draft kept (the row after it is never used: all allowed); where it may not, it
        is text. Built in numpy: a handful of tiny torch ops per row cost more than the grammar on a
        busy machine (thread-pool wake-ups)."""
        allowed, may_end = self._row()
        rows, ends = [allowed], [may_end]
        with self._lookahead() as consume:
            for token in map(int, drafts):
                if not rows[-1][token]:
                    break
                if ends[-1] and token in self._end_set:
                    rows.append(np.ones(self.vocab_size, dtype=bool))
                    ends.append(True)
                    break
                consume(token)
                allowed, may_end = self._row()
                rows.append(allowed)
                ends.append(may_end)
        return len(rows) - 1, GuidedRows(torch.from_numpy(np.stack(rows)), tuple(ends))

    def text_end_ids(self, tokens: Sequence[int], may_end: Sequence[bool] | None = None) -> tuple[int, ...]:
        """The positions in ``tokens`` (what follows the verified tokens) of end ids the grammar takes
        as text there, up to the first end id where it may end (the request's end). ``may_end``: the
        verify rows' flags (``GuidedRows``: ``tokens`` are their accepted drafts and the target's
        token); without them the matcher walks ``tokens`` (as far as it takes them)."""
        tokens = [int(t) for t in tokens]
        if not self._end_set.intersection(tokens):
            return ()
        if may_end is None:
            flags: list[bool] = []
            with self._lookahead() as consume:
                for token in tokens:
                    flags.append(token in self._end_set and self._row()[1])
                    if flags[-1] or not consume.taken(token):
                        break
            may_end = flags
        text = []
        for i, token in enumerate(tokens):
            if token in self._end_set:
                if i >= len(may_end) or may_end[i]:
                    break
                text.append(i)
        return tuple(text)

    # -- the matcher ----------------------------------------------------------------------------------
    @contextmanager
    def _lookahead(self) -> Iterator[_Consume]:
        """Consume tokens ahead of the verified ones for the block, then take them back, whatever
        happens in it; a token the matcher refuses raises ``GrammarError`` naming it."""
        consume = _Consume(self)
        try:
            yield consume
        finally:
            if consume.count and not self.matcher.rollback(consume.count):
                self._restart(self.consumed)  # cannot roll back: rebuilt from the verified tokens

    def _restart(self, tokens: list[int]) -> None:
        self.matcher = self.compiled.new_matcher()
        self.consumed = []
        if tokens and self.matcher.try_consume_tokens(tokens) < len(tokens):
            raise GrammarError("the grammar's matcher could not be rebuilt from the verified tokens")
        self.consumed = list(tokens)

    def _row(self) -> tuple[np.ndarray, bool]:
        """The tokens allowed next, and whether the grammar may end here. Its own end token is allowed
        only as the request's end ids; an end id is allowed where the grammar may end (it ends the
        request) or where the grammar allows it as text (it is text there)."""
        if self.matcher.is_error():
            return np.zeros(self.vocab_size, dtype=bool), False
        raw = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        bits = np.unpackbits(raw, bitorder="little", count=self._unpack).view(bool)
        may_end = bool(bits[self.grammar_end_ids].any()) if self.grammar_end_ids else False
        mask = bits[: self.vocab_size].copy()
        mask[self.grammar_end_ids_in_vocab] = False
        if may_end:
            mask[self.end_ids] = True
        return mask, may_end


class _Consume:
    """``GrammarState._lookahead``'s consumer: ``consume(token)``, counted for the rollback."""

    def __init__(self, state: GrammarState) -> None:
        self.state, self.count = state, 0

    def __call__(self, token: int) -> None:
        if not self.taken(token):
            raise GrammarError(f"the grammar refused draft token {self.state.describe(token)} it allowed")

    def taken(self, token: int) -> bool:
        """Consume ``token`` if the grammar takes it (a refusal leaves the matcher as it was)."""
        if self.state.matcher.try_consume_tokens([token]) != 1:
            return False
        self.count += 1
        return True


def mask_rows(logits: torch.Tensor, rows: GuidedRows) -> torch.Tensor:
    """``logits`` ``[n, V]`` with every token its row forbids at -inf."""
    return logits.masked_fill(~rows.allowed[: logits.shape[0]], -math.inf)
