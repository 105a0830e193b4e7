"""Which replica a new request goes to first, and where it fails over to.

``prefix`` (the default): rendezvous (highest-random-weight) hashing of the request's leading text
and its cache salt. Requests that begin with the same ``prefix_chars`` characters (a conversation's
turns, an agent resending its context) go to the same replica, whose prefix cache holds their KV; any
client computes the same order for the same request without sharing state, and when a replica
leaves only the requests it ranked first move. The order continues with the other replicas by score,
which is where the request fails over to, and where a stream cut on its replica resumes
(``resume_order``): the replica with the next-highest weight for its key, the one any client would
pick once that replica is gone, so its next turns find the KV the resumed stream left there.
``round-robin``: new requests take the replicas in turn.

The trade-off: requests sharing their first ``prefix_chars`` characters all go to one replica (per
cache salt). A system prompt longer than that, shared by every user, puts them all on one replica:
raise ``prefix_chars`` past it (a conversation then keeps its replica from the turn its prompt
reaches ``prefix_chars``), or route round-robin.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import Sequence
from typing import Literal

Routing = Literal["prefix", "round-robin"]
ROUTINGS: tuple[Routing, ...] = ("prefix", "round-robin")
DEFAULT_ROUTING: Routing = "prefix"
# about 256 tokens of English text: long enough to tell conversations apart, short enough that a
# conversation's second turn shares it with its first
DEFAULT_PREFIX_CHARS = 1024


def prefix_key(prompt: str, cache_salt: str | None = None, prefix_chars: int = DEFAULT_PREFIX_CHARS) -> bytes:
    """What places a request: its salt and its first ``prefix_chars`` characters."""
    salt = (cache_salt or "").encode("utf-8")
    head = prompt[:prefix_chars].encode("utf-8")
    return hashlib.sha256(len(salt).to_bytes(4, "little") + salt + head).digest()


def rendezvous_order(key: bytes, urls: Sequence[str]) -> list[int]:
    """Replica indices by descending weight ``sha256(key, url)``: the first is the request's home."""
    weights = [hashlib.sha256(key + b"\0" + url.encode("utf-8")).digest() for url in urls]
    return sorted(range(len(urls)), key=lambda i: weights[i], reverse=True)


def resume_order(order: Sequence[int], cut_on: int) -> list[int]:
    """Where a stream cut on replica ``cut_on`` looks for a ready replica: the request's own order
    (``Router.order``: by rendezvous weight, or its round-robin turn) without ``cut_on``, then
    ``cut_on`` itself (it may come back first: the supervisor restarts its server)."""
    return [index for index in order if index != cut_on] + [cut_on]


class Router:
    """The order in which a new request tries the replicas ``urls``."""

    def __init__(
        self,
        urls: Sequence[str],
        routing: Routing = DEFAULT_ROUTING,
        prefix_chars: int = DEFAULT_PREFIX_CHARS,
    ) -> None:
        if routing not in ROUTINGS:
            raise ValueError(f"routing: must be one of {', '.join(ROUTINGS)}, got {routing!r}")
        if prefix_chars < 1:
            raise ValueError(f"prefix_chars: must be >= 1, got {prefix_chars}")
        self.urls = list(urls)
        self.routing = routing
        self.prefix_chars = prefix_chars
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def order(self, prompt: str, cache_salt: str | None = None) -> list[int]:
        """Every replica once: where the request goes first, then where it fails over to."""
        n = len(self.urls)
        if self.routing == "prefix":
            return rendezvous_order(prefix_key(prompt, cache_salt, self.prefix_chars), self.urls)
        with self._lock:
            start = next(self._turn) % n
        return [(start + i) % n for i in range(n)]
