"""The servers one client sends to: several replicas of the same model behind their own addresses
(or one address, such as a Kubernetes Service, in front of them all).

A new request goes where its leading text hashes to (or the replicas in turn: ``routing.py``); a
request that cannot reach one (connection refused, a restarting or overloaded server) tries the next
in its order before pausing; a stream cut on one is resumed on the first ready one of the others in
that order, then on it (``routing.resume_order``; ``client.py`` and ``resume.py`` decide when).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

from trispec_client.request import GenerationRequest
from trispec_client.results import StreamChunk
from trispec_client.routing import DEFAULT_PREFIX_CHARS, DEFAULT_ROUTING, Router, Routing


def split_urls(url: str | Sequence[str] | None, default: str) -> list[str]:
    """Addresses from one string (comma-separated allowed) or a list of them; ``default`` if none."""
    given = [url] if url is None or isinstance(url, str) else list(url)
    urls = [part.strip() for item in given if item for part in item.split(",") if part.strip()]
    return urls or [default]


class Replicas:
    """The client's servers, each with what a request to it needs (an HTTP pool; a gRPC address)."""

    def __init__(
        self,
        urls: Sequence[str],
        protocol: str,
        model: str,
        routing: Routing = DEFAULT_ROUTING,
        prefix_chars: int = DEFAULT_PREFIX_CHARS,
    ) -> None:
        if not urls:
            raise ValueError("url: at least one server address is needed")
        self.protocol = protocol
        self.model = model
        self.urls: list[str] = []
        self._pools: list[tuple[Any, str]] = []
        for url in urls:
            if protocol == "http":
                from trispec_client.http_transport import make_pool

                self._pools.append(make_pool(url))
                self.urls.append(url)
            else:
                address = url.removeprefix("grpc://")
                if "://" in address or "/" in address:
                    raise ValueError(f"url: gRPC expects host:port, got {url!r}")
                self.urls.append(address)
        self.router = Router(self.urls, routing, prefix_chars)

    def __len__(self) -> int:
        return len(self.urls)

    def order(self, request: GenerationRequest) -> list[int]:
        """Where a new request goes first, then where it fails over to (``routing.py``)."""
        return self.router.order(request.routing_key, request.cache_salt)

    def attempt(
        self, index: int, request: GenerationRequest, timeout_s: float
    ) -> Generator[StreamChunk, None, None]:
        if self.protocol == "http":
            from trispec_client.http_transport import stream_http

            pool, prefix = self._pools[index]
            return stream_http(pool, prefix, self.model, request, timeout_s)
        # imported here: tritonclient.grpc takes a while to import and HTTP users never need it
        from trispec_client.grpc_transport import stream_grpc

        return stream_grpc(self.urls[index], self.model, request, timeout_s)

    def model_ready(self, index: int, timeout_s: float) -> bool:
        if self.protocol == "http":
            from trispec_client.http_transport import model_ready

            pool, prefix = self._pools[index]
            return model_ready(pool, prefix, self.model, timeout_s)
        from trispec_client.grpc_transport import model_ready as grpc_model_ready

        return grpc_model_ready(self.urls[index], self.model, timeout_s)

    def close(self) -> None:
        for pool, _ in self._pools:
            pool.close()
