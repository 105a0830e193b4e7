"""specdec-soak: a bounded soak and fault run against a specdec server (the phases and exit codes:
``cli.py``'s docstring, which is also ``--help``)."""

from trispec_client.soak.cli import (
    DEFAULT_PHASES,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    PHASES,
    PROG,
    SHORT,
    build_parser,
    main,
    settings_from,
)
from trispec_client.soak.context import Settings, Soak
from trispec_client.soak.memory import memory_checks
from trispec_client.soak.report import Check, Outcome, Report, render
from trispec_client.soak.stream import NEVER_END_ID, PROMPTS, REFUSAL, is_refusal, pct, run_stream
from trispec_client.soak.target import (
    STUB_NAME,
    RssSampler,
    Server,
    find_stub,
    is_loopback,
    split_host_port,
)

__all__ = [
    "DEFAULT_PHASES",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "NEVER_END_ID",
    "PHASES",
    "PROG",
    "PROMPTS",
    "REFUSAL",
    "SHORT",
    "STUB_NAME",
    "Check",
    "Outcome",
    "Report",
    "RssSampler",
    "Server",
    "Settings",
    "Soak",
    "build_parser",
    "find_stub",
    "is_loopback",
    "is_refusal",
    "main",
    "memory_checks",
    "pct",
    "render",
    "run_stream",
    "settings_from",
    "split_host_port",
]
