"""``specdec-generate``: run prompts through the speculative in-flight batcher, offline.

All prompts of one call are submitted together and batched in flight.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trispec.errors import InvalidInputError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="specdec-generate", description=__doc__)
    parser.add_argument("--config", type=Path, help="YAML config (default: the built-in SmolLM2 config)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", action="append", help="prompt text (repeat for several)")
    source.add_argument("--prompts-file", type=Path, help='JSONL file, one {"prompt": ...} per line')
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--num-draft-tokens", type=int, help="draft tokens per round (0: plain decoding)")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--json", action="store_true", help="one JSON object per prompt on stdout")
    parser.add_argument(
        "--guide-type",
        choices=["json", "json_schema", "regex", "ebnf_grammar", "structural_tag"],
        help="structured output: the answer follows --guide (docs/openai.md#structured-output)",
    )
    parser.add_argument("--guide", default="", help="the JSON schema, regex or grammar (none for json)")
    return parser.parse_args(argv)


def read_prompts(path: Path) -> list[str]:
    prompts = []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError("prompts_file", f"cannot read {path}: {exc}") from None
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidInputError("prompts_file", f"line {line_no} is not JSON: {exc.msg}") from None
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
            raise InvalidInputError("prompts_file", f'line {line_no} needs a string "prompt"')
        prompts.append(record["prompt"])
    return prompts


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # heavy imports after argument parsing so --help is instant
    from trispec.config import load_config
    from trispec.llm import SpeculativeLLM

    try:
        prompts = args.prompt if args.prompt is not None else read_prompts(args.prompts_file)
        config = load_config(args.config)
        overrides = {
            "max_tokens": args.max_tokens,
            "num_draft_tokens": args.num_draft_tokens,
            "temperature": args.temperature,
            "top_k": args.top_k,
            "top_p": args.top_p,
            "seed": args.seed,
        }
        overrides = {k: v for k, v in overrides.items() if v is not None}
        if args.guide_type:
            from trispec.guided import Guide

            overrides["guide"] = Guide(args.guide_type, args.guide, field="--guide")
        llm = SpeculativeLLM.from_config(config)
        requests = [llm.request(p, stop=tuple(args.stop), **overrides) for p in prompts]
        results = llm.generate(requests)
    except InvalidInputError as exc:
        print(f"specdec-generate: error: {exc}", file=sys.stderr)
        return 2
    for result in results:
        if args.json:
            print(json.dumps(result.to_dict(), ensure_ascii=False))
        else:
            s = result.stats
            print(result.prompt + result.text)
            print(
                f"[{len(result.token_ids)} tokens, {result.finish_reason}; drafted {s.draft_tokens}, "
                f"accepted {s.accepted_tokens} ({s.acceptance_rate:.0%}), "
                f"mean accepted length {s.mean_accepted_length:.2f}"
                + (f", seed {result.seed}]" if result.seed is not None else "]"),
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
