"""The arms of ``specdec-bench-served`` and how a point runs them: every arm gets the same prompts, first
untimed (warm-up), then ``repeats`` timed runs in alternating order (the arms' order, then reversed),
so that a machine growing slower or faster over the point weighs on every arm alike."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from trispec.bench.openai_stream import completion_body, stream_completion
from trispec.bench.served_figures import (
    OFFLINE_PLAIN,
    OFFLINE_SPEC,
    OURS_PLAIN,
    OURS_SPEC,
    PEER_DRAFT,
    PEER_PLAIN,
)
from trispec.bench.served_loop import ArmRun, offline_run, served_run
from trispec.bench.workloads import Workload
from trispec.llm_engine import LLMEngine


class ArmFn(Protocol):
    def __call__(self, prompts: Sequence[list[int]], clients: int, max_tokens: int) -> ArmRun: ...


def served_arm(url: str, model: str, extra: Mapping[str, Any] | None = None) -> ArmFn:
    """An OpenAI endpoint at ``url``: the one client, ``extra`` the arm's own body fields."""

    def run(prompts: Sequence[list[int]], clients: int, max_tokens: int) -> ArmRun:
        def send(prompt: list[int]) -> Any:
            return stream_completion(url, completion_body(model, prompt, max_tokens, extra))

        return served_run(send, prompts, clients, max_tokens)

    return run


def offline_arm(engine: LLMEngine, k: int | None) -> ArmFn:
    """Our engine in this process; ``k`` None: the config's default, 0: plain."""

    def run(prompts: Sequence[list[int]], clients: int, max_tokens: int) -> ArmRun:
        return offline_run(engine, prompts, clients, max_tokens, k)

    return run


def arms(
    ours_url: str, model: str, engine: LLMEngine, peers: Mapping[str, tuple[str, str]]
) -> list[tuple[str, ArmFn]]:
    """Plain arms first, then speculative ones; within each, ours, the peer, offline. ``peers``: arm
    name -> (llama-server's URL, the model name sent)."""
    out: list[tuple[str, ArmFn]] = [(OURS_PLAIN, served_arm(ours_url, model, {"num_draft_tokens": 0}))]
    if PEER_PLAIN in peers:
        out.append((PEER_PLAIN, served_arm(*peers[PEER_PLAIN])))
    out += [(OFFLINE_PLAIN, offline_arm(engine, 0)), (OURS_SPEC, served_arm(ours_url, model))]
    if PEER_DRAFT in peers:
        out.append((PEER_DRAFT, served_arm(*peers[PEER_DRAFT])))
    out.append((OFFLINE_SPEC, offline_arm(engine, None)))
    return out


def run_point(
    arm_fns: Sequence[tuple[str, ArmFn]],
    load: Workload,
    clients: int,
    *,
    repeats: int,
    max_tokens: int,
    warmup_tokens: int,
    note: Callable[[str], None] = lambda _: None,
) -> dict[str, list[ArmRun]]:
    """Each arm on the workload's warm-up prompts (untimed, one client: first requests, an adaptive
    controller's start), then ``repeats`` timed runs of its prompts, in alternating order."""
    for _, run in arm_fns:
        run(load.warmup, 1, min(warmup_tokens, max_tokens))
    runs: dict[str, list[ArmRun]] = {name: [] for name, _ in arm_fns}
    for repeat in range(repeats):
        for name, run in arm_fns if repeat % 2 == 0 else arm_fns[::-1]:
            result = run(load.prompts, clients, max_tokens)
            runs[name].append(result)
            where = f"{load.name} clients {clients} repeat {repeat + 1}/{repeats}"
            note(f"{where}: {name} {result.tok_s:.1f} tok/s")
    return runs
