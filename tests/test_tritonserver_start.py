"""The real tritonserver started by specdec-serve's TritonServer with the tiny test models: it serves an
infer and stops cleanly, a system tritonserver root is used when named, and a failed start reports
the log and is not retried (the supervisor gives up when restarts keep failing).
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from served import wait_for
from tiny_triton import add_broken_model, run_in_thread, shm_files
from trispec.serving.supervisor import Supervisor, SupervisorPolicy
from trispec.serving.tritonserver import (
    SERVER_ROOT_ENV,
    ServerOptions,
    TritonInstallation,
    TritonServer,
    TritonServerError,
)


@pytest.mark.server
def test_server_serves_an_infer_and_stops_cleanly(options: ServerOptions) -> None:
    import tritonclient.http as httpclient

    server = TritonServer(options)
    server.start()
    try:
        assert server.wait_ready(60)
        # ready means scrapeable too: Triton's metrics service starts after its HTTP one
        with urllib.request.urlopen(server.metrics_url, timeout=5) as metrics:
            assert metrics.status == 200 and b"nv_inference_count" in metrics.read()
        stubs = server.stubs()
        assert sorted(s.instance for s in stubs) == ["echo_0_0", "stream_0_0"]
        assert shm_files(server.shm_prefix), "the Python backend should use the launch's shm prefix"
        client = httpclient.InferenceServerClient(f"127.0.0.1:{options.http_port}", network_timeout=10)
        values = np.array([1.5, -2.0, 3.25], dtype=np.float32)
        infer_input = httpclient.InferInput("IN", list(values.shape), "FP32")
        infer_input.set_data_from_numpy(values)
        result = client.infer("echo", [infer_input])
        np.testing.assert_array_equal(result.as_numpy("OUT"), values)
        client.close()
    finally:
        code = server.stop()
    assert code == 0, "SIGTERM should end tritonserver cleanly"
    assert shm_files(server.shm_prefix) == []
    assert not any(s.is_alive() for s in stubs)
    assert not server.is_ready()


def system_root_like(install: TritonInstallation, root: Path) -> Path:
    """An install tree shaped like NVIDIA's /opt/tritonserver, made of links into the wheel."""
    (root / "bin").mkdir(parents=True)
    (root / "backends" / "python").mkdir(parents=True)
    (root / "bin" / "tritonserver").symlink_to(install.binary)
    for source in (
        install.python_backend / "libtriton_python.so",
        install.python_backend / "triton_python_backend_utils.py",
        install.stub,
    ):
        (root / "backends" / "python" / source.name).symlink_to(source)
    (root / "lib").symlink_to(install.libs)
    return root


def test_a_system_tritonserver_root_is_used_when_named(
    install: TritonInstallation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = system_root_like(install, tmp_path / "opt-tritonserver")
    monkeypatch.setenv(SERVER_ROOT_ENV, str(root))
    found = TritonInstallation.locate()
    assert (
        found.binary == root / "bin/tritonserver"
        and found.stub == root / "backends/python" / install.stub.name
    )
    assert found.libs == root / "lib"
    monkeypatch.setenv(SERVER_ROOT_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(TritonServerError, match="SPECDEC_TRITONSERVER_ROOT"):
        TritonInstallation.locate()


@pytest.mark.server
def test_server_from_a_system_root_serves(
    install: TritonInstallation, options: ServerOptions, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tritonclient.http as httpclient

    monkeypatch.setenv(SERVER_ROOT_ENV, str(system_root_like(install, tmp_path / "root")))
    server = TritonServer(options)
    assert server.install.binary.parent.parent == tmp_path / "root"
    server.start()
    try:
        assert server.wait_ready(60)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{options.http_port}", network_timeout=10)
        assert client.is_model_ready("echo")
        client.close()
    finally:
        assert server.stop() == 0


@pytest.mark.server
def test_a_failed_start_reports_the_log_and_is_not_retried(options: ServerOptions) -> None:
    add_broken_model(options.model_repository)
    server = TritonServer(options)
    server.start()
    try:
        with pytest.raises(TritonServerError, match=r"(?s)exited with code .* before ready:.*no weights"):
            server.wait_ready(60)
    finally:
        server.stop()
    assert shm_files(server.shm_prefix) == []

    started = time.monotonic()
    assert Supervisor(options, SupervisorPolicy(ready_timeout_s=60)).run() == 1
    assert time.monotonic() - started < 15, "a broken first start should fail at once"


@pytest.mark.server
def test_supervisor_gives_up_when_restarts_keep_failing(options: ServerOptions) -> None:
    policy = SupervisorPolicy(ready_timeout_s=60, max_start_failures=2, backoff_initial_s=0.2)
    supervisor = Supervisor(options, policy)
    thread, codes = run_in_thread(supervisor)
    try:
        wait_for(supervisor.ready.is_set, 60, "the first server to be ready")
        first = supervisor.server
        assert first is not None and first.pid is not None
        add_broken_model(options.model_repository)  # from now on every start fails
        os.kill(first.pid, signal.SIGKILL)
        thread.join(timeout=60)
    finally:
        supervisor.stop()
        thread.join(timeout=30)
    assert codes == [1]
    assert supervisor.restarts == 1
    assert not supervisor.ready.is_set()
