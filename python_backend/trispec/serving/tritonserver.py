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
import importlib.util
import itertools
import logging
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

STUB_NAME = "triton_python_backend_stub"
SHM_DIR = Path("/dev/shm")
# Every shm prefix starts with this and the launching pid, so leftovers of a dead launcher are
# recognisable (see remove_stale_shm).
SHM_PREFIX_ROOT = "specdec_"
# a tritonserver install tree to use instead of the wheel's (NVIDIA's images: /opt/tritonserver)
SERVER_ROOT_ENV = "SPECDEC_TRITONSERVER_ROOT"
# the directory, passed to the stubs in their environment, where each serving loop renews its heartbeat
# file (named after its model instance, e.g. specdec_0_0); the supervisor watches them
HEARTBEAT_DIR_ENV = "SPECDEC_HEARTBEAT_DIR"
_launch_counter = itertools.count()
# logged as an error at every start on a machine without a GPU; harmless
_NOISE = "CudaDriverHelper has not been initialized"


class TritonServerError(RuntimeError):
    """tritonserver could not be found, started, or did not become ready."""


@dataclass(frozen=True)
class TritonInstallation:
    """Paths inside the installed ``nvidia-pytriton`` wheel."""

    binary: Path
    python_backend: Path  # holds libtriton_python.so and triton_python_backend_utils.py
    stub: Path  # the Python backend stub built for the running Python version
    libs: Path  # the wheel's bundled shared libraries (nvidia_pytriton.libs)

    @classmethod
    def locate(cls) -> TritonInstallation:
        """The server in ``$SPECDEC_TRITONSERVER_ROOT`` (e.g. ``/opt/tritonserver`` in NVIDIA's Triton
        images, where the GPU build lives), else the one inside the nvidia-pytriton wheel."""
        root = os.environ.get(SERVER_ROOT_ENV)
        if root:
            return cls.from_root(Path(root))
        spec = importlib.util.find_spec("pytriton")
        if spec is None or not spec.submodule_search_locations:
            raise TritonServerError("the nvidia-pytriton wheel is not installed (it carries tritonserver)")
        package = Path(next(iter(spec.submodule_search_locations)))
        root = package / "tritonserver"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        found = cls(
            binary=root / "bin" / "tritonserver",
            python_backend=root / "backends" / "python",
            stub=root / "python_backend_stubs" / version / STUB_NAME,
            libs=package.parent / "nvidia_pytriton.libs",
        )
        for path in (found.binary, found.python_backend / "libtriton_python.so", found.stub, found.libs):
            if not path.exists():
                raise TritonServerError(f"{path} is missing from the nvidia-pytriton wheel, Python {version}")
        return found

    @classmethod
    def from_root(cls, root: Path) -> TritonInstallation:
        """A tritonserver install tree: ``bin/tritonserver``, ``backends/python/`` (the backend and its
        stub side by side) and ``lib/``."""
        python = root / "backends" / "python"
        found = cls(
            binary=root / "bin" / "tritonserver",
            python_backend=python,
            stub=python / STUB_NAME,
            libs=root / "lib",
        )
        for path in (found.binary, python / "libtriton_python.so", found.stub):
            if not path.exists():
                raise TritonServerError(f"{path} is missing (${SERVER_ROOT_ENV}={root})")
        return found


def prepare_backend_directory(directory: Path, install: TritonInstallation) -> Path:
    """Fill ``directory/python/`` with symlinks to the Python backend and the matching stub.

    Triton looks for the stub beside ``libtriton_python.so``; the wheel keeps them apart, so pointing
    ``--backend-directory`` at the wheel fails ("triton_python_backend_stub is not found").
    """
    python_dir = directory / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    sources = [
        install.python_backend / "libtriton_python.so",
        install.python_backend / "triton_python_backend_utils.py",
        install.stub,
    ]
    for source in sources:
        link = python_dir / source.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(source)
    return directory


def server_environment(install: TritonInstallation, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment tritonserver and its Python stubs need.

    The stub links libpython without an RPATH (so Python's LIBDIR goes first on LD_LIBRARY_PATH) and
    finds its prefix, hence the venv with torch and this project, from the first ``python`` on PATH.
    """
    env = dict(os.environ if base is None else base)
    lib_dirs = [sysconfig.get_config_var("LIBDIR"), str(install.libs), env.get("LD_LIBRARY_PATH", "")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(d for d in lib_dirs if d)
    bin_dirs = [os.path.dirname(sys.executable), env.get("PATH", "")]
    env["PATH"] = os.pathsep.join(d for d in bin_dirs if d)
    return env


@dataclass(frozen=True)
class ServerOptions:
    model_repository: Path
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    host: str = "127.0.0.1"
    # Triton's own grace period for in-flight requests on SIGTERM; we SIGKILL a few seconds later
    exit_timeout_s: int = 5
    log_verbose: int = 0
    # None: the server writes to this process's stdout/stderr
    log_file: Path | None = None
    # admin APIs (ADMIN_APIS) answer only requests carrying header ADMIN_KEY_HEADER with this value;
    # None leaves them open to whoever reaches the ports
    admin_key: str | None = None


# Triton's names for the APIs that change or expose server state; inference, health, metadata, model
# config and statistics (read by perf_analyzer and genai-perf) stay open
ADMIN_APIS = ("shared-memory", "model-repository", "trace", "logging")
ADMIN_KEY_HEADER = "specdec-admin-key"
# over gRPC Triton reads the restricted-protocol header under this prefix
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


def shm_prefix() -> str:
    """A shm-region prefix unique to one launch: root, launching pid, launch number."""
    return f"{SHM_PREFIX_ROOT}{os.getpid()}_{next(_launch_counter)}_"


def build_command(
    install: TritonInstallation, options: ServerOptions, backend_dir: Path, prefix: str
) -> list[str]:
    return [
        str(install.binary),
        f"--model-repository={options.model_repository}",
        f"--backend-directory={backend_dir}",
        f"--http-port={options.http_port}",
        f"--grpc-port={options.grpc_port}",
        f"--metrics-port={options.metrics_port}",
        f"--http-address={options.host}",
        f"--grpc-address={options.host}",
        f"--metrics-address={options.host}",
        # otherwise every model.py is loaded twice at start-up
        "--disable-auto-complete-config",
        "--allow-gpu-metrics=false",
        f"--exit-timeout-secs={options.exit_timeout_s}",
        f"--backend-config=python,shm-region-prefix-name={prefix}",
        f"--log-verbose={options.log_verbose}",
        *restricted_api_flags(options.admin_key),
    ]


def restricted_api_flags(admin_key: str | None) -> list[str]:
    """Triton's restricted-API options: the admin APIs need the key header, on HTTP and gRPC alike."""
    if admin_key is None:
        return []
    rule = f"{','.join(ADMIN_APIS)}:{ADMIN_KEY_HEADER}={admin_key}"
    return [f"--http-restricted-api={rule}", f"--grpc-restricted-protocol={rule}"]


def probe_host(host: str) -> str:
    """The address to reach a server bound to ``host`` from this machine, URL-ready."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def is_ready(url: str, timeout_s: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass(frozen=True)
class StubProcess:
    """A Python backend stub: one per model instance (``instance`` is e.g. ``echo_0_0``)."""

    pid: int
    instance: str
    start_time: int  # /proc/<pid>/stat starttime: tells a reused pid from the original
    # where Triton keeps this stub's IPC control block (its argv[2] and argv[7]), see StubHealthFlag
    shm_region: str = ""
    ipc_control: int = 0

    def is_alive(self) -> bool:
        """False once the stub has exited: gone, a zombie (Triton does not reap it), or pid reused.
        A stopped stub (SIGSTOP, a debugger) is alive: it carries on where it was when continued."""
        stat = _read_stat(self.pid)
        return stat is not None and stat[0] not in ("Z", "X") and stat[2] == self.start_time

    def is_stopped(self) -> bool:
        """True while the stub is stopped by a signal or a tracer: alive, but none of it runs."""
        stat = _read_stat(self.pid)
        return stat is not None and stat[0] in ("T", "t") and stat[2] == self.start_time


def _read_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, starttime) of a process, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: split after its closing parenthesis
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19])


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None if it is gone."""
    stat = _read_stat(pid)
    return stat[2] if stat is not None else None


def _descendants(root_pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _read_stat(int(entry.name))
        if stat is not None:
            children.setdefault(stat[1], []).append(int(entry.name))
    found, frontier = [], [root_pid]
    while frontier:
        kids = children.get(frontier.pop(), [])
        found.extend(kids)
        frontier.extend(kids)
    return found


def find_stubs(server_pid: int) -> list[StubProcess]:
    """Live Python backend stubs below ``server_pid``.

    Triton first runs ``sh -c <stub>`` once to check the stub starts; that process has no model
    arguments and is skipped, as are zombies.
    """
    stubs = []
    for pid in _descendants(server_pid):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        is_stub = (comm != "" and STUB_NAME.startswith(comm)) or argv[0].endswith(STUB_NAME.encode())
        stat = _read_stat(pid)
        # argv: stub model.py shm_region shm_default shm_growth parent_pid backend_dir ipc instance ...
        if not is_stub or stat is None or stat[0] in ("Z", "X") or len(argv) < 9:
            continue
        try:
            ipc_control = int(argv[7])
        except ValueError:
            ipc_control = 0
        stubs.append(
            StubProcess(
                pid=pid,
                instance=argv[8].decode(errors="replace"),
                start_time=stat[2],
                shm_region=argv[2].decode(errors="replace"),
                ipc_control=ipc_control,
            )
        )
    return stubs


# The Python backend's IPC control block as python_backend r24.10 (Triton 2.51) lays it out in the
# stub's shm region: a 16-byte ownership header (shm_manager.h, AllocatedShmOwnership: uint32 ref
# count, alignas 16), then IPCControlShm (pb_utils.h): bool stub_health, parent_health, uses_env,
# decoupled; two pthread mutexes (40 bytes each, from byte 8); five uint64 queue handles (from byte 88).
_OWNERSHIP_BYTES = 16
_CONTROL_BYTES = 88 + 5 * 8


class StubHealthFlag:
    """Sets a stub's health flag in Triton's shared memory, as the stub's own health thread does.

    Why: when Triton hands a request to a stub (``ProcessRequests``, python_be.cc) it clears this flag
    and waits for the stub's reply in 1-second slices (``StubLauncher::ReceiveMessageFromStub``,
    stub_launcher.cc); the stub's background thread sets the flag every 300 ms (pb_stub.cc). If a
    slice ends with the flag still clear (the stub is stopped, or starved of CPU, for over about a
    second) Triton fails the request with "Stub process '<instance>' is not healthy", frees the
    request's shared memory and stops waiting, but the execute message stays queued: when the stub
    runs again it reads that freed memory and dies (SIGSEGV, seen on 2.51), taking every open stream
    with it. Both timeouts are hard-coded; the ``stub-timeout-seconds`` backend option is parsed but
    unused in this version.

    The supervisor sets the flag while the stub process exists (stopped or not), so Triton keeps
    waiting for a stub that is only slow, and lets it clear once the stub has exited, so a dead stub
    is still reported within a second or two. The layout is checked before anything is written; a
    Triton whose block looks different raises TritonServerError here and is left alone.
    """

    def __init__(self, stub: StubProcess) -> None:
        self.stub = stub
        self._offset = stub.ipc_control + _OWNERSHIP_BYTES
        if not stub.shm_region or stub.ipc_control <= 0 or "/" in stub.shm_region:
            raise TritonServerError(f"stub {stub.instance}: no shm region or IPC control handle in its argv")
        self._fd = os.open(SHM_DIR / stub.shm_region, os.O_RDWR | os.O_CLOEXEC)
        try:
            self._check_layout()
        except BaseException:
            os.close(self._fd)
            raise

    def _check_layout(self) -> None:
        size = os.fstat(self._fd).st_size
        block = os.pread(self._fd, _OWNERSHIP_BYTES + _CONTROL_BYTES, self.stub.ipc_control)
        if len(block) < _OWNERSHIP_BYTES + _CONTROL_BYTES:
            raise TritonServerError(f"stub {self.stub.instance}: IPC control block beyond its shm region")
        (ref_count,) = struct.unpack_from("<I", block, 0)
        flags = block[_OWNERSHIP_BYTES : _OWNERSHIP_BYTES + 4]
        handles = struct.unpack_from("<5Q", block, _OWNERSHIP_BYTES + 88)
        looks_right = (
            1 <= ref_count <= 4
            and all(b in (0, 1) for b in flags)
            and all(0 < h < size for h in handles)
            and len(set(handles)) == len(handles)
        )
        if not looks_right:
            raise TritonServerError(
                f"stub {self.stub.instance}: the IPC control block is not laid out as in Triton 2.51 "
                "(python_backend r24.10); its health flag is left alone"
            )

    def set(self) -> None:
        # one byte, written through the same tmpfs pages Triton and the stub map
        os.pwrite(self._fd, b"\x01", self._offset)

    def close(self) -> None:
        os.close(self._fd)


def remove_shm(prefix: str) -> list[Path]:
    removed = []
    for path in SHM_DIR.glob(f"{prefix}*"):
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


def restrict_shm(prefix: str) -> list[Path]:
    """Owner-only access (0600) to this server's shm regions: the Python backend creates them 0644,
    so any local user could map a stub's region (its name is predictable)."""
    changed = []
    for path in SHM_DIR.glob(f"{prefix}*"):
        try:
            if path.stat().st_mode & 0o077:
                path.chmod(0o600)
                changed.append(path)
        except OSError:  # gone meanwhile, or not ours
            pass
    return changed


def remove_stale_shm() -> list[Path]:
    """Remove shm files left by earlier launchers that died without cleaning up (their pid is gone)."""
    removed = []
    for path in SHM_DIR.glob(f"{SHM_PREFIX_ROOT}*"):
        owner = path.name[len(SHM_PREFIX_ROOT) :].split("_", 1)[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            removed.extend(remove_shm(path.name))
    return removed


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
                env={**server_environment(self.install), HEARTBEAT_DIR_ENV: str(self.heartbeat_dir)},
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
        """Poll readiness until ready (True) or ``should_stop()`` (False).

        Raises TritonServerError with the server's last log lines if it exits first, or on timeout.
        """
        deadline = time.monotonic() + timeout_s
        while not should_stop():
            code = self.poll()
            if code is not None:
                raise TritonServerError(f"tritonserver exited with code {code} before ready{self._tail()}")
            if self.is_ready():
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
