"""``specdec-soak --short`` against the real tritonserver started by ``specdec-serve`` (the e2e fixture):
every phase passes on a healthy server, and a failing check turns the exit status to 1."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
from e2e_server import e2e_server_in
from served import BIN, Server
from trispec_client import soak

pytestmark = [pytest.mark.server, pytest.mark.real_model]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server of this file's own, as the end-to-end files' (``e2e_server_in``)."""
    with e2e_server_in(tmp_path_factory) as srv:
        yield srv


def run_soak(srv: Server, *args: str, timeout_s: float = 600) -> tuple[int, dict[str, object], str]:
    command = [str(BIN / "specdec-soak"), "--url", srv.grpc, "--http-url", srv.http]
    command += ["--metrics-url", srv.metrics, "--json", *args]
    run = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    return run.returncode, json.loads(run.stdout), run.stderr


def failed(report: dict[str, object]) -> list[dict[str, object]]:
    return [c for c in report["checks"] if c["passed"] is False]  # type: ignore[union-attr,index]


def test_short_soak_passes_on_a_healthy_server(server: Server) -> None:
    code, report, stderr = run_soak(server, "--short")
    assert code == 0 and report["passed"], (failed(report), stderr[-2000:])
    phases = {c["phase"] for c in report["checks"]}  # type: ignore[union-attr,index]
    assert {"mixed", "cancel", "overload", "bad", "memory"} <= phases
    figures = report["figures"]
    assert figures["mixed"]["outcomes"] == {"completed": figures["mixed"]["requests"]}  # type: ignore[index]
    # the stub was found under the server on these ports and sampled, not skipped
    assert figures["memory"]["samples"] > 10  # type: ignore[index]
    assert server.ready()


def test_a_failing_check_fails_the_run(server: Server) -> None:
    # the same phase with a first-token bound no server meets: the check and the exit status say so
    code, report, _ = run_soak(
        server, "--phases", "overload", "--burst", "2", "--burst-max-tokens", "4",
        "--small-after-s", "0", "--max-small-ttft-s", "0.000001",
    )  # fmt: skip
    assert code == 1 and report["passed"] is False
    assert [c["name"] for c in failed(report)] == ["small request (8 tokens, sent 0 s in): first token"]
    code, report, _ = run_soak(server, "--phases", "overload", "--burst", "2", "--burst-max-tokens", "4")
    assert code == 0 and report["passed"], failed(report)


def test_refuses_hosts_that_are_not_loopback() -> None:
    # nothing is contacted: the address is refused before any request
    assert soak.main(["--url", "192.0.2.1:8001"]) == soak.EXIT_USAGE
    assert soak.is_loopback("localhost") and soak.is_loopback("127.0.0.1") and soak.is_loopback("::1")
    assert not soak.is_loopback("192.0.2.1")
