"""Typed errors: every bad input names the field it came from."""

from __future__ import annotations


class InvalidInputError(ValueError):
    """A request or config value is invalid. ``field`` names it (e.g. ``top_p``); ``reason`` is the
    refusal's label in metrics (``invalid_input``, ``too_long``, ``unknown_parameter``)."""

    def __init__(self, field: str, message: str, reason: str = "invalid_input") -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.reason = reason


class Overloaded(RuntimeError):
    """A valid request refused for now (``reason``: ``queue_full``, ``queue_timeout``); retrying later
    or elsewhere can succeed."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ConfigError(InvalidInputError):
    """The YAML config is invalid; ``field`` is the dotted path of the key (e.g. ``drafter.kind``)."""


class CapacityError(RuntimeError):
    """The KV-cache pool cannot hold what was asked for."""


class TritonServerError(RuntimeError):
    """tritonserver could not be found, started, or did not become ready."""
