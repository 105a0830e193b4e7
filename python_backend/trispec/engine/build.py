"""Build a ``Transformer`` from a HF-named state dict: fuse q/k/v and gate/up, fold the RMSNorm
weights into the next matmul, pick each layer's kind (dense, int8, GGUF blocks) and move it to the
device tensor by tensor as it is built (never a second full copy of the weights)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from trispec.c_kernels import warn_missing
from trispec.engine.args import ModelArgs
from trispec.engine.cpu.linear import DenseLinear, GGUFLinear, Int8Linear, Linear, RowSplitLinear
from trispec.engine.cpu.quant_blocks import QuantBlocks
from trispec.engine.gguf_wiring import gguf_blocks_of
from trispec.engine.model import LayerWeights, Transformer
from trispec.errors import ConfigError

_HF_LAYER = "model.layers.{}."


def build_transformer(
    args: ModelArgs,
    state_dict: Mapping[str, torch.Tensor],
    *,
    dtype: torch.dtype = torch.float32,
    weight_quant: str | None = None,
    rope_length: int | None = None,
    attention: str = "auto",
    device: torch.device | None = None,
    head_ids: torch.Tensor | None = None,
) -> Transformer:
    """Fuse a HF-named state dict (``model.layers.N.self_attn.q_proj.weight`` ...) into our layout.

    ``weight_quant="int8"``: every linear layer (and the embedding / LM head) becomes weight-only
    int8 with per-output-channel scales; activations run in ``dtype`` (bfloat16 is the fast path).
    ``weight_quant="gguf"``: the linear layers, embedding and LM head keep a GGUF file's own blocks
    (the state dict must come from one; float32 activations, CPU); a tensor of a type the GGUF kernel
    does not decode falls back to dense float32 (its whole fused layer).
    ``device``: where the weights go, tensor by tensor as they are built (default CPU).
    ``head_ids``: the LM head computes only these token ids (sorted; a draft's ``draft_vocab``: a
    smaller head read per step); ``Transformer.forward`` gives the others -inf.
    """
    if weight_quant not in (None, "int8", "gguf"):
        raise ConfigError("weight_quant", f"unsupported weight_quant {weight_quant!r} (None, 'int8', 'gguf')")
    device = device or torch.device("cpu")
    if device.type == "cpu":
        warn_missing()  # what runs in place of a kernel that did not build, said once
    if weight_quant == "int8" and device.type != "cpu":
        raise ConfigError("precision", "int8 weight-only runs on CPU; on a GPU use bfloat16")
    blocks_of = gguf_blocks_of(state_dict, weight_quant, dtype, device)
    if head_ids is not None:
        head_ids = _checked_ids(head_ids, args.vocab_size)

    def head_rows(weight: torch.Tensor) -> torch.Tensor:
        return _rows(weight, head_ids)

    def get(name: str) -> torch.Tensor:
        if name not in state_dict:
            raise ConfigError("checkpoint", f"missing tensor {name!r}")
        return float32_on(state_dict, name, device)

    def linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
        b = None if bias is None else bias.to(dtype).to(device)
        if weight_quant == "int8":
            return Int8Linear.from_float(weight, b, dtype=dtype)
        return DenseLinear(weight.to(dtype).to(device), b)  # prepacked on CPU only

    def fused(
        names: list[str], norm: torch.Tensor | None, bias: torch.Tensor | None = None
    ) -> tuple[Linear, torch.Tensor | None]:
        """The layer of these tensors side by side, with the norm before it folded in, or (GGUF blocks)
        kept to be multiplied in: (layer, norm weight still to apply)."""
        parts = blocks_of(names)
        if parts is not None:
            return GGUFLinear(parts, bias), norm
        weight = torch.cat([get(n) for n in names])
        return linear(weight if norm is None else weight.mul_(norm), bias), None

    layers = []
    for i in range(args.num_layers):
        p = _HF_LAYER.format(i)
        qkv_b = (
            torch.cat([get(p + f"self_attn.{n}_proj.bias") for n in "qkv"]) if args.attention_bias else None
        )
        o_b = get(p + "self_attn.o_proj.bias") if args.o_bias else None
        qkv, attn_norm = fused(
            [p + f"self_attn.{n}_proj.weight" for n in "qkv"], get(p + "input_layernorm.weight"), qkv_b
        )
        gate_up, mlp_norm = fused(
            [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], get(p + "post_attention_layernorm.weight")
        )
        layers.append(
            LayerWeights(
                qkv=qkv,
                o=fused([p + "self_attn.o_proj.weight"], None, o_b)[0],
                gate_up=gate_up,
                down=fused([p + "mlp.down_proj.weight"], None)[0],
                attn_norm=attn_norm,
                mlp_norm=mlp_norm,
            )
        )

    def head_on(blocks: list[QuantBlocks]) -> Linear:
        return GGUFLinear([QuantBlocks(b.ggml_type, _rows(b.data, head_ids), b.columns) for b in blocks])

    def untied_head() -> Linear:
        """``lm_head.weight`` on its GGUF blocks where the kernel decodes them, else dense."""
        blocks = blocks_of(["lm_head.weight"])
        return head_on(blocks) if blocks is not None else linear(head_rows(get("lm_head.weight")))

    embed_blocks = blocks_of(["model.embed_tokens.weight"])
    embed_scales = None
    if embed_blocks is not None:
        embed = embed_blocks[0].data
        lm_head: Linear = untied_head() if not args.tie_embeddings else head_on(embed_blocks)
    elif weight_quant == "int8":
        embed_q = Int8Linear.from_float(get("model.embed_tokens.weight"), None, dtype=dtype)
        embed, embed_scales = embed_q.weight, embed_q.scales
        # one int8 table serves lookup and a tied LM head (a head of some ids: a copy of their rows)
        if not args.tie_embeddings:
            lm_head = linear(head_rows(get("lm_head.weight")))
        elif head_ids is None:
            lm_head = embed_q
        else:
            lm_head = Int8Linear(head_rows(embed_q.weight), head_rows(embed_q.scales), None)
    else:
        embed = get("model.embed_tokens.weight").to(dtype).contiguous().to(device)
        if args.tie_embeddings:
            lm_head = DenseLinear(head_rows(embed))
        elif weight_quant == "gguf":  # the embedding's type is not decoded: the head may still be
            lm_head = untied_head()
        else:
            lm_head = dense_head(state_dict, args, dtype, device, head_ids)
    return Transformer(
        args,
        head_ids=head_ids,
        embed=embed,
        layers=layers,
        norm=get("model.norm.weight").to(dtype).to(device),
        lm_head=lm_head,
        embed_scales=embed_scales,
        embed_blocks=None if embed_blocks is None else embed_blocks[0],
        dtype=dtype,
        rope_length=rope_length,
        attention=attention,
    )


def dense_head(
    state_dict: Mapping[str, torch.Tensor],
    args: ModelArgs,
    dtype: torch.dtype,
    device: torch.device,
    head_ids: torch.Tensor | None = None,
) -> Linear:
    """An untied LM head (of the rows ``head_ids``, sorted, where given); for a large vocabulary
    on CPU in blocks of rows, read block by block."""
    name = "lm_head.weight"
    if name not in state_dict:
        raise ConfigError("checkpoint", f"missing tensor {name!r}")
    block = HEAD_BLOCK_ROWS
    if args.vocab_size <= block or device.type != "cpu":
        return DenseLinear(_rows(float32_on(state_dict, name, device), head_ids).to(dtype))
    rows = getattr(state_dict, "rows", lambda n, a, b: state_dict[n][a:b])
    parts = []
    for start in range(0, args.vocab_size, block):
        stop = min(start + block, args.vocab_size)
        if head_ids is None:
            parts.append(DenseLinear(rows(name, start, stop).to(dtype).contiguous()))
            continue
        inside = head_ids[(head_ids >= start) & (head_ids < stop)] - start
        if inside.numel():  # the block's rows the head keeps, in id order
            parts.append(DenseLinear(rows(name, start, stop).index_select(0, inside).to(dtype).contiguous()))
    return RowSplitLinear(parts)


def _checked_ids(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    ids = torch.as_tensor(ids, dtype=torch.int64).cpu()
    if ids.ndim != 1 or not ids.numel() or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"head_ids: a non-empty list of ids in 0..{vocab_size - 1}")
    if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise ValueError("head_ids: sorted, each id once")
    return ids


def _rows(weight: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
    """Rows ``ids`` of ``weight`` (an LM head of some ids), or all of it."""
    return weight if ids is None else weight.index_select(0, ids.to(weight.device))


# rows per block of a large untied LM head (see RowSplitLinear)
HEAD_BLOCK_ROWS = 32768


def float32_on(state_dict: Mapping[str, torch.Tensor], name: str, device: torch.device) -> torch.Tensor:
    """The tensor in float32 (the build folds norms and fuses in float32, then rounds once). For a
    GPU it travels as stored (bf16 safetensors: half the bytes, no float32 copy on the host) and
    is widened there: the same values."""
    stored = getattr(state_dict, "stored", None)
    if device.type != "cpu" and stored is not None:
        return stored(name).to(device).to(torch.float32)
    return state_dict[name].detach().to(torch.float32)
