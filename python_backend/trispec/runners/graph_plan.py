"""Which decode rounds the graph path takes, and what each sequence drafts there (``GraphPlan``).

Taken when every decode feeds just its last verified token (the runner feeds prompt tails and chunks
eagerly first), has ``k <= max_k``, no penalties, bad words or min_tokens (those shape the logits on
the host: eager), no log-prob alternatives (a top-N of each row, on the host: eager), and is greedy
or sampled by the coupled rule with a seed. Drafts come from the draft
model's replays, or from a model-free drafter on the host (n-gram, suffix: staged with the verify
rows, no replays), or both (``WithSuffix``: the suffix index's full-k proposals are used, and when
the model runs for other sequences they are fed to it in its replays, so its cache stays exact). A
draft cache more than 2 tokens behind is caught up eagerly before the replays.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from trispec.drafters.base import Drafter, DraftRequest
from trispec.drafters.model_drafter import MAX_OWN_FEED, ModelDrafter
from trispec.drafters.none import NoDrafter
from trispec.drafters.with_suffix import WithSuffix
from trispec.sampling.graph_sampler import SamplerMode
from trispec.sampling_params import SamplingParams
from trispec.step import SeqStep


@dataclass
class GraphPlan:
    ks: list[int]  # drafts each sequence is verified with (0: a plain step)
    # drafts from the host (a model-free drafter, the suffix side); None: the draft model's, or none
    proposals: list[list[int] | None]
    model: list[bool]  # sequences the draft model's replays run for (fed their proposal if they have one)
    replays: int  # draft-model steps (0: none)
    verify_mode: SamplerMode
    draft_mode: SamplerMode
    catch_up: dict[int, list[int]] = field(default_factory=dict)  # fed to a draft cache eagerly first
    propose_s: float = 0.0  # host time of the model-free proposals


@dataclass(frozen=True)
class Drafters:
    """A runner's drafter as the graph path sees it: the draft model, the model-free side, and the
    ``WithSuffix`` around both (for its counters)."""

    model: ModelDrafter | None = None
    free: Drafter | None = None
    with_suffix: WithSuffix | None = None

    @classmethod
    def of(cls, drafter: Drafter | None) -> Drafters:
        if drafter is None or isinstance(drafter, NoDrafter):
            return cls()
        if isinstance(drafter, ModelDrafter):
            return cls(model=drafter)
        if isinstance(drafter, WithSuffix):
            return cls(model=drafter.model, free=drafter.suffix, with_suffix=drafter)
        return cls(free=drafter)


def sampler_mode(params: Sequence[SamplingParams], vocab_size: int, log_probs: bool = False) -> SamplerMode:
    sampled = [p for p in params if not p.greedy]
    kept = any(0 < p.top_k < vocab_size or p.top_p < 1.0 for p in sampled)
    asked = log_probs and any(p.return_log_probs for p in params)
    return SamplerMode(noise=bool(sampled), kept=kept, log_probs=asked)


def qualifies(s: SeqStep, max_k: int) -> bool:
    sp = s.sampling
    if s.is_prompt_chunk or sp.shapes_logits or sp.samples_by_rejection or sp.guided or sp.top_log_probs:
        return False
    if sp.prediction:  # drafts from the caller's prediction, on the host: eager
        return False
    if not sp.greedy and sp.seed is None:  # the eager path says why
        return False
    return len(s.token_ids) - s.num_computed == 1 and s.num_draft_tokens <= max_k


def plan_round(
    steps: Sequence[SeqStep], drafters: Drafters, *, max_k: int, drafting_off: bool, vocab_size: int
) -> GraphPlan | None:
    """The round's plan, or None when it is not for the graphs."""
    if not all(qualifies(s, max_k) for s in steps):
        return None
    n = len(steps)
    planned = [0 if drafting_off else s.num_draft_tokens for s in steps]
    proposals: list[list[int] | None] = [None] * n
    t0 = time.perf_counter()
    if drafters.free is not None and any(planned):
        drafting = [i for i in range(n) if planned[i]]
        requests = [
            DraftRequest(steps[i].seq_id, steps[i].token_ids, planned[i], steps[i].sampling, None)
            for i in drafting
        ]
        try:
            proposed = drafters.free.propose(requests)
        except Exception:  # the eager path proposes again, and counts the failure
            return None
        for i, proposal in zip(drafting, proposed):
            tokens = proposal.tokens[: planned[i]]
            if drafters.model is None or len(tokens) == planned[i]:  # WithSuffix: full proposals only
                proposals[i] = tokens
    propose_s = time.perf_counter() - t0
    model = [False] * n
    catch_up: dict[int, list[int]] = {}
    replays = 0
    if drafters.model is not None and any(planned[i] and proposals[i] is None for i in range(n)):
        model = [bool(planned[i]) for i in range(n)]  # with the suffix's: fed to the model
        fed = _model_feeds(steps, model, drafters.model, catch_up)
        if fed is None:
            return None
        replays = max(planned[i] for i in range(n) if model[i])
        # blocks for each sequence's own drafts (as on the eager path); a shorter k's surplus steps
        # write past its length, into its last block or the trash block its table is padded with
        lengths = {steps[i].seq_id: len(steps[i].token_ids) + planned[i] - 1 for i in range(n) if model[i]}
        longest = max(len(steps[i].token_ids) for i in range(n) if model[i]) + replays - 1
        if longest > drafters.model.engine.max_context or not drafters.model.room_for(lengths):
            return None  # a surplus step's position past the rope table; or no room
    if drafters.with_suffix is not None:
        own = sum(1 for i in range(n) if planned[i] and proposals[i] is None)
        drafters.with_suffix.num_model_proposals += own
        drafters.with_suffix.num_suffix_proposals += sum(1 for k in planned if k) - own
    ks = [len(p) if p is not None else (planned[i] if model[i] else 0) for i, p in enumerate(proposals)]
    drafting = [steps[i].sampling for i in range(n) if model[i]]
    return GraphPlan(
        ks=ks,
        proposals=proposals,
        model=model,
        replays=replays,
        verify_mode=sampler_mode([s.sampling for s in steps], vocab_size, log_probs=True),
        draft_mode=sampler_mode(drafting, vocab_size),
        catch_up=catch_up,
        propose_s=propose_s,
    )


def _model_feeds(
    steps: Sequence[SeqStep], model: list[bool], drafter: ModelDrafter, catch_up: dict[int, list[int]]
) -> bool | None:
    """Check each replayed sequence's draft cache (a self-draft first takes the target's keys and
    values); one more than 2 tokens behind gets its catch-up. None: the round is not for the graphs."""
    engine = drafter.engine
    for s, replayed in zip(steps, model):
        if not replayed:
            continue
        if s.seq_id not in engine.blocks:  # type: ignore[attr-defined]
            return None
        # a self-draft takes the target's keys and values; else the draft pool's prefix cache
        drafter.catch_up_from_caches(s.seq_id, s.token_ids, own_kv=False)
        feed = s.token_ids[engine.cached_length(s.seq_id) :]
        if not feed or max(feed) >= engine.vocab_size:  # the eager forward refuses such a token
            return None
        if len(feed) > MAX_OWN_FEED:
            catch_up[s.seq_id] = list(feed[:-1])
    return True
