"""Export a model section of the config (GGUF or safetensors) as a Hugging Face directory.

What TensorRT-LLM's ``convert_checkpoint.py`` and its LLM API read: ``config.json``,
``model.safetensors`` (float32, HF tensor names), ``tokenizer.json`` + ``tokenizer_config.json`` +
``special_tokens_map.json``, and ``generation_config.json``. Weights come through the same loader the
engine uses (GGUF dequantised, llama q/k un-permuted), so the export is exactly what we serve.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trispec.checkpoints import load_tokenizer, resolve_checkpoint
from trispec.config import ModelConfig
from trispec.engine.args import ModelArgs
from trispec.tokenizer import Tokenizer

FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)


def export_hf(model: ModelConfig, field: str, out_dir: Path) -> Path:
    """Write the HF directory for ``model`` (``field`` names it in errors); returns ``out_dir``."""
    from safetensors.torch import save_file
    from trispec.engine.weights import load_checkpoint

    weights = resolve_checkpoint(model.checkpoint, f"{field}.checkpoint")
    args, state_dict = load_checkpoint(weights)
    tokenizer = load_tokenizer(model, field)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: tensor.contiguous()
        for name, tensor in state_dict.items()
        if not (args.tie_embeddings and name == "lm_head.weight")
    }
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    write_json(out_dir / "config.json", hf_config(args, tokenizer))
    tokenizer.backend.save(str(out_dir / "tokenizer.json"))
    special = special_tokens(tokenizer)
    write_json(out_dir / "special_tokens_map.json", special)
    write_json(
        out_dir / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **special,
            "add_bos_token": tokenizer.info.add_bos,
            "clean_up_tokenization_spaces": False,
            "model_max_length": args.max_position_embeddings,
            **({"chat_template": tokenizer.info.chat_template} if tokenizer.info.chat_template else {}),
        },
    )
    write_json(
        out_dir / "generation_config.json",
        {
            k: v
            for k, v in {
                "bos_token_id": tokenizer.bos_id,
                "eos_token_id": sorted(tokenizer.eos_ids) or tokenizer.eos_id,
                "pad_token_id": tokenizer.info.pad_id,
            }.items()
            if v is not None
        },
    )
    return out_dir


def hf_config(args: ModelArgs, tokenizer: Tokenizer) -> dict[str, Any]:
    config = {**args.to_hf_config(), "torch_dtype": "float32"}
    for key, value in (
        ("bos_token_id", tokenizer.bos_id),
        ("eos_token_id", tokenizer.eos_id),
        ("pad_token_id", tokenizer.info.pad_id),
    ):
        if value is not None:
            config[key] = value
    return config


def special_tokens(tokenizer: Tokenizer) -> dict[str, str]:
    backend = tokenizer.backend
    tokens = {
        "bos_token": tokenizer.bos_id,
        "eos_token": tokenizer.eos_id,
        "pad_token": tokenizer.info.pad_id,
    }
    return {
        key: backend.id_to_token(i) for key, i in tokens.items() if i is not None and backend.id_to_token(i)
    }


def write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """``python -m trispec_build.hf_export MODEL_JSON FIELD OUT_DIR``: one model section (as JSON)
    exported, for tools of the runtime package that must not import this one (the benchmark's Hugging
    Face reference)."""
    import sys

    model_json, field, out_dir = argv if argv is not None else sys.argv[1:]
    export_hf(ModelConfig.model_validate_json(model_json), field, Path(out_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
