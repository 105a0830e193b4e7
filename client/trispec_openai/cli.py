"""``specdec-openai``: the OpenAI-compatible HTTP endpoint, in front of a running Triton over gRPC.

It holds no model: it renders chat templates, counts and splits tokens with the served model's
tokenizer (read from the same ``--config`` the server runs), and forwards generation to Triton, so any
number of them can run beside one or more Triton servers.
"""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn
from trispec.errors import ConfigError
from trispec_client.resume import DEFAULT_RESUME_TIMEOUT_S
from trispec_client.routing import DEFAULT_PREFIX_CHARS, DEFAULT_ROUTING, ROUTINGS

from trispec_openai.app import create_app
from trispec_openai.tokens import ServedTokenizer
from trispec_openai.triton import TritonGenerator


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="specdec-openai", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--triton-url",
        action="append",
        help="Triton's gRPC address (default: localhost:8001); repeat it or separate with commas to name "
        "several replicas of the model: a generation that cannot reach one tries the others, and one cut "
        "on a replica resumes on another serving the same model",
    )
    parser.add_argument("--model", default="specdec", help="the Triton model to call")
    parser.add_argument(
        "--served-model-name", default=None, help="the name clients send as 'model' (default: --model)"
    )
    parser.add_argument(
        "--config",
        default=None,
        help="the YAML the server runs, for its tokenizer and chat template (default: built-in); a "
        "server running another tokenizer refuses this endpoint's requests (500 tokenizer_mismatch)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument(
        "--request-timeout", type=float, default=600.0, help="seconds a generation may take (gRPC deadline)"
    )
    parser.add_argument(
        "--resume",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="resume a generation Triton cut (its stub or server died and was restarted) exactly, so the "
        "client sees one uninterrupted answer (default); --no-resume: answer it with an error",
    )
    parser.add_argument(
        "--resume-timeout",
        type=float,
        default=DEFAULT_RESUME_TIMEOUT_S,
        help="per resume: seconds to wait for the model to be ready again",
    )
    parser.add_argument(
        "--routing",
        choices=ROUTINGS,
        default=DEFAULT_ROUTING,
        help="with several replicas: prefix (default) sends generations that begin alike (a conversation) "
        "to the same replica, whose prefix cache holds them; round-robin takes them in turn",
    )
    parser.add_argument(
        "--route-prefix-chars",
        type=int,
        default=DEFAULT_PREFIX_CHARS,
        help="prefix routing: how many leading characters place a generation "
        f"(default: {DEFAULT_PREFIX_CHARS})",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        tokenizer = ServedTokenizer.from_config(args.config)
    except ConfigError as exc:
        print(f"specdec-openai: {exc}", file=sys.stderr)
        return 2
    generator = TritonGenerator(
        args.triton_url or "localhost:8001",
        args.model,
        args.request_timeout,
        resume=args.resume,
        resume_timeout_s=args.resume_timeout,
        routing=args.routing,
        route_prefix_chars=args.route_prefix_chars,
        tokenizer_sha256=tokenizer.sha256,
    )
    served = args.served_model_name or args.model
    app = create_app(generator, tokenizer, served)
    print(
        f"specdec-openai: serving {served} on http://{args.host}:{args.port}/v1 "
        f"(Triton gRPC {', '.join(generator.urls)}, model {args.model}; tokenizer {tokenizer.sha256[:16]} "
        f"from {args.config or 'the built-in config'})",
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
