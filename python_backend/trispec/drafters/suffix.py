"""Suffix decoding (as in Arctic Inference and vLLM's ``suffix`` method): no model. Propose what most
often followed the longest earlier match of the sequence's latest tokens, found in the sequence
itself (prompt + output so far) or in the outputs of recently finished requests.

The index is positional, not a suffix tree: the token list plus, for each n-gram length in
``KEY_LENGTHS`` (1, 2, 4, 8), a hash chain of the positions that followed each n-gram (zlib's
head/prev arrays). Appending a token costs one dict update per length: O(1), nothing is rebuilt.
To draft: take the latest occurrences (at most ``max_candidates``) of the longest indexed n-gram
ending the sequence, extend each match backwards up to ``max_depth`` tokens and keep those with the
longest match: the occurrences under the deepest matching node of a depth-``max_depth`` suffix
tree. Stepping them forward together, keeping those that agree with the most frequent next token,
is the walk down that tree's most frequent children (as Arctic's), so counts are exact save that at
most ``max_candidates`` occurrences vote; unlike a depth-capped tree, the walk is not capped.
Unlike Arctic, only the deepest match speculates (Arctic scores every match length).

Each request has its own index (prompt + verified output). A freed request's output (what followed
the tokens of its first propose, the prompt; the last round's tokens are never seen) joins a global
index of segments that holds at most ``global_tokens`` tokens, the oldest segment evicted first.
Both indexes speculate and the higher expected gain wins. Memory is about 300 bytes per token.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence

from trispec.drafters.base import DraftProposal, DraftRequest, StatelessDrafter
from trispec.sampling import one_hot_probs

# Deepest first at lookup: the longest n-gram with any occurrence gives the fewest, best candidates.
# Powers of two keep the per-token cost at 4 dict updates while a long match (a copied span) is
# still found among the 8-gram's occurrences, not drowned among the many of a common short n-gram.
KEY_LENGTHS = (1, 2, 4, 8)
# Ends each request in the global index. Never a token id, so no match or walk crosses it.
SEPARATOR = -1

Candidates = tuple[list[int], list[int]]  # a token list, positions right after a match in it


class SuffixIndex:
    """A token list and, per n-gram length in KEY_LENGTHS, a hash chain (as in zlib) of the positions
    that followed each n-gram: ``heads[level][key]`` is the latest such position and
    ``prevs[level][p]`` the one before p with the same key (-1: none). The key is the token for
    n = 1, the hash of the n-gram's tuple otherwise (deterministic for ints; a collision only adds a
    candidate that the match check then drops)."""

    __slots__ = ("heads", "prevs", "tokens")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.heads: list[dict[int, int]] = [{} for _ in KEY_LENGTHS]
        self.prevs: list[array[int]] = [array("q") for _ in KEY_LENGTHS]

    def extend(self, new: Sequence[int]) -> int:
        """Append ``new``; returns the number of positions indexed (the whole cost of an update)."""
        tokens = self.tokens
        start = len(tokens)
        tokens.extend(new)
        levels = list(zip(self.heads, self.prevs, KEY_LENGTHS))
        # the n-grams ending at i - 1 learn that i followed them: the last token's n-grams wait for
        # the next token, so the live end of the sequence is never its own candidate
        for i in range(start, len(tokens)):
            for heads, prevs, n in levels:
                if n > i:
                    prevs.append(-1)
                    continue
                key = tokens[i - 1] if n == 1 else hash(tuple(tokens[i - n : i]))
                prevs.append(heads.get(key, -1))
                heads[key] = i
        return (len(tokens) - start) * len(KEY_LENGTHS)


def longest_match(
    sources: Sequence[SuffixIndex], suffix: list[int], max_depth: int, max_candidates: int
) -> tuple[int, list[Candidates], int]:
    """The longest match (<= max_depth) of the end of ``suffix`` in ``sources`` (newest first), the
    candidates that reach it (per source, latest first) and how many candidates were examined."""
    depth_cap = min(max_depth, len(suffix))
    examined = 0
    for level in reversed(range(len(KEY_LENGTHS))):
        n = KEY_LENGTHS[level]
        if n > depth_cap:
            continue
        key = suffix[-1] if n == 1 else hash(tuple(suffix[-n:]))
        best, tail = n, suffix[-n:]
        chosen: list[Candidates] = []
        budget = max_candidates
        for source in sources:
            tokens, prevs = source.tokens, source.prevs[level]
            positions: list[int] = []
            p = source.heads[level].get(key, -1)
            while p >= 0 and budget:
                budget -= 1
                # a slice compare (C speed) rules out every candidate shorter than the best so far
                if p >= best and tokens[p - best : p] == tail:
                    length = best
                    while length < depth_cap and length < p and tokens[p - length - 1] == suffix[-length - 1]:
                        length += 1
                    if length > best:
                        best, tail, chosen, positions = length, suffix[-length:], [], []
                    positions.append(p)
                p = prevs[p]
            if positions:
                chosen.append((tokens, positions))
        examined += max_candidates - budget
        if chosen:
            return best, chosen, examined
    return 0, [], examined


def walk(candidates: list[Candidates], limit: int, min_token_prob: float) -> tuple[list[int], float]:
    """Up to ``limit`` tokens, each the most frequent continuation of the candidates still agreeing
    with the tokens so far; stops once the estimated probability of the whole draft is below
    ``min_token_prob``. Returns the tokens and their score, the sum of those probabilities (the
    expected number accepted)."""
    out: list[int] = []
    prob, score = 1.0, 0.0
    j = 0  # every candidate still in play has matched the draft so far: it votes with p + j
    while len(out) < limit:
        if len(candidates) == 1 and len(candidates[0][1]) == 1:
            # one occurrence left: the rest of the draft copies what followed it, at the same
            # probability (each further step would vote 1 of 1)
            tokens, (p,) = candidates[0]
            rest = tokens[p + j : p + j + limit - len(out)]
            if SEPARATOR in rest:
                rest = rest[: rest.index(SEPARATOR)]
            return out + rest, score + prob * len(rest)
        # a candidate past the end of the live sequence has no known continuation: no vote; one
        # at a finished request's end votes against every continuation
        votes = []
        for tokens, positions in candidates:
            end = len(tokens) - j
            votes += [tokens[p + j] for p in positions if p < end]
        if not votes:
            break
        token = votes[0]
        count = votes.count(token)  # C speed; usually every vote agrees and nobody drops out
        if count < len(votes) or token == SEPARATOR:
            counts: dict[int, int] = {}
            for vote in votes:
                counts[vote] = counts.get(vote, 0) + 1
            counts.pop(SEPARATOR, None)
            if not counts:
                break
            # max keeps the first of equal counts: votes are latest first, so recency breaks ties
            token = max(counts, key=counts.__getitem__)
            count = counts[token]
            candidates = [
                (tokens, kept)
                for tokens, positions in candidates
                if (kept := [p for p in positions if p + j < len(tokens) and tokens[p + j] == token])
            ]
        prob *= count / len(votes)
        if prob < min_token_prob:
            break
        out.append(token)
        score += prob
        j += 1
    return out, score


class _SequenceState:
    __slots__ = ("index", "prompt_len")

    def __init__(self) -> None:
        self.index = SuffixIndex()
        # the length of the first token_ids proposed for: the prompt (the first propose follows
        # the prompt's last chunk), so that only the output joins the global index
        self.prompt_len: int | None = None


class SuffixDrafter(StatelessDrafter):
    """Model-free drafts from a per-request suffix index and a bounded global one.

    Args:
        vocab_size: rows of the one-hot ``probs`` returned under sampling.
        max_depth: longest suffix matched, in tokens. Longer tells contexts apart better and raises
            the length cap below; the cost is at most ``max_depth`` compares per candidate.
        max_spec_factor: adaptive length: at most ``max_spec_factor * match_length`` tokens (and
            never more than the request's k), so a 1-token match drafts 1 token, a long one up to k.
        min_token_prob: stop drafting once the estimated probability that every token so far is
            right (the product of each chosen continuation's share of the votes) drops below it.
        global_tokens: cap on the global index of finished requests' outputs, in tokens; the oldest
            requests go first (in segments of 1/8 of the cap). 0 disables it.
        max_candidates: at most this many latest occurrences per index vote, which bounds the cost
            of a proposal whatever the length of the sequence.
    """

    def __init__(
        self,
        vocab_size: int,
        max_depth: int = 24,
        max_spec_factor: float = 1.0,
        min_token_prob: float = 0.1,
        global_tokens: int = 100_000,
        max_candidates: int = 32,
    ) -> None:
        if max_depth < 1 or max_candidates < 1 or global_tokens < 0:
            raise ValueError("max_depth and max_candidates must be >= 1, global_tokens >= 0")
        self.vocab_size = vocab_size
        self.max_depth = max_depth
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self.global_tokens = global_tokens
        self.max_candidates = max_candidates
        self._seqs: dict[int, _SequenceState] = {}
        self._segments: deque[SuffixIndex] = deque()  # oldest first
        self._segment_tokens = max(1, global_tokens // 8)
        self.global_size = 0  # tokens in the global index, separators included
        # work counters, for tests and benchmarks: positions indexed, candidates examined
        self.num_indexed = 0
        self.num_examined = 0

    # -- the Drafter protocol --------------------------------------------------------------------
    def add_sequence(
        self, seq_id: int, max_length: int, cache_salt: str = "", token_ids: Sequence[int] = ()
    ) -> int:
        self._seqs[seq_id] = _SequenceState()
        return 0

    def propose(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        proposals = []
        for request in requests:
            index = self._update(request.seq_id, request.token_ids)
            # under the rejection rule a seeded request's draws depend on its drafts: drafts from
            # other requests' outputs would make its output depend on what else ran
            own_only = request.sampling.output_depends_on_drafts
            # its index holds verified tokens only: after a prefix (forced tokens) it sits this round out
            k = 0 if request.prefix else request.num_draft_tokens
            tokens = self._draft(index, k, use_global=not own_only)
            probs = None
            if tokens and not request.sampling.greedy and request.sampling.rule == "rejection":
                # the rejection rule's q of a deterministic proposal: one-hot on the proposed token
                probs = one_hot_probs(tokens, self.vocab_size)
            proposals.append(DraftProposal(tokens, probs))
        return proposals

    def free(self, seq_id: int) -> None:
        state = self._seqs.pop(seq_id, None)
        if state is not None and state.prompt_len is not None:
            self._remember(state.index.tokens[state.prompt_len :])

    # -- internals ---------------------------------------------------------------------------------
    def _update(self, seq_id: int, token_ids: Sequence[int]) -> SuffixIndex:
        """Index the tokens verified since the last call (all of them on the first)."""
        state = self._seqs.get(seq_id)
        known = len(state.index.tokens) if state is not None else 0
        # not a continuation of what was indexed: only a protocol slip can do this, so start over
        # rather than draft from the wrong text (the check is O(1): length and the last token)
        if (
            state is None
            or len(token_ids) < known
            or (known and token_ids[known - 1] != state.index.tokens[-1])
        ):
            state = self._seqs[seq_id] = _SequenceState()
            known = 0
        if state.prompt_len is None:
            state.prompt_len = len(token_ids)
        self.num_indexed += state.index.extend(token_ids[known:])
        return state.index

    def _draft(self, index: SuffixIndex, k: int, use_global: bool = True) -> list[int]:
        if k <= 0 or not index.tokens:
            return []
        suffix = index.tokens[-self.max_depth :]
        tokens, score = self._speculate([index], suffix, k)
        if self._segments and use_global:
            # both indexes speculate and the higher expected gain wins (Arctic's rule), the
            # request's own on a tie: the global one serves where the request has no good match
            other, other_score = self._speculate(list(reversed(self._segments)), suffix, k)
            if other_score > score:
                tokens = other
        return tokens

    def _speculate(
        self, sources: Sequence[SuffixIndex], suffix: list[int], k: int
    ) -> tuple[list[int], float]:
        match_len, candidates, examined = longest_match(sources, suffix, self.max_depth, self.max_candidates)
        self.num_examined += examined
        # + 1e-6: a factor like 0.1 times 10 must give 1, not 0.999...
        limit = min(k, int(self.max_spec_factor * match_len + 1e-6))
        if limit <= 0:
            return [], 0.0
        return walk(candidates, limit, self.min_token_prob)

    def _remember(self, output: list[int]) -> None:
        """Add a finished request's output to the global index; evict the oldest past the cap."""
        room = self.global_tokens - 1  # one slot for the separator
        if room <= 0 or not output:
            return
        output = output[-room:]
        newest = self._segments[-1] if self._segments else None
        if newest is None or len(newest.tokens) + len(output) + 1 > self._segment_tokens:
            # a segment is at most a segment's worth of tokens or one request, so evicting whole
            # segments from the old end never has to drop the request just added
            newest = SuffixIndex()
            self._segments.append(newest)
        self.num_indexed += newest.extend([*output, SEPARATOR])
        self.global_size += len(output) + 1
        while self.global_size > self.global_tokens and len(self._segments) > 1:
            self.global_size -= len(self._segments.popleft().tokens)
