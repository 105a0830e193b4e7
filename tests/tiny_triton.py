"""The real tritonserver (from the nvidia-pytriton wheel) with the tiny Python-backend models in
``tests/triton_models`` (``echo``: one response; ``stream``: decoupled, COUNT responses DELAY_S
apart), for the tests of specdec-serve's process handling and supervisor: the fixtures (a copy of
the repository, server options on free ports; registered for every test by ``conftest.py``) and
helpers that open streams and run a supervisor.
"""

from __future__ import annotations

import contextlib
import queue
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from served import free_ports, wait_for
from trispec.serving.supervisor import Supervisor, SupervisorPolicy
from trispec.serving.tritonserver import (
    SHM_DIR,
    ServerOptions,
    TritonInstallation,
)

MODELS = Path(__file__).parent / "triton_models"


def shm_files(prefix: str) -> list[Path]:
    return sorted(SHM_DIR.glob(f"{prefix}*"))


@pytest.fixture(scope="module")
def install() -> TritonInstallation:
    return TritonInstallation.locate()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    # a copy: the stubs may write __pycache__ beside model.py
    return Path(shutil.copytree(MODELS, tmp_path / "repo"))


@pytest.fixture
def options(repo: Path, tmp_path: Path) -> ServerOptions:
    http, grpc, metrics = free_ports()
    return ServerOptions(
        model_repository=repo,
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        # the default: with less, a busy machine may not unload in time and Triton exits with 1
        exit_timeout_s=5,
        log_file=tmp_path / "server.log",
    )


def add_broken_model(repository: Path) -> None:
    """A model whose initialize() raises: tritonserver then exits at start-up."""
    version_dir = repository / "broken" / "1"
    version_dir.mkdir(parents=True)
    echo_config = (repository / "echo" / "config.pbtxt").read_text()
    (version_dir.parent / "config.pbtxt").write_text(echo_config.replace('"echo"', '"broken"'))
    (version_dir / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        raise RuntimeError('no weights here')\n"
    )


def run_in_thread(supervisor: Supervisor) -> tuple[threading.Thread, list[int]]:
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(supervisor.run()), daemon=True)
    thread.start()
    return thread, codes


def _stream_request(client: Any, count: int, delay_s: float) -> None:
    import tritonclient.grpc as grpcclient

    inputs = [grpcclient.InferInput("COUNT", [1], "INT32"), grpcclient.InferInput("DELAY_S", [1], "FP32")]
    inputs[0].set_data_from_numpy(np.array([count], dtype=np.int32))
    inputs[1].set_data_from_numpy(np.array([delay_s], dtype=np.float32))
    client.async_stream_infer("stream", inputs, enable_empty_final_response=True)


def _open_stream(port: int) -> tuple[Any, queue.Queue]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    responses: queue.Queue = queue.Queue()
    # stream_timeout: the client-side deadline, so a dead server can never hang this test
    client.start_stream(lambda result, error: responses.put((result, error)), stream_timeout=30)
    return client, responses


@contextlib.contextmanager
def supervise(options: ServerOptions, policy: SupervisorPolicy) -> Iterator[Supervisor]:
    """A supervisor serving in a thread, once ready; stopped (and its shm files checked) after."""
    prefixes: list[str] = []
    supervisor = Supervisor(
        options, policy, on_ready=lambda server, _restarts: prefixes.append(server.shm_prefix)
    )
    thread, codes = run_in_thread(supervisor)
    try:
        wait_for(supervisor.ready.is_set, 60, "the first server to be ready")
        yield supervisor
    finally:
        supervisor.stop()
        thread.join(timeout=30)
    assert not thread.is_alive(), "the supervisor did not stop"
    assert codes == [0]
    for prefix in prefixes:
        assert shm_files(prefix) == [], f"shm files of {prefix} were left behind"


@pytest.fixture
def supervised(options: ServerOptions) -> Iterator[Supervisor]:
    # quick to call a hung server unhealthy, so the test stays short
    with supervise(
        options, SupervisorPolicy(ready_timeout_s=60, probe_timeout_s=0.5, readiness_failures=2)
    ) as sup:
        yield sup


def _collect(responses: queue.Queue, timeout_s: float) -> tuple[list[int], Exception | None]:
    """A ``stream`` request's INDEX values up to its final response, or up to an error (returned)."""
    indices: list[int] = []
    while True:
        result, error = responses.get(timeout=timeout_s)
        if error is not None:
            return indices, error
        if result.get_response().parameters["triton_final_response"].bool_param:
            return indices, None
        indices.append(int(result.as_numpy("INDEX")[0]))
