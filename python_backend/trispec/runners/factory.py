"""One place that picks the runner for a config (``engine.kind``)."""

from __future__ import annotations

from trispec.config import SpecDecConfig
from trispec.errors import ConfigError
from trispec.runners.base import SpecRunner


def build_runner(config: SpecDecConfig) -> SpecRunner:
    kind = config.engine.kind
    if kind == "torch":
        from trispec.runners.torch_runner import TorchSpecRunner

        return TorchSpecRunner.from_config(config)
    if kind == "trtllm":
        from trispec.runners.trtllm_setup import start_runner

        return start_runner(config)
    raise ConfigError("engine.kind", f"unknown engine kind {kind!r}")
