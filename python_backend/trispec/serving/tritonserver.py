"""One tritonserver process: the bundled binary, its backend directory, environment, start, stop.

The server comes from the ``nvidia-pytriton`` wheel (located, never imported). Facts this relies on
(see ``/work/shared/notes/triton-on-cpu.md``): the Python backend needs a backend directory of its
own holding the stub for the running Python; the stub finds ``libpython`` via ``LD_LIBRARY_PATH`` and
its prefix via ``PATH``; a crashed stub is never restarted by Triton 2.51 (that is the supervisor's
job, see ``supervisor.py``), and a stub stalled for over a second while a request arrives makes
Triton give up on that request and the stub then crash (see ``StubHealthFlag``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from trispec.errors import TritonServerError
from trispec.serving.shm import (
    SHM_DIR,
    SHM_PREFIX_ROOT,
    remove_shm,
    remove_stale_shm,
    restrict_shm,
    shm_prefix,
)
from trispec.serving.stubs import (
    StubHealthFlag,
    StubProcess,
    find_stubs,
    process_start_time,
)
from trispec.serving.triton_command import (
    ADMIN_APIS,
    ADMIN_KEY_DIGEST_ENV,
    ADMIN_KEY_HEADER,
    GRPC_HEADER_PREFIX,
    ServerOptions,
    admin_key_digest,
    build_command,
    is_ready,
    probe_host,
    restricted_api_flags,
)
from trispec.serving.triton_install import (
    SERVER_ROOT_ENV,
    STUB_NAME,
    TritonInstallation,
    prepare_backend_directory,
    server_environment,
)

# re-exported: this module held them all before they moved by job
__all__ = [
    "ADMIN_APIS",
    "ADMIN_KEY_HEADER",
    "GRPC_HEADER_PREFIX",
    "HEARTBEAT_DIR_ENV",
    "SERVER_ROOT_ENV",
    "SHM_DIR",
    "SHM_PREFIX_ROOT",
    "STUB_NAME",
    "ServerOptions",
    "StubHealthFlag",
    "StubProcess",
    "TritonInstallation",
    "TritonServer",
    "TritonServerError",
    "build_command",
    "find_stubs",
    "is_ready",
    "prepare_backend_directory",
    "probe_host",
    "process_start_time",
    "remove_shm",
    "remove_stale_shm",
    "restrict_shm",
    "restricted_api_flags",
    "server_environment",
    "shm_prefix",
]

log = logging.getLogger(__name__)

# the directory, passed to the stubs in their environment, where each serving loop renews its heartbeat
# file (named after its model instance, e.g. specdec_0_0); the supervisor watches them
HEARTBEAT_DIR_ENV = "SPECDEC_HEARTBEAT_DIR"
# logged as an error at every start on a machine without a GPU; harmless
_NOISE = "CudaDriverHelper has not been initialized"


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the launching thread dies (PR_SET_DEATHSIG), so a
    launcher killed with -9 leaves no server holding its ports."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_DEATHSIG


class TritonServer:
    """One tritonserver process, in its own session and process group.

    ``start()`` launches it, ``wait_ready()`` polls ``/v2/health/ready``, ``stop()`` ends it and its
    stubs and removes its shm files. Not restartable: the supervisor makes a new one each time.
    """

    def __init__(self, options: ServerOptions, install: TritonInstallation | None = None) -> None:
        self.options = options
        self.install = install or TritonInstallation.locate()
        self.shm_prefix = shm_prefix()
        self.ready_url = f"http://{probe_host(options.host)}:{options.http_port}/v2/health/ready"
        # Triton starts its metrics service after the HTTP one (~40 ms later, seen under load): a
        # client told "ready" may scrape at once
        self.metrics_url = f"http://{probe_host(options.host)}:{options.metrics_port}/metrics"
        self._process: subprocess.Popen[bytes] | None = None
        self._backend_dir: Path | None = None
        # each serving loop's heartbeat file is here (see HEARTBEAT_DIR_ENV); made by start()
        self.heartbeat_dir: Path | None = None
        self._log: IO[bytes] | None = None
        self._log_offset = 0
        self._stopped = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        if self._process is not None:
            raise TritonServerError("this TritonServer was already started")
        if not self.options.model_repository.is_dir():
            raise TritonServerError(f"model repository {self.options.model_repository} is not a directory")
        self._backend_dir = prepare_backend_directory(
            Path(tempfile.mkdtemp(prefix="specdec-backends-")), self.install
        )
        self.heartbeat_dir = Path(tempfile.mkdtemp(prefix="specdec-heartbeat-"))
        command = build_command(self.install, self.options, self._backend_dir, self.shm_prefix)
        if self.options.log_file is not None:
            self.options.log_file.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.options.log_file.open("ab")
            self._log_offset = self._log.tell()
        log.debug("starting %s", " ".join(command))
        try:
            self._process = subprocess.Popen(
                command,
                env={
                    **server_environment(self.install),
                    HEARTBEAT_DIR_ENV: str(self.heartbeat_dir),
                    # what the model checks an operator's reset against (serving/admin.py)
                    ADMIN_KEY_DIGEST_ENV: admin_key_digest(self.options.admin_key),
                },
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT if self._log is not None else None,
                # own session: Ctrl-C in a terminal reaches the launcher only, and stop() can kill the
                # whole group (server and stubs) at once
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            self._release_files()
            raise TritonServerError(f"cannot run {command[0]}: {exc}") from None

    def poll(self) -> int | None:
        """The exit code if the server process has exited, else None."""
        return self._process.poll() if self._process is not None else None

    def is_ready(self, timeout_s: float = 1.0) -> bool:
        return is_ready(self.ready_url, timeout_s)

    def wait_ready(self, timeout_s: float, should_stop: Callable[[], bool] = lambda: False) -> bool:
        """Poll readiness, and the metrics endpoint, until both answer (True) or ``should_stop()`` (False).

        Raises TritonServerError with the server's last log lines if it exits first, or on timeout.
        """
        deadline = time.monotonic() + timeout_s
        while not should_stop():
            code = self.poll()
            if code is not None:
                raise TritonServerError(f"tritonserver exited with code {code} before ready{self._tail()}")
            if self.is_ready() and is_ready(self.metrics_url):
                restrict_shm(self.shm_prefix)
                return True
            if time.monotonic() > deadline:
                raise TritonServerError(f"tritonserver was not ready after {timeout_s:.0f} s{self._tail()}")
            time.sleep(0.2)
        return False

    def stubs(self) -> list[StubProcess]:
        return find_stubs(self._process.pid) if self._process is not None else []

    def heartbeat(self, instance: str) -> int | None:
        """When the serving loop of model instance ``instance`` last beat (file mtime, ns), or None
        if it has none (not a serving loop, not started yet, or stopped cleanly)."""
        if self.heartbeat_dir is None:
            return None
        try:
            return (self.heartbeat_dir / instance).stat().st_mtime_ns
        except OSError:
            return None

    def stop(self, graceful: bool = True) -> int | None:
        """End the server and everything in its process group; remove its shm files; return its exit code.

        Graceful: SIGTERM (Triton finishes in-flight requests within exit_timeout_s), then SIGKILL if it
        is still there a few seconds later (with a dead stub, Triton's unload can hang). Not graceful:
        SIGKILL at once, so open client streams get a connection error instead of waiting.
        """
        process = self._process
        if process is None:
            return None
        if self._stopped:  # idempotent: never signal a group id that may have been reused since
            return process.returncode
        self._stopped = True
        if graceful and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=self.options.exit_timeout_s + 3)
            except subprocess.TimeoutExpired:
                log.warning("tritonserver (pid %d) still running after SIGTERM; killing it", process.pid)
        # also after a clean exit: no stub may outlive its server
        self._kill_group(process)
        remove_shm(self.shm_prefix)
        self._release_files()
        return process.returncode

    def _release_files(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._backend_dir is not None:
            shutil.rmtree(self._backend_dir, ignore_errors=True)
            self._backend_dir = None
        if self.heartbeat_dir is not None:
            shutil.rmtree(self.heartbeat_dir, ignore_errors=True)

    @staticmethod
    def _kill_group(process: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already empty
            os.killpg(process.pid, signal.SIGKILL)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            raise TritonServerError(f"tritonserver (pid {process.pid}) survived SIGKILL") from None

    def _tail(self) -> str:
        """The errors and last lines of this launch's log, for a start-up failure message."""
        if self.options.log_file is None:
            return " (its log is above)"
        try:
            with self.options.log_file.open("rb") as f:
                f.seek(self._log_offset)
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return ""
        if not lines:
            return " (it wrote nothing)"
        # glog error lines (E1121 16:48:33 ...) name the cause; the model table and shutdown come last
        errors = [line for line in lines if re.match(r"E\d{4} ", line) and _NOISE not in line][-8:]
        shown = errors + [line for line in lines[-4:] if line not in errors]
        return ":\n" + "\n".join(line[:400] for line in shown)
