"""The Triton Python-backend model (``specdec`` by default): a thin shim over the serving loop.

``model_repository/<name>/1/model.py`` only re-exports :class:`TritonPythonModel`. ``execute()``
validates each request and hands it to the loop, then returns at once; responses are sent from the
loop's thread through each request's response sender, in both transaction policies (not decoupled:
exactly one response, with the final flag). Bad input (an unknown parameter too) gets an INVALID_ARG
error naming the tensor or key; a full queue gets UNAVAILABLE (retryable); each refusal is counted in
``specdec_requests_rejected_total{reason}`` and logged once.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from trispec.errors import InvalidInputError, Overloaded
from trispec.serving.admin import RESET_INPUT, admin_key_of, authorize, check_reset_alone
from trispec.serving.loop import ErrorKind, Heartbeat, QueueLimits, ServingLoop
from trispec.serving.tensors import as_tensor_error, check_one_response, check_parameters, parse_batch
from trispec.serving.triton_command import ADMIN_KEY_DIGEST_ENV
from trispec.serving.tritonserver import HEARTBEAT_DIR_ENV

if TYPE_CHECKING:
    from trispec.config import SpecDecConfig

# model config parameter holding the YAML path; empty means the built-in default config
CONFIG_PARAMETER = "specdec_config"

# torch's packed fp32 linear (oneDNN, engine/cpu/linear.py) JIT-compiles and caches a kernel per input row
# count: up to 1024 primitives in oneDNN's cache (ONEDNN_PRIMITIVE_CACHE_CAPACITY) and 1024 descriptors
# in ideep's (LRU_CACHE_CAPACITY), each about 1-2 MB. A serving batch has a new row count almost every
# round, so with the defaults the stub's RSS climbed by hundreds of MB for many minutes (memray: the
# memory still held after 600 requests was nearly all oneDNN JIT kernels). Bounded here, before anything
# imports torch (both are read on first use); an operator's own setting wins.
ONEDNN_CACHE_CAPACITY = "64"
for _variable in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
    os.environ.setdefault(_variable, ONEDNN_CACHE_CAPACITY)

logger = logging.getLogger(__name__)


def config_path_from(model_config: dict[str, Any]) -> Path | None:
    value = model_config.get("parameters", {}).get(CONFIG_PARAMETER, {}).get("string_value", "")
    return Path(value) if value else None


def exact_resume_refusal(config: SpecDecConfig) -> str | None:
    """Why this model cannot promise that a request sent again gives the same tokens (so
    ``skip_output_tokens`` > 0 is refused with it), or None: on the CPU torch engine a greedy or
    seeded request gives the same tokens whatever shares the batch (docs/determinism.md)."""
    if config.engine.kind == "trtllm":
        return (
            "the TensorRT-LLM runner (engine.kind trtllm) does not promise batch-invariant outputs, so a "
            "stream sent again may differ from the one cut"
        )
    devices = {"target.device": config.target.device}
    if config.drafter.model is not None:
        devices["drafter.model.device"] = config.drafter.model.device
    for key, device in devices.items():
        if device.startswith("cuda"):
            return (
                f"{key} is {device}: the GPU path is not batch-invariant, so a stream sent again may "
                "differ from the one cut"
            )
    return None


def is_decoupled(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


class TritonResponseSink:
    """One request's response sender, as the loop's ``ResponseSink``."""

    def __init__(self, pb_utils: ModuleType, request: Any) -> None:
        self._pb = pb_utils
        self._sender = request.get_response_sender()

    def is_cancelled(self) -> bool:
        return bool(self._sender.is_cancelled())

    def send(self, tensors: dict[str, np.ndarray], final: bool) -> None:
        pb = self._pb
        response = pb.InferenceResponse(output_tensors=[pb.Tensor(n, a) for n, a in tensors.items()])
        self._sender.send(response, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)

    def send_error(self, message: str, kind: ErrorKind = "internal") -> None:
        pb = self._pb
        code = {
            "internal": pb.TritonError.INTERNAL,
            "invalid": pb.TritonError.INVALID_ARG,
            "unavailable": pb.TritonError.UNAVAILABLE,
        }[kind]
        response = pb.InferenceResponse(error=pb.TritonError(message, code))
        # the error and the final flag in one response: it completes the request (a gRPC stream closes
        # only when every request on it has had its final one) and reaches gRPC clients marked
        # triton_final_response (triton-inference-server/server v2.51.0,
        # src/grpc/stream_infer_handler.cc: params["triton_final_response"].set_bool_param(is_complete));
        # tests/test_bls_peer.py checks every refusal path for it
        self._sender.send(response, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def _refuse(sink: TritonResponseSink, message: str, kind: ErrorKind) -> None:
    """A refused request's one response: the error, with the final flag. If even that cannot be sent,
    say so and go on: raising out of ``execute()`` would leave the rest of the batch unhandled."""
    try:
        sink.send_error(message, kind)
    except Exception:
        logger.exception("could not send a refusal (%s)", message)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils  # only importable inside the Python stub

        from trispec.config import load_config
        from trispec.llm import SpeculativeLLM
        from trispec.serving.fingerprint import (
            drafts_change_text,
            model_fingerprint,
            uses_onednn,
            write_fingerprint,
        )
        from trispec.serving.metrics import TritonMetrics
        from trispec.serving.openmp_team import build_on_own_thread

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        self.pb_utils = pb_utils
        model_config = json.loads(args["model_config"])
        config = load_config(config_path_from(model_config))
        self.decoupled = is_decoupled(model_config)
        # not on this thread: it never exits, and its OpenMP team would slow every barrier of the loop's
        # (serving/openmp_team.py)
        self.llm = build_on_own_thread(lambda: SpeculativeLLM.from_config(config))
        # after loading: the tokenizer files exist, and the built layers say whether the ISA matters
        fingerprint = model_fingerprint(
            config, uses_onednn(self.llm.engine.runner, drafts_change_text(config))
        )
        self.fingerprint = fingerprint.value
        self.tokenizer_sha256 = self.llm.tokenizer.sha256
        self.defaults = config.defaults
        self.max_prompt_bytes = config.serving.max_prompt_bytes
        self.require_cache_salt = config.serving.require_cache_salt
        self.resume_refusal = exact_resume_refusal(config)
        # specdec-serve's: what an operator's reset of the prefix cache is checked against
        self.admin_key_digest = os.environ.get(ADMIN_KEY_DIGEST_ENV)
        limits = QueueLimits(config.scheduler.max_waiting, config.scheduler.max_queue_delay_s)
        # specdec-serve's supervisor watches this file (see tritonserver.HEARTBEAT_DIR_ENV)
        beats = os.environ.get(HEARTBEAT_DIR_ENV)
        heartbeat = Heartbeat(Path(beats) / args["model_instance_name"]) if beats else None
        if beats:  # specdec-serve's ready line says it
            write_fingerprint(Path(beats), args["model_name"], fingerprint.to_json())
        metrics = TritonMetrics(pb_utils, args["model_name"])
        metrics.record_model(fingerprint.value, fingerprint.parts["numerics"])
        self.loop = ServingLoop(self.llm.engine, metrics, limits, heartbeat)
        self.loop.start()
        logger.info(
            "%s ready (decoupled: %s): model fingerprint %s (%s), drafter %s, scheduler %s",
            args["model_name"],
            self.decoupled,
            fingerprint.value,
            fingerprint.parts["numerics"],
            config.drafter.kind,
            config.scheduler,
        )

    def execute(self, requests: list[Any]) -> None:
        pb = self.pb_utils
        for request in requests:
            sink = TritonResponseSink(pb, request)

            def get(name: str, request: Any = request) -> np.ndarray | None:
                tensor = pb.get_input_tensor_by_name(request, name)
                return None if tensor is None else tensor.as_numpy()

            try:
                admin_key, parameters = admin_key_of(request.parameters())
                reset = get(RESET_INPUT)
                if reset is not None and reset.any():  # an operator's, not a generation
                    self._reset_prefix_cache(request, admin_key, sink)
                    continue
                check_parameters(parameters)
                rows = parse_batch(
                    get,
                    self.defaults,
                    self.max_prompt_bytes,
                    self.resume_refusal,
                    self.fingerprint,
                    require_cache_salt=self.require_cache_salt,
                    tokenizer_sha256=self.tokenizer_sha256,
                )
                if not self.decoupled:
                    check_one_response(rows)
                self.loop.submit(rows, sink)
            except InvalidInputError as exc:
                error = as_tensor_error(exc)
                self.loop.reject(exc.reason, request.request_id(), str(error))
                _refuse(sink, str(error), "invalid")
            except Overloaded as exc:
                self.loop.reject(exc.reason, request.request_id(), str(exc))
                _refuse(sink, str(exc), "unavailable")
            except Exception as exc:
                logger.exception("could not queue a request")
                _refuse(sink, f"{type(exc).__name__}: {exc}", "internal")
        # every other response is sent by the loop thread (not decoupled too: the response sender then
        # takes exactly one response per request, with the final flag)
        return None

    def _reset_prefix_cache(self, request: Any, admin_key: str | None, sink: TritonResponseSink) -> None:
        """Queue an operator's reset (``serving/admin.py``) once its key is checked."""
        check_reset_alone([tensor.name() for tensor in request.inputs()])
        authorize(admin_key, self.admin_key_digest)
        self.loop.reset_prefix_cache(sink)

    def finalize(self) -> None:
        self.loop.stop()
