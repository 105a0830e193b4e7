"""specdec-soak: a bounded soak and fault run against a specdec server on this machine.

Phases (``--phases``, all but ``fault`` and ``failover`` by default), each bounded in time and count:
  mixed     N concurrent streams of mixed prompts, max_tokens, greedy/sampled and k; every stream must
            end with a final response, and each greedy one must equal the same request run alone
  cancel    a storm of streams cancelled at random points; afterwards the KV blocks return to idle
            and the server is still ready
  overload  a burst of streams at once plus a small request some seconds in: every request completes
            or is refused quickly, the small one gets its first token quickly, nothing hangs, the
            server stays ready, KV blocks return to idle
  bad       a catalogue of bad requests, each refused with the expected code and counted by reason in
            specdec_requests_rejected_total; a 10 MB prompt is refused fast while a stream runs on
  memory    (throughout) the Python stub's RSS, sampled every second: growth after the first minute
  fault     (only when named: it kills processes) streams in flight over gRPC and HTTP while the
            Python stub, then tritonserver, is killed with -9: every stream is resumed by the client
            and must end complete with the text of the same request run alone
  failover  (only when named: it kills a whole replica) streams that know two replicas are in
            flight when the first replica (specdec-serve, tritonserver and its stubs) is killed with
            -9: on a replica serving the same model each resumes and must equal the request run alone;
            on one serving another model (another model_fingerprint) each must be refused, having
            delivered only a prefix of its text

Prints a pass/fail table (``--json``: one JSON object). Exit status: 0 every check passed, 1 a check
failed, 2 bad arguments (a host that is not loopback without ``--allow-remote``).
``--short`` is the CI profile (under 2 minutes); the defaults are the long operator run.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from trispec_client.client import PROTOCOLS
from trispec_client.soak import bad_input, cancel, failover, fault, mixed, overload
from trispec_client.soak.context import Settings, Soak
from trispec_client.soak.memory import memory_checks
from trispec_client.soak.report import Report, finish
from trispec_client.soak.target import RssSampler, Server, find_stub, is_loopback, split_host_port

PROG = "specdec-soak"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
PHASES = ("mixed", "cancel", "overload", "bad", "memory", "fault", "failover")
# fault kills the stub and the server, failover a whole replica: only when named
DEFAULT_PHASES = ("mixed", "cancel", "overload", "bad", "memory")
# the phases that run one after another (memory is sampled throughout, up to fault)
RUNNERS = {
    "mixed": mixed.run,
    "cancel": cancel.run,
    "overload": overload.run,
    "bad": bad_input.run,
    "fault": fault.run,
    "failover": failover.run,
}
# the phases that kill processes: memory is measured up to the first of them
KILLING = ("fault", "failover")

# -- command line ------------------------------------------------------------------------------------
SHORT = {
    "streams": 8,
    # with the other phases the run still lasts memory_min_run_s (40 s) without waiting for it
    "mixed_duration_s": 25.0,
    "mixed_requests": 200,
    "greedy_checks": 3,
    "cancel_streams": 24,
    # under scheduler.max_batch_size (32): every request is admitted at once, so the small one must
    # start at once too (the long profile's 300 is what overloads)
    "burst": 24,
    "burst_max_tokens": 16,
    "small_after_s": 1.0,
    "max_small_ttft_s": 30.0,
    "max_refusal_s": 5.0,
    "rss_baseline_s": 20.0,
    "max_rss_growth": 0.10,
    "memory_min_run_s": 40.0,
    "max_stream_gap_s": 5.0,
    "max_oversized_s": 2.0,
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--url", help="the server for the streams (default: 127.0.0.1:8001 for grpc, :8000 for http)"
    )
    p.add_argument("--protocol", choices=PROTOCOLS, default="grpc")
    p.add_argument(
        "--http-url", help="HTTP host:port for readiness and the bad-input catalogue (default: <host>:8000)"
    )
    p.add_argument("--metrics-url", help="metrics host:port (default: <host>:8002)")
    p.add_argument("--allow-remote", action="store_true", help="allow a host that is not loopback")
    p.add_argument("--short", action="store_true", help="the CI profile: small counts, under 2 minutes")
    p.add_argument(
        "--phases",
        default=",".join(DEFAULT_PHASES),
        help=f"comma-separated subset of {','.join(PHASES)} (default: all but fault and failover)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stub-pid", type=int, help="the Python stub to watch (default: found from the ports)")
    g = p.add_argument_group("mixed streams")
    g.add_argument("--streams", type=int, default=64, help="concurrent streams (default: %(default)s)")
    g.add_argument("--mixed-duration-s", type=float, default=600.0, help="default: %(default)s")
    g.add_argument(
        "--mixed-requests", type=int, default=100_000, help="at most this many (default: %(default)s)"
    )
    g.add_argument(
        "--greedy-checks", type=int, default=8, help="greedy streams rerun alone (default: %(default)s)"
    )
    g = p.add_argument_group("cancel storm")
    g.add_argument("--cancel-streams", type=int, default=200, help="default: %(default)s")
    g = p.add_argument_group("overload burst")
    g.add_argument("--burst", type=int, default=300, help="streams sent at once (default: %(default)s)")
    g.add_argument("--burst-max-tokens", type=int, default=256, help="default: %(default)s")
    g.add_argument(
        "--small-after-s", type=float, default=3.0, help="when the small request goes (default: %(default)s)"
    )
    g.add_argument(
        "--max-refusal-s", type=float, default=2.0, help="pass: refusals within (default: %(default)s)"
    )
    g.add_argument(
        "--max-small-ttft-s", type=float, default=5.0, help="pass: small TTFT within (default: %(default)s)"
    )
    g = p.add_argument_group("bad input")
    g.add_argument("--oversized-mb", type=float, default=10.0, help="default: %(default)s")
    g.add_argument(
        "--max-oversized-s", type=float, default=0.5, help="pass: refused within (default: %(default)s)"
    )
    g.add_argument(
        "--max-stream-gap-s",
        type=float,
        default=1.0,
        help="pass: running stream's gap (default: %(default)s)",
    )
    g = p.add_argument_group("memory")
    g.add_argument(
        "--rss-baseline-s", type=float, default=60.0, help="growth measured from here (default: %(default)s)"
    )
    g.add_argument("--max-rss-growth", type=float, default=0.05, help="pass: fraction (default: %(default)s)")
    g.add_argument(
        "--memory-min-run-s",
        type=float,
        default=120.0,
        help="sample the stub at least this long, idle after quicker phases (default: %(default)s)",
    )
    g = p.add_argument_group("fault (kills the stub, then tritonserver: needs specdec-serve's supervisor)")
    g.add_argument(
        "--fault-streams", type=int, default=8, help="streams in flight at each kill (default: %(default)s)"
    )
    g.add_argument("--fault-max-tokens", type=int, default=64, help="default: %(default)s")
    g.add_argument(
        "--resume-timeout-s",
        type=float,
        default=120.0,
        help="per resume: wait for the model to be ready again (default: %(default)s)",
    )
    g = p.add_argument_group(
        "failover (kills the whole first replica: --url/--http-url; the streams resume on the second)"
    )
    g.add_argument("--replica-url", help="the second replica's address for --protocol (gRPC host:port)")
    g.add_argument("--replica-http-url", help="the second replica's HTTP host:port")
    g.add_argument("--replica-metrics-url", help="the second replica's metrics host:port (optional check)")
    g.add_argument(
        "--failover-kill-after-tokens",
        type=int,
        default=1,
        help="kill once every stream is under way and the furthest has this many tokens (default: 1)",
    )
    g = p.add_argument_group("bounds")
    g.add_argument("--request-timeout-s", type=float, default=300.0, help="client deadline: past it = hung")
    g.add_argument(
        "--idle-timeout-s", type=float, default=30.0, help="wait for KV back to idle (default: %(default)s)"
    )
    return p


def settings_from(args: argparse.Namespace, argv: list[str]) -> Settings:
    host, _ = split_host_port(args.url or "127.0.0.1:8001")
    host = f"[{host}]" if ":" in host else host
    values = {name: getattr(args, name) for name in Settings.__dataclass_fields__ if hasattr(args, name)}
    if args.short:
        given = {a.split("=")[0].lstrip("-").replace("-", "_") for a in argv if a.startswith("--")}
        values.update({k: v for k, v in SHORT.items() if k not in given})
        if "request_timeout_s" not in given:
            values["request_timeout_s"] = 90.0
        if "idle_timeout_s" not in given:
            values["idle_timeout_s"] = 20.0
    values["url"] = args.url or f"{host}:{8001 if args.protocol == 'grpc' else 8000}"
    values["http_url"] = args.http_url or (values["url"] if args.protocol == "http" else f"{host}:8000")
    values["metrics_url"] = args.metrics_url or f"{host}:8002"
    return Settings(**values)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if unknown := [p for p in phases if p not in PHASES]:
        parser.error(f"--phases: unknown {', '.join(unknown)} (known: {', '.join(PHASES)})")
    try:
        s = settings_from(args, argv)
        replica = (s.replica_url, s.replica_http_url, s.replica_metrics_url)
        hosts = {split_host_port(u)[0] for u in (s.url, s.http_url, s.metrics_url, *replica) if u}
    except ValueError as exc:
        parser.error(str(exc))
    remote = sorted(h for h in hosts if not is_loopback(h))
    if remote and not args.allow_remote:
        print(
            f"{PROG}: refusing {', '.join(remote)}: not a loopback address (--allow-remote to override)",
            file=sys.stderr,
        )
        return EXIT_USAGE

    def log(line: str) -> None:
        print(f"{PROG}: {line}", file=sys.stderr, flush=True)

    report = Report()
    server = Server(s.http_url, s.metrics_url)
    if not server.ready():
        report.check("setup", "server ready", False, f"http://{s.http_url}/v2/health/ready not 200")
        finish(report, args.json)
        return EXIT_FAILED
    sampler = None
    if "memory" in phases and not remote:
        pid = args.stub_pid or find_stub(sorted({split_host_port(u)[1] for u in (s.url, s.http_url)}))
        if pid is not None:
            sampler = RssSampler(pid)
            sampler.start()
    start = time.monotonic()
    ctx = Soak(s, report, log)
    measured = False
    for phase in RUNNERS:
        if phase in KILLING and not measured:  # memory is measured up to here: the stub goes
            _memory(sampler, report, s, phases, start, log)
            measured = True
        if phase in phases:
            t = time.monotonic()
            log(f"{phase}: start")
            try:
                RUNNERS[phase](ctx)
            except Exception as exc:  # a phase that cannot run is a failed check, and the rest still run
                report.check(phase, "phase ran", False, f"{type(exc).__name__}: {exc}")
            report.figures.setdefault("phase_s", {})[phase] = round(time.monotonic() - t, 1)
    report.figures["elapsed_s"] = round(time.monotonic() - start, 1)
    finish(report, args.json)
    return EXIT_OK if report.passed else EXIT_FAILED


def _memory(
    sampler: RssSampler | None,
    report: Report,
    s: Settings,
    phases: list[str],
    start: float,
    log: Callable[[str], None],
) -> None:
    # phases that ran faster than the check's minimum would skip it: sample the idle stub until then
    left = s.memory_min_run_s - (time.monotonic() - start)
    if sampler is not None and "memory" in phases and left > 0:
        log(f"memory: sampling the stub {left:.0f} s more (--memory-min-run-s {s.memory_min_run_s:g})")
        time.sleep(left)
    if sampler is not None:
        sampler.stop()
    if "memory" in phases:
        memory_checks(sampler, report, s, time.monotonic() - start)
