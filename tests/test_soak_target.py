"""The soak's look for a local replica (``trispec_client.soak.target``) on real processes: a
``specdec-serve`` between two tritonservers is waited for, a port nothing local serves is not."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from trispec_client.soak.target import find_launcher, find_server, wait_for_server

PORT = 1  # never a tritonserver's: nothing here listens on it


@pytest.fixture
def launcher() -> Iterator[subprocess.Popen[bytes]]:
    """A process whose command line reads as a ``specdec-serve`` on ``PORT``, with no tritonserver."""
    script = "import time; time.sleep(60)"
    process = subprocess.Popen(
        [
            "bash",
            "-c",
            f'exec -a /venv/bin/specdec-serve "$0" -c "{script}" --grpc-port {PORT}',
            sys.executable,
        ]
    )
    try:
        deadline = time.monotonic() + 10
        while find_launcher([PORT]) != process.pid:
            assert time.monotonic() < deadline, "the launcher never showed"
            time.sleep(0.05)
        yield process
    finally:
        process.kill()
        process.wait()


def test_no_launcher_no_wait() -> None:
    start = time.monotonic()
    assert find_server([PORT]) is None and find_launcher([PORT]) is None
    assert wait_for_server([PORT], "127.0.0.1:1", timeout_s=30) is None
    assert time.monotonic() - start < 5


def test_a_launcher_without_its_server_is_waited_for_until_the_timeout(
    launcher: subprocess.Popen[bytes],
) -> None:
    assert find_launcher([PORT + 1]) is None  # the port must be the one named
    start = time.monotonic()
    assert wait_for_server([PORT], "127.0.0.1:1", timeout_s=1.5) is None
    assert time.monotonic() - start >= 1.5
