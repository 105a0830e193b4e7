"""tritonserver's command line (ports, addresses, the restricted admin APIs) and its readiness probe."""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from trispec.serving.triton_install import TritonInstallation


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
# the stubs' environment: the admin key's SHA-256 (hex), or OPEN_ADMIN (the admin APIs need no key);
# an operator's reset of the prefix cache is checked against it (serving/admin.py)
ADMIN_KEY_DIGEST_ENV = "SPECDEC_ADMIN_KEY_SHA256"
OPEN_ADMIN = "open"


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
        *header_forward_flags(),
    ]


def admin_key_digest(admin_key: str | None) -> str:
    """What ``ADMIN_KEY_DIGEST_ENV`` holds for a server started with ``admin_key`` (None: open)."""
    return OPEN_ADMIN if admin_key is None else hashlib.sha256(admin_key.encode("utf-8")).hexdigest()


def restricted_api_flags(admin_key: str | None) -> list[str]:
    """Triton's restricted-API options: the admin APIs need the key header, on HTTP and gRPC alike."""
    if admin_key is None:
        return []
    rule = f"{','.join(ADMIN_APIS)}:{ADMIN_KEY_HEADER}={admin_key}"
    return [f"--http-restricted-api={rule}", f"--grpc-restricted-protocol={rule}"]


def header_forward_flags() -> list[str]:
    """Triton's options that hand the admin-key header of an inference request to the model as a
    request parameter (an operator's reset carries it: ``serving/admin.py``): gRPC metadata of that
    name, and an HTTP header on ``/infer`` (Triton 2.51's HTTP ``generate`` forwards no header: there
    the key comes as the body's key of that name, a request parameter of itself)."""
    pattern = f"^{ADMIN_KEY_HEADER}$"
    return [f"--http-header-forward-pattern={pattern}", f"--grpc-header-forward-pattern={pattern}"]


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
