"""tritonserver's command line (ports, addresses, the restricted admin APIs) and its readiness probe."""

from __future__ import annotations

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
