"""Typed errors: every bad input names the field it came from."""

from __future__ import annotations


class InvalidInputError(ValueError):
    """A request or config value is invalid. ``field`` names it (e.g. ``top_p``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class ConfigError(InvalidInputError):
    """The YAML config is invalid; ``field`` is the dotted path of the key (e.g. ``drafter.kind``)."""


class CapacityError(RuntimeError):
    """The KV-cache pool cannot hold what was asked for."""
