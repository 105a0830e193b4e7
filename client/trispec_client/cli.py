"""specdec-client: send a prompt to the specdec model on Triton and print the text as it arrives.

Exit status: 0 ok, 2 bad arguments (here or INVALID_ARGUMENT from the server), 3 timeout,
1 any other server or connection error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections.abc import Iterator
from typing import TextIO

from trispec_client.client import (
    DEFAULT_MODEL,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT_S,
    DEFAULT_URLS,
    PROTOCOLS,
    SpecDecClient,
)
from trispec_client.errors import InvalidRequestError, SpecDecError, SpecDecTimeoutError
from trispec_client.results import Completion, StreamChunk, collect
from trispec_client.resume import DEFAULT_RESUME_TIMEOUT_S
from trispec_client.routing import DEFAULT_PREFIX_CHARS, DEFAULT_ROUTING, ROUTINGS

PROG = "specdec-client"
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_TIMEOUT, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be finite and > 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    gen = commands.add_parser(
        "generate", help="generate text for one prompt", description="Generate text for TEXT."
    )
    gen.add_argument("text", metavar="TEXT", help="the prompt")
    gen.add_argument(
        "--url",
        action="append",
        help=f"server address (default: {DEFAULT_URLS['grpc']} for grpc, {DEFAULT_URLS['http']} for http); "
        "repeat it or separate with commas to name several replicas of the model: a request that cannot "
        "reach one tries the others, and a stream one of them cut resumes on another",
    )
    gen.add_argument("--protocol", choices=PROTOCOLS, default="grpc", help="default: grpc")
    gen.add_argument("--model", default=DEFAULT_MODEL, help=f"model name (default: {DEFAULT_MODEL})")
    gen.add_argument(
        "--stream",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="print text as it is verified (default); --no-stream asks for one response at the end",
    )
    gen.add_argument("--max-tokens", type=int)
    gen.add_argument("--num-draft-tokens", type=int, help="draft tokens per round (0: plain decoding)")
    gen.add_argument("--temperature", type=float)
    gen.add_argument("--top-k", type=int)
    gen.add_argument("--top-p", type=float)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    gen.add_argument(
        "--cache-salt",
        metavar="SALT",
        help="share KV-cache blocks only with requests that send the same salt (a tenant's secret: "
        "without it, how fast a prompt starts can tell what others sent)",
    )
    gen.add_argument(
        "--routing",
        choices=ROUTINGS,
        default=DEFAULT_ROUTING,
        help="with several replicas: prefix (default) sends requests that begin alike (a conversation) "
        "to the same replica, whose prefix cache holds them; round-robin takes them in turn",
    )
    gen.add_argument(
        "--route-prefix-chars",
        type=int,
        default=DEFAULT_PREFIX_CHARS,
        metavar="N",
        help=f"prefix routing: how many leading characters place a request (default: {DEFAULT_PREFIX_CHARS})",
    )
    gen.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"whole-request deadline (default: {DEFAULT_TIMEOUT_S:g})",
    )
    gen.add_argument(
        "--retries",
        type=int,
        default=DEFAULT_RETRIES,
        metavar="N",
        help="send a request the server refused for now (full queue) or could not take again, up to N "
        f"times within the deadline (default: {DEFAULT_RETRIES})",
    )
    gen.add_argument(
        "--resume",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="resume a stream the server cut (it crashed or restarted) exactly where it stopped, with the "
        "same seed; a resumed stream that differs ends in an error, never a spliced text (default); "
        "--no-resume: such a stream ends in an error",
    )
    gen.add_argument(
        "--resume-timeout",
        type=_seconds,
        default=DEFAULT_RESUME_TIMEOUT_S,
        metavar="SECONDS",
        help="per resume: how long to wait for the model to be ready again "
        f"(default: {DEFAULT_RESUME_TIMEOUT_S:g})",
    )
    gen.add_argument("--json", action="store_true", help="print one JSON object at the end instead of text")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def summary(completion: Completion) -> str:
    """The one-line stderr summary: tokens, finish reason, speculation totals."""
    head = f"{completion.token_count} tokens, {completion.finish_reason or 'unknown'}"
    if completion.cached_tokens:
        head += f", {completion.cached_tokens} prompt tokens cached"
    if completion.seed is not None:
        head += f", seed {completion.seed}"
    s = completion.stats
    if s is None:
        return f"[{head}]"
    resumed = f"; resumed {s.resumed}" if s.resumed else ""
    return (
        f"[{head}; drafted {s.draft_tokens}, accepted {s.accepted_tokens} ({s.acceptance_rate:.0%}), "
        f"mean accepted length {s.mean_accepted_length:.2f}{resumed}]"
    )


def run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    params = {
        "max_tokens": args.max_tokens,
        "num_draft_tokens": args.num_draft_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "seed": args.seed,
        "stop_words": args.stop,
        "cache_salt": args.cache_salt,
    }
    client = SpecDecClient(
        args.url,
        protocol=args.protocol,
        model=args.model,
        timeout_s=args.timeout,
        retries=args.retries,
        resume=args.resume,
        resume_timeout_s=args.resume_timeout,
        routing=args.routing,
        route_prefix_chars=args.route_prefix_chars,
    )
    with client:
        if args.stream:
            # closing(): an interrupt or error leaves the loop early and must cancel the request on the server
            with contextlib.closing(client.stream(args.text, **params)) as chunks:
                completion = collect(chunks if args.json else _echo(chunks, stdout))
        else:
            # without the prompt, so that --no-stream prints what --stream would
            completion = client.generate(args.text, exclude_input_in_output=True, **params)
            if not args.json:
                _write_text(stdout, completion.text, end_line=True)
    if args.json:
        stdout.write(json.dumps(completion.to_dict(), ensure_ascii=False) + "\n")
        stdout.flush()
    else:
        stderr.write(summary(completion) + "\n")
    return EXIT_OK


def _echo(chunks: Iterator[StreamChunk], stdout: TextIO) -> Iterator[StreamChunk]:
    """Pass chunks through, printing each one's text at once; end the line however the stream ends."""
    printed = ""
    try:
        for chunk in chunks:
            if chunk.text:
                _write_text(stdout, chunk.text)
                printed = chunk.text
            yield chunk
    finally:
        if printed and not printed.endswith("\n"):
            _write_text(stdout, "\n")


def _write_text(stdout: TextIO, text: str, *, end_line: bool = False) -> None:
    stdout.write(text + ("\n" if end_line and text and not text.endswith("\n") else ""))
    stdout.flush()


def main(argv: list[str] | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Entry point; returns the exit status (usage errors included, instead of raising SystemExit)."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # argparse: usage error (2) or --help (0)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return run(args, stdout, stderr)
    except KeyboardInterrupt:
        stderr.write(f"{PROG}: interrupted\n")
        return EXIT_INTERRUPTED
    except (SpecDecError, ValueError) as exc:
        stderr.write(f"{PROG}: error: {exc}\n")
        return exit_code(exc)


def exit_code(exc: BaseException) -> int:
    """Bad arguments (ours or the server's INVALID_ARGUMENT) 2, timeout 3, other failures 1."""
    if isinstance(exc, SpecDecTimeoutError):
        return EXIT_TIMEOUT
    if isinstance(exc, InvalidRequestError | ValueError):
        return EXIT_USAGE
    return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
