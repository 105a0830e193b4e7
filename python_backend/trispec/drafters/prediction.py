"""Drafts from a request's predicted output (OpenAI's Predicted Outputs: the caller sends text it
expects much of the answer to repeat, e.g. the file being edited). No model: each round proposes the
continuation of the longest match of the sequence's latest tokens in the prediction, as suffix
decoding does in its own index (``suffix.longest_match`` and ``walk``), up to the request's k. The
target verifies every draft, so a wrong prediction costs only its rejected drafts, never the text."""

from __future__ import annotations

from trispec.drafters.base import DraftProposal, DraftRequest
from trispec.drafters.suffix import SEPARATOR, SuffixIndex, longest_match, walk
from trispec.sampling import one_hot_probs

# a prediction is a long, exact copy where it applies: a single matching token may start a draft of
# the full k (the walk's vote still stops where the prediction's occurrences disagree)
MIN_TOKEN_PROB = 0.1


class PredictionDrafts:
    """Per-request indexes of predicted outputs, built on a request's first proposal."""

    def __init__(self, vocab_size: int, max_depth: int = 24, max_candidates: int = 32) -> None:
        self.vocab_size = vocab_size
        self.max_depth = max_depth
        self.max_candidates = max_candidates
        self._indexes: dict[int, SuffixIndex] = {}

    def propose(self, request: DraftRequest) -> DraftProposal:
        prediction = request.sampling.prediction
        # after forced tokens (a grammar's) the sequence's end is not verified text: no match is sure
        if not prediction or request.prefix or request.num_draft_tokens <= 0:
            return DraftProposal([])
        index = self._indexes.get(request.seq_id)
        if index is None:
            index = self._indexes[request.seq_id] = SuffixIndex()
            # the prediction alone, then an end (so that its last token is indexed too: the walk stops there)
            index.extend([*prediction, SEPARATOR])
        suffix = list(request.token_ids[-self.max_depth :])
        match_len, candidates, _ = longest_match([index], suffix, self.max_depth, self.max_candidates)
        if match_len == 0:
            return DraftProposal([])
        tokens, _ = walk(candidates, request.num_draft_tokens, MIN_TOKEN_PROB)
        probs = None
        if tokens and not request.sampling.greedy and request.sampling.rule == "rejection":
            probs = one_hot_probs(tokens, self.vocab_size)  # the rejection rule's q: one-hot
        return DraftProposal(tokens, probs)

    def free(self, seq_id: int) -> None:
        self._indexes.pop(seq_id, None)
