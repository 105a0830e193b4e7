"""What comes back: typed stream chunks and completions, built from the model's output tensors."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

_STAT_FIELDS = (
    "draft_tokens",
    "accepted_tokens",
    "verify_rounds",
    "acceptance_rate",
    "mean_accepted_length",
    "mean_num_draft_tokens",
)


@dataclass(frozen=True)
class SpeculationStats:
    """Whole-request totals from the final response."""

    draft_tokens: int
    accepted_tokens: int
    verify_rounds: int
    acceptance_rate: float
    mean_accepted_length: float
    # the mean k planned per round: adaptive speculation's choice (0.0 from servers without it)
    mean_num_draft_tokens: float = 0.0
    # times the stream was cut by the server and resumed by this client (trispec_client.resume)
    resumed: int = 0


@dataclass(frozen=True)
class StreamChunk:
    """One response. ``text`` is what this response adds; ``token_count`` is cumulative.
    The final chunk (``final=True``) carries ``finish_reason`` and ``stats`` when the server sent them."""

    text: str
    token_count: int
    final: bool = False
    finish_reason: str | None = None
    stats: SpeculationStats | None = None
    # the seed a sampled request draws with (the server's choice when it had none): on its first response
    seed: int | None = None
    # a resumed request's first response: the SHA-256 (hex) of the text of the tokens it skipped
    skipped_text_sha256: str | None = None
    # first response: what produces the text (servers from before it send none); a stream resumes
    # only on a replica with the same
    model_fingerprint: str | None = None
    # final response: prompt tokens the server's prefix cache held (not computed again)
    cached_tokens: int | None = None


@dataclass(frozen=True)
class Completion:
    """A whole request: the text, tokens generated, why it stopped, and the speculation totals."""

    text: str
    token_count: int
    finish_reason: str | None
    stats: SpeculationStats | None
    # the seed a sampled request drew with (None: greedy); send it again to get the same text
    seed: int | None = None
    # the model fingerprint of the replica(s) that produced it
    model_fingerprint: str | None = None
    # prompt tokens taken from the server's prefix cache (None: the server did not say)
    cached_tokens: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def chunk_from_outputs(
    outputs: Mapping[str, Any], *, final: bool, previous_token_count: int = 0
) -> StreamChunk:
    """One chunk from a response's outputs: numpy arrays (gRPC, shape [1, 1]) or JSON scalars (HTTP SSE).

    An empty final response (flags only) keeps the previous token count and has no text.
    """
    text = _scalar(outputs.get("text_output"))
    count = _scalar(outputs.get("output_token_count"))
    reason = _scalar(outputs.get("finish_reason"))
    seed = _scalar(outputs.get("sampling_seed"))
    skipped = _scalar(outputs.get("skipped_text_sha256"))
    fingerprint = _scalar(outputs.get("model_fingerprint"))
    cached = _scalar(outputs.get("cached_tokens"))
    stats = None
    if any(outputs.get(name) is not None for name in _STAT_FIELDS):
        # a partial set still yields stats; missing totals read as 0 rather than hiding the others
        values = {name: _scalar(outputs.get(name)) for name in _STAT_FIELDS}
        stats = SpeculationStats(
            draft_tokens=int(values["draft_tokens"] or 0),
            accepted_tokens=int(values["accepted_tokens"] or 0),
            verify_rounds=int(values["verify_rounds"] or 0),
            acceptance_rate=float(values["acceptance_rate"] or 0.0),
            mean_accepted_length=float(values["mean_accepted_length"] or 0.0),
            mean_num_draft_tokens=float(values["mean_num_draft_tokens"] or 0.0),
        )
    return StreamChunk(
        text="" if text is None else _text(text),
        token_count=previous_token_count if count is None else int(count),
        final=final,
        finish_reason=None if reason is None else _text(reason),
        stats=stats,
        seed=None if seed is None else int(seed),
        skipped_text_sha256=None if skipped is None else _text(skipped),
        model_fingerprint=None if fingerprint is None else _text(fingerprint),
        cached_tokens=None if cached is None else int(cached),
    )


def collect(chunks: Iterable[StreamChunk]) -> Completion:
    """Join a stream's chunks into a completion (the final chunk's reason and stats)."""
    parts: list[str] = []
    last: StreamChunk | None = None
    seed = fingerprint = cached = None
    for chunk in chunks:
        parts.append(chunk.text)
        last = chunk
        seed = chunk.seed if seed is None else seed
        fingerprint = chunk.model_fingerprint if fingerprint is None else fingerprint
        cached = chunk.cached_tokens if chunk.cached_tokens is not None else cached
    if last is None:
        return Completion(text="", token_count=0, finish_reason=None, stats=None)
    return Completion(
        "".join(parts), last.token_count, last.finish_reason, last.stats, seed, fingerprint, cached
    )


def _scalar(value: Any) -> Any:
    """The single element of a [1, 1] tensor (or a JSON scalar as is); None when absent."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        flat = value.reshape(-1)
        if flat.size == 0:
            return None
        item = flat[0]
        return item.item() if isinstance(item, np.generic) else item
    if isinstance(value, list):
        return value[0] if value else None
    return value


def _text(value: Any) -> str:
    # the server sends whole UTF-8 characters; replace rather than fail on anything else
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
