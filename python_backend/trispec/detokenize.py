"""Streaming text out of verified tokens: incremental detokenizing and stop strings.

Speculative decoding accepts several tokens per step, a character may span tokens (byte-level BPE
splits emoji and CJK into byte tokens), and a stop string may span steps. These pieces never emit a
broken character, never emit text twice, and never emit anything at or after a stop string.
Pure Python on top of ``decode``; no model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from trispec.errors import InvalidInputError

REPLACEMENT = "\ufffd"  # what a lossy UTF-8 decode puts where a character is incomplete


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    """Turns token ids, pushed as they are verified, into finished text.

    Each push decodes a window of recent ids: the ids since the last clean character boundary,
    preceded as context by the ids of the boundary before it (sentencepiece-style decoders treat the
    first token of a string differently). Text ending in U+FFFD may be an incomplete character, so
    it is held until a later token completes it (or ``flush``). The pieces concatenate to
    ``decode(all ids)``.
    """

    def __init__(self, tokenizer: Decoder, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # window start: context ids whose text was emitted already
        self._read = 0  # last clean boundary: text of ids before it was all emitted
        self._emitted = 0  # chars of decode(ids[prefix:]) already emitted

    def _window_text(self) -> str:
        return self._tokenizer.decode(self._ids[self._prefix :], skip_special_tokens=self._skip)

    def push(self, ids: Iterable[int]) -> str:
        """Add ids; return the text they finish (possibly empty)."""
        self._ids.extend(ids)
        text = self._window_text()
        stable = text.rstrip(REPLACEMENT)
        new = stable[self._emitted :]
        if len(stable) == len(text):
            # clean boundary: slide the window so each push decodes only a few tokens
            self._prefix, self._read = self._read, len(self._ids)
            self._emitted = len(self._window_text())
        else:
            self._emitted = max(self._emitted, len(stable))
        return new

    def flush(self) -> str:
        """Whatever is held back (an incomplete character decodes as U+FFFD) at end of generation."""
        text = self._window_text()
        new = text[self._emitted :]
        self._prefix = self._read = len(self._ids)
        self._emitted = 0
        return new


def _validate_stops(stop_strings: Sequence[str]) -> tuple[str, ...]:
    if isinstance(stop_strings, str):
        raise InvalidInputError("stop", "must be a list of strings, not a single string")
    stops = tuple(stop_strings)
    for s in stops:
        if not isinstance(s, str) or s == "":
            raise InvalidInputError("stop", f"stop strings must be non-empty strings, got {s!r}")
    return stops


@dataclass(frozen=True)
class StopCheck:
    """Where ``text`` stands against the stop strings."""

    stopped: bool
    keep_len: int  # chars that are final output: everything before the earliest stop string
    safe_len: int  # chars that may be emitted now (a tail that could start a stop is held back)


class StopMatcher:
    """Finds the earliest stop string in generated text, across token and step boundaries.

    Use ``check(text)`` on the whole text so far, or ``push(piece)`` per step (it keeps the held-back
    tail itself), then ``finish()`` when generation ends without a stop.
    """

    def __init__(self, stop_strings: Sequence[str]) -> None:
        self.stops = _validate_stops(stop_strings)
        # proper prefixes of stop strings: a text ending in one of these might be a stop in the making
        self._prefixes = {s[:k] for s in self.stops for k in range(1, len(s))}
        self._max_hold = max((len(s) - 1 for s in self.stops), default=0)
        self._held = ""
        self.stopped = False

    def find(self, text: str) -> int | None:
        """Index of the earliest stop string in ``text``, or None."""
        found = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        return min(found) if found else None

    def _hold_len(self, text: str) -> int:
        for k in range(min(self._max_hold, len(text)), 0, -1):
            if text[-k:] in self._prefixes:
                return k
        return 0

    def check(self, text: str) -> StopCheck:
        index = self.find(text)
        if index is not None:
            return StopCheck(True, index, index)
        return StopCheck(False, len(text), len(text) - self._hold_len(text))

    def push(self, piece: str) -> str:
        """Feed newly finalised text; return what may be emitted now ('' once stopped)."""
        if self.stopped:
            return ""
        # a stop completed by ``piece`` starts inside held text or piece: held is the longest tail
        # that is a prefix of some stop, so an earlier start is impossible
        buf = self._held + piece
        result = self.check(buf)
        self.stopped = result.stopped
        self._held = "" if result.stopped else buf[result.safe_len :]
        return buf[: result.safe_len]

    def finish(self) -> str:
        """Generation ended without a stop: the held tail was never a stop, release it."""
        held = "" if self.stopped else self._held
        self._held = ""
        return held


class StepText(NamedTuple):
    """What one step's tokens gave: ``kept`` of them count (the rest come after a stop)."""

    kept: int
    text: str
    stopped: bool


class StopTextTracker:
    """Per-request text state: detokenizer + stop matcher, fed the tokens each step accepted."""

    def __init__(
        self, tokenizer: Decoder, stop: Sequence[str] = (), skip_special_tokens: bool = True
    ) -> None:
        self.detok = IncrementalDetokenizer(tokenizer, skip_special_tokens)
        self.matcher = StopMatcher(stop)

    @property
    def stopped(self) -> bool:
        return self.matcher.stopped

    def push(self, new_ids: Sequence[int]) -> StepText:
        """Feed one step's accepted ids (eos excluded). If a stop string completes, ``kept`` is the
        number of ids up to and including the one that completed it; later ids must be dropped."""
        if self.stopped:
            return StepText(0, "", True)
        if not self.matcher.stops:  # nothing to pin to a token: decode the step in one go
            return StepText(len(new_ids), self.detok.push(new_ids), False)
        out: list[str] = []
        for n, token in enumerate(new_ids, start=1):
            # one id at a time: the stop must be pinned to the token that completes it
            out.append(self.matcher.push(self.detok.push((token,))))
            if self.matcher.stopped:
                return StepText(n, "".join(out), True)
        return StepText(len(new_ids), "".join(out), False)

    def finish(self) -> str:
        """End of generation (eos, length, cancel): release held-back text, still honouring stops."""
        if self.stopped:
            return ""
        text = self.matcher.push(self.detok.flush())
        return text + self.matcher.finish()
