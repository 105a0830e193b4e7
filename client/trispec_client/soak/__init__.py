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

from trispec_client.soak.cli import (
    DEFAULT_PHASES,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    PHASES,
    PROG,
    SHORT,
    build_parser,
    main,
    settings_from,
)
from trispec_client.soak.context import Settings, Soak
from trispec_client.soak.memory import memory_checks
from trispec_client.soak.report import Check, Outcome, Report, render
from trispec_client.soak.stream import NEVER_END_ID, PROMPTS, REFUSAL, is_refusal, pct, run_stream
from trispec_client.soak.target import (
    STUB_NAME,
    RssSampler,
    Server,
    find_stub,
    is_loopback,
    split_host_port,
)

__all__ = [
    "DEFAULT_PHASES",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "NEVER_END_ID",
    "PHASES",
    "PROG",
    "PROMPTS",
    "REFUSAL",
    "SHORT",
    "STUB_NAME",
    "Check",
    "Outcome",
    "Report",
    "RssSampler",
    "Server",
    "Settings",
    "Soak",
    "build_parser",
    "find_stub",
    "is_loopback",
    "is_refusal",
    "main",
    "memory_checks",
    "pct",
    "render",
    "run_stream",
    "settings_from",
    "split_host_port",
]
