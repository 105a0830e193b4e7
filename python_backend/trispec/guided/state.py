"""One guided sequence's grammar matcher through speculation.

The matcher holds exactly the sequence's verified output tokens: each round first catches up with the
tokens verified since (``sync``), so accepted drafts are committed and rejected ones were never
consumed. Drafts are consumed only to compute the masks of the rows after them, then rolled back:
row ``i`` of a verify pass is masked by the grammar's state after the first ``i`` drafts, as the row
would be in plain decoding had those drafts been emitted. Greedy and coupled-sampled tokens are then
those of target-only guided decoding, whatever k, drafter or batch.

End of sequence: llguidance's end token stands for the request's own end ids (allowed exactly where
the grammar may end); a grammar that is complete with no end id to emit ends the request as done.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from trispec.guided.compiler import CompiledGrammar

NO_ALLOWED_TOKEN = "the grammar allows no token here"


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
        self.prompt_len = prompt_len
        self.vocab_size = vocab_size
        self.consumed: list[int] = []

    # -- the verified tokens ------------------------------------------------------------------------
    def sync(self, token_ids: Sequence[int]) -> None:
        """Consume the output tokens verified since the last round (all of them after a restart)."""
        output = token_ids[self.prompt_len :]
        n = len(self.consumed)
        if len(output) < n or (n and output[n - 1] != self.consumed[-1]):
            self.matcher.reset()  # not a continuation (only a protocol slip does this): start over
            self.consumed, n = [], 0
        new = [int(t) for t in output[n:]]
        if new:
            self.matcher.consume_tokens(new)
            self.consumed.extend(new)

    @property
    def complete(self) -> bool:
        """The grammar is satisfied and admits nothing more (only its end)."""
        return self.matcher.is_stopped() and not self.matcher.is_error()

    def dead_end_reason(self) -> str:
        error = self.matcher.get_error() if self.matcher.is_error() else ""
        return f"{NO_ALLOWED_TOKEN}: {error}" if error else NO_ALLOWED_TOKEN

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
        if not pending:
            return self._allowed()
        self.matcher.consume_tokens(pending)
        try:
            return self._allowed()
        finally:
            self.matcher.rollback(len(pending))

    def mask_logits(self, logits: torch.Tensor, pending: Sequence[int]) -> torch.Tensor:
        """A drafter's row ``[1, V]`` masked as the verifier will mask the target's at that position
        (left as it is where nothing is allowed: that draft is cut before the verify anyway)."""
        allowed = self.allowed_after(pending)
        if allowed is None or not allowed.any():
            return logits
        return logits.masked_fill(torch.from_numpy(~allowed), -math.inf)

    def check_drafts(self, drafts: Sequence[int]) -> tuple[int, torch.Tensor]:
        """How many of ``drafts`` in a row the grammar allows, and the verify rows' masks for them:
        ``[n + 1, V]``, row ``i`` what may follow the first ``i`` drafts. An allowed end id is the
        last draft kept (the row after it is never used: all allowed). Built in numpy: a handful of
        tiny torch ops per row cost more than the grammar on a busy machine (thread-pool wake-ups)."""
        rows = [self._allowed()]
        consumed = 0
        for token in map(int, drafts):
            if not rows[-1][token]:
                break
            if token in self.end_ids:
                rows.append(np.ones(self.vocab_size, dtype=bool))
                break
            if not self.matcher.consume_token(token):  # allowed by the mask: never expected
                break
            consumed += 1
            rows.append(self._allowed())
        if consumed:
            self.matcher.rollback(consumed)
        return len(rows) - 1, torch.from_numpy(np.stack(rows))

    def _allowed(self) -> np.ndarray:
        if self.matcher.is_error():
            return np.zeros(self.vocab_size, dtype=bool)
        raw = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        bits = np.unpackbits(raw, bitorder="little", count=self._unpack).view(bool)
        end_allowed = bool(bits[self.grammar_end_ids].any()) if self.grammar_end_ids else False
        mask = bits[: self.vocab_size].copy()
        mask[self.grammar_end_ids_in_vocab] = False
        mask[self.end_ids] = end_allowed
        return mask


def mask_rows(logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """``logits`` ``[n, V]`` with every token its row's mask forbids at -inf."""
    return logits.masked_fill(~masks[: logits.shape[0]], -math.inf)
