"""The Hugging Face export (what TensorRT-LLM's converters and LLM API read) round-trips: loaded back
by our loader it gives the original's logits bit for bit, and transformers' own model on the
exported folder agrees within 1e-5 (fp32). On the real SmolLM2 GGUF and on tiny Llama/Qwen2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import save_file
from tiny import ascii_tokenizer, tiny_args
from trispec.config import CheckpointConfig, ModelConfig
from trispec.engine.base import ForwardInput
from trispec.engine.random_weights import random_state_dict
from trispec.engine.torch_engine import TorchEngine
from trispec.engine.weights import load_checkpoint
from trispec_build.hf_export import FILES, export_hf

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]


def logits(engine: TorchEngine, ids: list[int]) -> torch.Tensor:
    engine.add_sequence(0, len(ids))
    try:
        return engine.forward([ForwardInput(0, ids, len(ids))])[0]
    finally:
        engine.free(0)


def hf_logits(model: transformers.PreTrainedModel, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def assert_round_trip(source: Path, exported: Path, prompts_ids: list[list[int]]) -> None:
    assert all((exported / name).is_file() for name in FILES)
    original = TorchEngine.from_checkpoint(source, dtype="float32")
    again = TorchEngine.from_checkpoint(exported, dtype="float32")
    src_args, src_sd = load_checkpoint(source)
    out_args, out_sd = load_checkpoint(exported)
    assert out_args == src_args
    assert set(out_sd) == set(src_sd) and all(torch.equal(out_sd[k], src_sd[k]) for k in src_sd)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(exported, torch_dtype=torch.float32)
    for ids in prompts_ids:
        ours = logits(original, ids)
        assert torch.equal(logits(again, ids), ours)
        ref = hf_logits(hf_model, ids)
        assert float((ref - ours).abs().max() / ours.abs().max()) <= 1e-5


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_export_round_trips(tmp_path: Path, arch: str) -> None:
    args = tiny_args(arch, tie_embeddings=arch == "llama")
    source = tmp_path / "source"
    source.mkdir()
    state = random_state_dict(args, 3)
    save_file(state, str(source / "model.safetensors"))
    (source / "config.json").write_text(json.dumps(args.to_hf_config()))
    ascii_tokenizer().backend.save(str(source / "tokenizer.json"))
    model = ModelConfig(checkpoint=CheckpointConfig(path=source))
    exported = export_hf(model, "target", tmp_path / "hf")
    assert_round_trip(source, exported, [[5, 9, 2, 77, 300], [1, 2, 3]])
    config = json.loads((exported / "config.json").read_text())
    assert config["model_type"] == arch and config["torch_dtype"] == "float32"


@pytest.mark.real_model
def test_smollm2_export_round_trips(tmp_path: Path) -> None:
    """``specdec-build --export-hf`` on the default config (the real SmolLM2-135M GGUF)."""
    from trispec.checkpoints import cache_dir, smollm2_gguf
    from trispec.gguf_tokenizer import load_tokenizer_for_gguf

    run = subprocess.run(
        [str(Path(sys.executable).parent / "specdec-build"), "--export-hf", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    exported = tmp_path / "target"
    ours = load_tokenizer_for_gguf(smollm2_gguf(), cache_dir())
    assert_round_trip(smollm2_gguf(), exported, [ours.encode(p) for p in PROMPTS])
    # the tokenizer files: transformers reads them to the same ids, special tokens and chat template
    hf_tok = transformers.AutoTokenizer.from_pretrained(exported)
    for prompt in [*PROMPTS, "  two spaces 12345 émoji 😀"]:
        assert hf_tok.encode(prompt, add_special_tokens=False) == ours.encode(prompt)
    assert hf_tok.eos_token_id == ours.eos_id
    messages = [{"role": "user", "content": "Hi!"}]
    assert hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        ours.apply_chat_template(messages)
    )
