"""What the benchmark compares: arms (plain, a drafter at a fixed k, a drafter under adaptive k) and
the drafters they name, built from the YAML config the way serving builds them.

Drafter names (``--drafters``):

``self-int8``, ``self-bf16``
    the target's own weights at lower precision (int8 weight-only, or bfloat16).
``model``, ``model-int8``, ``model-bf16``, ``model-fp32``, ``model-gguf``
    the config's ``drafter.model`` checkpoint: at the config's precision, or the one named (``gguf``:
    its own GGUF blocks, float32).
``ngram``, ``suffix``
    model-free: prompt lookup, suffix decoding (settings from the config's ``drafter`` section).
``<model drafter>/<N>``, ``<model drafter>/full``
    that model drafter with ``drafter.draft_vocab`` N (its head computes N token ids only,
    ``drafters/draft_vocab.py``), or the whole vocabulary; before ``+suffix`` where both are given
    (``model/65536+suffix``).
``<model drafter>+suffix``
    that model drafter with suffix decoding beside it (``drafter.with_suffix``).
"""

from __future__ import annotations

from dataclasses import dataclass

from trispec.config import SpecDecConfig
from trispec.drafters.base import Drafter
from trispec.engine.torch_engine import TorchEngine
from trispec.errors import ConfigError
from trispec.runners.torch_build import Checkpoint, build_draft_engine, make_drafter

MODEL_FREE = ("ngram", "suffix")
_PRECISIONS = {"int8": "int8", "bf16": "bfloat16", "fp32": None, "gguf": "gguf"}
_SHORT = {"int8": "int8", "bfloat16": "bf16", "gguf": "gguf"}
PLAIN = "plain"


@dataclass(frozen=True)
class Arm:
    name: str  # plain, <drafter>-k<N>, <drafter>-adaptive
    drafter: str | None  # None: plain decoding (k = 0, same loop)
    k: int  # the request's k: fixed, or the cap under adaptive
    adaptive: bool


def make_arms(drafters: list[str], ks: list[int], adaptive: bool, fixed: bool) -> list[Arm]:
    arms = [Arm(PLAIN, None, 0, False)]
    for name in drafters:
        if fixed:
            arms += [Arm(f"{name}-k{k}", name, k, False) for k in ks]
        if adaptive:
            arms.append(Arm(f"{name}-adaptive", name, max(ks), True))
    return arms


def config_drafter_name(config: SpecDecConfig) -> str | None:
    """The name of the drafter the config itself sets up (None for kind none)."""
    d = config.drafter
    if d.kind == "none":
        return None
    if d.kind in MODEL_FREE:
        return d.kind
    if d.kind == "self":
        name = "self-int8" if d.precision == "int8" else "self-bf16"
    else:
        name = "model" if d.precision is None else f"model-{_SHORT[d.precision]}"
    return name + "+suffix" if d.with_suffix else name


def default_drafters(config: SpecDecConfig) -> list[str]:
    """The config's own drafter, then suffix decoding."""
    names = [n for n in (config_drafter_name(config), "suffix") if n is not None]
    return list(dict.fromkeys(names))


def variant(config: SpecDecConfig, name: str) -> SpecDecConfig:
    """``config`` with its drafter section set up as ``name`` says."""
    base = name.removesuffix("+suffix")
    with_suffix = base != name
    base, vocab = _draft_vocab(base, config.drafter.draft_vocab)
    d = config.drafter.model_copy(update={"draft_vocab": vocab})
    if base in MODEL_FREE:
        if with_suffix:
            raise ConfigError("--drafters", f"{name!r}: +suffix goes with a model drafter")
        if vocab != config.drafter.draft_vocab:
            raise ConfigError("--drafters", f"{name!r}: /<draft_vocab> goes with a model drafter")
        update: dict[str, object] = {"kind": base, "model": None, "with_suffix": False, "draft_vocab": None}
    elif base in ("self-int8", "self-bf16"):
        precision = "int8" if base == "self-int8" else "bfloat16"
        update = {"kind": "self", "precision": precision, "model": None, "with_suffix": with_suffix}
    elif base == "model" or base.startswith("model-"):
        if d.model is None:
            raise ConfigError("--drafters", f"{name!r} needs a drafter.model section in the config")
        suffix = base.removeprefix("model").removeprefix("-")
        if suffix and suffix not in _PRECISIONS:
            raise ConfigError("--drafters", f"unknown precision in {name!r} (int8, bf16, fp32, gguf)")
        precision = _PRECISIONS[suffix] if suffix else d.precision
        update = {"kind": "model", "precision": precision, "with_suffix": with_suffix}
        if suffix == "fp32":
            update["model"] = d.model.model_copy(update={"dtype": "float32", "weights": "dense"})
        elif suffix:  # the precision named replaces the model's own weights setting
            update["model"] = d.model.model_copy(update={"weights": "dense"})
    else:
        raise ConfigError("--drafters", f"unknown drafter {name!r}")
    return config.model_copy(update={"drafter": d.model_copy(update=update)})


def _draft_vocab(base: str, default: int | None) -> tuple[str, int | None]:
    """``model/65536`` -> (``model``, 65536); ``model/full`` -> (``model``, None); no tail: the
    config's own ``draft_vocab``."""
    base, slash, tail = base.partition("/")
    if not slash:
        return base, default
    if tail == "full":
        return base, None
    if not tail.isdigit() or int(tail) < 1:
        raise ConfigError("--drafters", f"{base}/{tail}: the draft vocabulary is a positive number or 'full'")
    return base, int(tail)


class DrafterPool:
    """Fresh drafters by name around draft engines built once: every run gets clean model-free state
    (a suffix drafter's global index must not remember another arm's outputs of the same prompts),
    while the draft weights load only once."""

    def __init__(self, config: SpecDecConfig, target_checkpoint: Checkpoint, target: TorchEngine) -> None:
        self.config = config
        self.target_checkpoint = target_checkpoint
        self.target = target
        self._engines: dict[str, TorchEngine | None] = {}

    def engine(self, name: str) -> TorchEngine | None:
        """The draft engine behind ``name`` (None for model-free drafters), built on first use."""
        base = name.removesuffix("+suffix")
        if base not in self._engines:
            self._engines[base] = build_draft_engine(variant(self.config, base), self.target_checkpoint)
        return self._engines[base]

    def engines(self) -> list[TorchEngine]:
        """The draft engines built so far."""
        return [e for e in self._engines.values() if e is not None]

    def fresh(self, name: str) -> Drafter:
        drafter = make_drafter(variant(self.config, name), self.engine(name), self.target)
        assert drafter is not None
        return drafter
