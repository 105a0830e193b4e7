"""Keep one tritonserver serving: restart it when it, or any of its Python stubs, dies or its serving
loop is stuck; never for a stub that was only slow.

Triton 2.51 never restarts a crashed Python stub and keeps answering ``/v2/health/ready`` with 200,
while the model fails every request and open streams hang. So readiness alone cannot be trusted:
after each start the supervisor records the stub processes and, every ``poll_interval_s``, checks
that the server process is running, that every recorded stub is alive (not gone, not a zombie, not
a reused pid), that every serving loop's heartbeat moves while its stub runs, and that readiness
answers. On any failure the whole process group is killed (open client streams then get a
connection error instead of hanging), shm files are removed and a fresh server is started.

Meanwhile a thread sets each live stub's health flag in Triton's shared memory every
``stub_health_interval_s`` (see ``StubHealthFlag``): without it a stub stopped or starved for over a
second while a request arrives is declared unhealthy by Triton and then crashes when it resumes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from trispec.serving.tritonserver import (
    ServerOptions,
    StubHealthFlag,
    StubProcess,
    TritonInstallation,
    TritonServer,
    TritonServerError,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SupervisorPolicy:
    ready_timeout_s: float = 300.0
    poll_interval_s: float = 0.5
    # consecutive failed readiness probes (each waiting up to probe_timeout_s) before the server
    # counts as unhealthy: generous, a busy 2-core machine can answer slowly
    readiness_failures: int = 4
    probe_timeout_s: float = 2.0
    # restarts that fail (never ready) in a row before giving up; a failed first start gives up at once
    max_start_failures: int = 5
    # wait before a retry: none after one failure, then initial, doubled per further failure, capped
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 30.0
    # a server that dies sooner than this after becoming ready also counts towards back-off
    min_uptime_s: float = 10.0
    # how often each live stub's health flag is set for it (0: never). Triton clears the flag and
    # checks it again one second later; 0.2 s leaves four chances in that second on a busy machine
    stub_health_interval_s: float = 0.2
    # a serving loop whose heartbeat has not moved for this many seconds of its stub running (time
    # stopped does not count) is stuck: restart (0: never). Generous: one step is at most a chunk of
    # prefill (scheduler.max_prefill_tokens_per_step) or a verify round, seconds on a slow machine
    loop_stall_s: float = 30.0


class LoopWatch:
    """How long one serving loop's heartbeat has stood still while its stub was running.

    The heartbeat is compared with its last value only (never with this clock), and time is added
    only between two looks at a running stub, at most ``max_gap_s`` at once: a stub stopped with
    SIGSTOP, or this supervisor itself not being scheduled for a while, cannot make a loop look stuck.
    """

    def __init__(self, max_gap_s: float) -> None:
        self.max_gap_s = max_gap_s
        self.stale_s = 0.0
        self._stamp: int | None = None
        self._seen_at: float | None = None

    def observe(self, now: float, stamp: int | None, running: bool) -> float:
        """Seconds stuck so far, given the heartbeat (None: there is none, so nothing to watch) and
        whether the stub is running (not stopped) at ``now``."""
        if stamp is None or stamp != self._stamp:
            self.stale_s = 0.0
        elif running and self._seen_at is not None:
            self.stale_s += min(max(now - self._seen_at, 0.0), self.max_gap_s)
        self._stamp, self._seen_at = stamp, now
        return self.stale_s


def retry_delay_s(policy: SupervisorPolicy, failures: int) -> float:
    """No wait for the first retry (a single crash should cost only the reload), then doubling."""
    if failures <= 1:
        return 0.0
    return min(policy.backoff_initial_s * 2 ** (failures - 2), policy.backoff_max_s)


class Supervisor:
    """Runs the server in the caller's thread (``run()``) until ``stop()``; restarts it when it fails.

    ``stop()`` only sets an event: it is safe to call from a signal handler or another thread, and
    ``run()`` does the cleanup. ``run()`` never blocks on that event (it polls it between short
    sleeps) because ``Event.wait`` and a handler calling ``Event.set`` in the same thread can deadlock.
    """

    def __init__(
        self,
        options: ServerOptions,
        policy: SupervisorPolicy | None = None,
        on_ready: Callable[[TritonServer, int], None] | None = None,
        install: TritonInstallation | None = None,
    ) -> None:
        self.options = options
        self.policy = policy or SupervisorPolicy()
        self.on_ready = on_ready  # called with (server, restarts so far) each time a server is ready
        self.install = install or TritonInstallation.locate()
        self.restarts = 0
        self.server: TritonServer | None = None
        # set while a healthy server is serving; for callers in other threads (tests, health checks)
        self.ready = threading.Event()
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> int:
        """Serve until stopped (returns 0), or until the first start or repeated restarts fail (1)."""
        start_failures = 0
        quick_crashes = 0
        try:
            while not self.stopping:
                failures = start_failures + quick_crashes
                if failures and not self._sleep(retry_delay_s(self.policy, failures)):
                    break
                server = TritonServer(self.options, self.install)
                self.server = server
                if not self._start(server):
                    if self.stopping:
                        break
                    if self.restarts == 0:
                        # never served: a broken model or config, not a transient failure
                        log.error("the first start failed; not retrying")
                        return 1
                    start_failures += 1
                    if start_failures >= self.policy.max_start_failures:
                        log.error("giving up after %d failed starts in a row", start_failures)
                        return 1
                    continue
                start_failures = 0
                ready_at = time.monotonic()
                reason = self._watch(server)
                if reason is None:  # stop requested
                    break
                log.warning("restarting tritonserver: %s", reason)
                self.ready.clear()
                server.stop(graceful=False)
                self.restarts += 1
                quick = time.monotonic() - ready_at < self.policy.min_uptime_s
                quick_crashes = quick_crashes + 1 if quick else 0
            return 0
        finally:
            self.ready.clear()
            if self.stopping:
                log.info("stop requested: stopping tritonserver")
            if self.server is not None:
                self.server.stop(graceful=True)

    def _start(self, server: TritonServer) -> bool:
        started_at = time.monotonic()
        try:
            server.start()
            if not server.wait_ready(self.policy.ready_timeout_s, should_stop=lambda: self.stopping):
                return False
        except TritonServerError as exc:
            log.error("tritonserver failed to start: %s", exc)
            server.stop(graceful=False)
            return False
        stubs = server.stubs()
        log.info(
            "tritonserver ready in %.1f s (pid %d; stubs: %s)",
            time.monotonic() - started_at,
            server.pid,
            ", ".join(f"{s.instance}={s.pid}" for s in stubs) or "none",
        )
        self.ready.set()
        if self.on_ready is not None:
            self.on_ready(server, self.restarts)
        return True

    def _watch(self, server: TritonServer) -> str | None:
        """Poll until the server fails (returns why) or stop is requested (returns None)."""
        stubs = server.stubs()
        done = threading.Event()
        keeper = None
        if self.policy.stub_health_interval_s > 0:
            keeper = threading.Thread(
                target=self._keep_stubs_healthy, args=(stubs, done), name="specdec-stub-health", daemon=True
            )
            keeper.start()
        try:
            return self._poll(server, stubs)
        finally:
            done.set()
            if keeper is not None:
                keeper.join(5)

    def _poll(self, server: TritonServer, stubs: list[StubProcess]) -> str | None:
        policy = self.policy
        # a poll late by up to a few intervals still counts in full; more is this process not running
        watches = {s.instance: LoopWatch(max_gap_s=max(4 * policy.poll_interval_s, 2.0)) for s in stubs}
        failed_probes = 0
        while self._sleep(policy.poll_interval_s):
            code = server.poll()
            if code is not None:
                return f"tritonserver exited with code {code}"
            dead = [s for s in stubs if not s.is_alive()]
            if dead:
                names = ", ".join(f"{s.instance} (pid {s.pid})" for s in dead)
                return f"Python backend stub died: {names}; Triton 2.51 does not restart it"
            if policy.loop_stall_s > 0:
                for stub in stubs:
                    running = not stub.is_stopped()
                    stale = watches[stub.instance].observe(
                        time.monotonic(), server.heartbeat(stub.instance), running
                    )
                    if stale >= policy.loop_stall_s:
                        return (
                            f"the serving loop of {stub.instance} (stub pid {stub.pid}) has not moved for "
                            f"{stale:.0f} s while its stub was running"
                        )
            failed_probes = 0 if server.is_ready(policy.probe_timeout_s) else failed_probes + 1
            if failed_probes >= policy.readiness_failures:
                return f"/v2/health/ready failed {failed_probes} times in a row"
        return None

    def _keep_stubs_healthy(self, stubs: list[StubProcess], done: threading.Event) -> None:
        """Set each live stub's health flag until ``done`` (see ``StubHealthFlag`` for why): Triton then
        waits for a stub that is stopped or starved instead of failing the request it is handing over,
        which would crash the stub when it resumes. A stub that has exited gets no flag, so Triton
        still notices it; this supervisor restarts the server for it anyway."""
        flags: list[StubHealthFlag] = []
        for stub in stubs:
            try:
                flags.append(StubHealthFlag(stub))
            except (OSError, TritonServerError) as exc:
                log.warning(
                    "cannot keep %s's health flag (a stall over 1 s will then crash it): %s",
                    stub.instance,
                    exc,
                )
        try:
            # a thread of its own, so Event.wait is safe here (signal handlers run in the main thread)
            while flags and not done.wait(self.policy.stub_health_interval_s):
                for flag in list(flags):
                    if not flag.stub.is_alive():
                        continue
                    try:
                        flag.set()
                    except OSError as exc:  # not expected: the fd stays valid even once the file is removed
                        log.warning("cannot set %s's health flag: %s", flag.stub.instance, exc)
                        flags.remove(flag)
                        flag.close()
        finally:
            for flag in flags:
                flag.close()

    def _sleep(self, seconds: float) -> bool:
        """Sleep in short slices; False as soon as stop is requested."""
        deadline = time.monotonic() + seconds
        while not self.stopping:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            time.sleep(min(remaining, 0.1))
        return False
