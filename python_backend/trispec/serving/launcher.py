"""``specdec-serve``: write the model repository from the YAML config and serve it from tritonserver.

Runs in the foreground under a supervisor that restarts the server if it or a Python stub dies, or a
serving loop is stuck; a stub that is only slow or stopped for a while is waited for.
SIGTERM or Ctrl-C stops the server cleanly (its shm files removed) and exits 0.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import secrets
import signal
import socket
import sys
from pathlib import Path
from types import FrameType

from trispec.errors import InvalidInputError

PROG = "specdec-serve"
ADMIN_KEY_ENV = "SPECDEC_ADMIN_KEY"


def admin_key(path: Path) -> str:
    """The admin key: ``$SPECDEC_ADMIN_KEY``, else the file's, else a new one written there 0600."""
    from_env = os.environ.get(ADMIN_KEY_ENV, "").strip()
    if from_env:
        return from_env
    if path.exists():
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)  # readable by others: the key would be no key
        key = path.read_text().strip()
        if key:
            return key
    key = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    parser.add_argument("--config", type=Path, help="YAML config (default: the built-in SmolLM2 config)")
    parser.add_argument(
        "--model-repository",
        type=Path,
        help="where the Triton model repository is written and served from "
        "(default: model_repository in $SPECDEC_CACHE_DIR, ~/.cache/specdec)",
    )
    parser.add_argument(
        "--no-prepare",
        action="store_true",
        help="serve --model-repository as it is, without writing the specdec model into it",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument(
        "--ready-timeout", type=float, default=300.0, help="seconds to wait for the server to be ready"
    )
    parser.add_argument(
        "--exit-timeout",
        type=int,
        default=5,
        help="seconds Triton may spend finishing requests and unloading on shutdown; below 2 it may "
        "exit before it unloaded (default: %(default)s)",
    )
    parser.add_argument(
        "--loop-stall-timeout",
        type=float,
        default=30.0,
        help="restart the server when a serving loop's heartbeat stands still this many seconds while "
        "its stub runs (time stopped does not count); 0 never (default: %(default)s)",
    )
    parser.add_argument(
        "--admin-key-file",
        type=Path,
        help="where the key for Triton's admin APIs is read, or written (mode 0600) if missing "
        f"(default: admin-key in $SPECDEC_CACHE_DIR; ${ADMIN_KEY_ENV} overrides both)",
    )
    parser.add_argument(
        "--open-admin-apis",
        action="store_true",
        help="serve the admin APIs (shared memory, model repository, trace, logging) without a key",
    )
    parser.add_argument("--log-verbose", type=int, default=0, help="tritonserver --log-verbose level")
    parser.add_argument("--log-file", type=Path, help="write the server's log here (default: this terminal)")
    args = parser.parse_args(argv)
    if args.loop_stall_timeout < 0:
        parser.error("--loop-stall-timeout must be >= 0")
    if args.no_prepare and args.config is not None:
        parser.error("--config has no effect with --no-prepare")
    return args


def taken_port(host: str, ports: dict[str, int]) -> str | None:
    """The first of ``ports`` (option name → port) that cannot be bound on ``host``, described."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for option, port in ports.items():
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            # as the server does: a port in TIME_WAIT is free, a listening one is not
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                why = "already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
                return f"{option} {port} on {host}: {why}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from trispec.config import load_config
    from trispec.serving.fingerprint import read_fingerprint
    from trispec.serving.supervisor import Supervisor, SupervisorPolicy
    from trispec.serving.tritonserver import (
        ADMIN_APIS,
        ADMIN_KEY_HEADER,
        GRPC_HEADER_PREFIX,
        ServerOptions,
        TritonServer,
        TritonServerError,
        probe_host,
        remove_stale_shm,
    )

    def fail(message: str, code: int) -> int:
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return code

    try:
        serving = load_config(args.config).serving
    except InvalidInputError as exc:
        return fail(str(exc), 2)
    ports = {
        "--http-port": args.http_port,
        "--grpc-port": args.grpc_port,
        "--metrics-port": args.metrics_port,
    }
    if len(set(ports.values())) != len(ports):
        return fail(f"the ports must differ: {ports}", 2)
    taken = taken_port(args.host, ports)
    if taken is not None:
        return fail(taken, 1)

    if args.model_repository is None:
        from trispec.checkpoints import cache_dir

        args.model_repository = cache_dir() / "model_repository"
    repository: Path = args.model_repository.expanduser().resolve()
    if args.no_prepare:
        if not repository.is_dir():
            return fail(f"--model-repository {repository} is not a directory", 2)
    else:
        from trispec.serving.repository import prepare_model_repository

        try:
            prepare_model_repository(args.config, repository)
        except InvalidInputError as exc:
            return fail(str(exc), 2)
        except OSError as exc:  # e.g. a hand-edited config.pbtxt it refuses to overwrite
            return fail(str(exc), 1)

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {PROG}: %(message)s", datefmt="%H:%M:%S")
    key = None
    if not args.open_admin_apis:
        if args.admin_key_file is None:
            from trispec.checkpoints import cache_dir

            args.admin_key_file = cache_dir() / "admin-key"
        try:
            key = admin_key(args.admin_key_file.expanduser())
        except OSError as exc:
            return fail(f"admin key file {args.admin_key_file}: {exc}", 1)
    remove_stale_shm()
    options = ServerOptions(
        model_repository=repository,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        host=args.host,
        exit_timeout_s=args.exit_timeout,
        log_verbose=args.log_verbose,
        log_file=args.log_file,
        admin_key=key,
    )

    policy_words = "decoupled: streams" if serving.decoupled else "not decoupled: one response per request"

    def announce(server: TritonServer, restarts: int) -> None:
        # the served model wrote it while loading (serving/fingerprint.py)
        info = None if args.no_prepare else read_fingerprint(server.heartbeat_dir, serving.model_name)
        fingerprint = (
            ""
            if info is None
            else f"model fingerprint {info.get('model_fingerprint')} ({info.get('numerics')})"
        )
        if restarts:
            print(
                f"{PROG}: ready again after restart {restarts}" + (f": {fingerprint}" if info else ""),
                flush=True,
            )
            return
        host = probe_host(args.host)
        # --no-prepare serves the repository as it is: its own model names, not the YAML's
        model = "" if args.no_prepare else f"model {serving.model_name} ({policy_words})  "
        print(
            f"{PROG}: ready: {model}HTTP http://{host}:{args.http_port}  gRPC {host}:{args.grpc_port}  "
            f"metrics http://{host}:{args.metrics_port}/metrics  (repository {repository})",
            flush=True,
        )
        if info is not None:
            print(f"{PROG}: {fingerprint}", flush=True)
        if key is None:
            print(f"{PROG}: admin APIs ({', '.join(ADMIN_APIS)}) are open to every client", flush=True)
        else:
            where = f"${ADMIN_KEY_ENV}" if os.environ.get(ADMIN_KEY_ENV, "").strip() else args.admin_key_file
            print(
                f"{PROG}: admin APIs ({', '.join(ADMIN_APIS)}) need header '{ADMIN_KEY_HEADER}: <key>' "
                f"(gRPC metadata '{GRPC_HEADER_PREFIX}{ADMIN_KEY_HEADER}'), key in {where}",
                flush=True,
            )

    try:
        policy = SupervisorPolicy(ready_timeout_s=args.ready_timeout, loop_stall_s=args.loop_stall_timeout)
        supervisor = Supervisor(options, policy, announce)
    except TritonServerError as exc:
        return fail(str(exc), 1)

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        supervisor.stop()  # only sets an event; the supervisor logs and cleans up

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = supervisor.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code != 0:
        return fail("tritonserver failed (see the log above)", code)
    print(f"{PROG}: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
