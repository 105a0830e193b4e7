"""Client library and CLI for the specdec model on Triton (gRPC and HTTP)."""

from trispec_client.client import DEFAULT_RETRIES, DEFAULT_TIMEOUT_S, DEFAULT_URLS, SpecDecClient
from trispec_client.errors import (
    InvalidRequestError,
    SpecDecConnectionError,
    SpecDecError,
    SpecDecOverloadedError,
    SpecDecResumeError,
    SpecDecTimeoutError,
)
from trispec_client.request import GenerationRequest
from trispec_client.results import Completion, SpeculationStats, StreamChunk

__all__ = [
    "DEFAULT_RETRIES",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_URLS",
    "Completion",
    "GenerationRequest",
    "InvalidRequestError",
    "SpecDecClient",
    "SpecDecConnectionError",
    "SpecDecError",
    "SpecDecOverloadedError",
    "SpecDecResumeError",
    "SpecDecTimeoutError",
    "SpeculationStats",
    "StreamChunk",
]
