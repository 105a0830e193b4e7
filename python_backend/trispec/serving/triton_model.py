"""The Triton Python-backend model ``specdec``: a thin shim over the serving loop.

``model_repository/specdec/1/model.py`` only re-exports :class:`TritonPythonModel`. ``execute()``
validates each request and hands it to the loop, then returns at once (the model is decoupled);
responses are sent from the loop's thread. Bad input gets an INVALID_ARG error naming the tensor.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from trispec.errors import InvalidInputError
from trispec.serving.loop import ServingLoop
from trispec.serving.tensors import as_tensor_error, parse_inputs

# model config parameter holding the YAML path; empty means the built-in default config
CONFIG_PARAMETER = "specdec_config"

logger = logging.getLogger(__name__)


def config_path_from(model_config: dict[str, Any]) -> Path | None:
    value = model_config.get("parameters", {}).get(CONFIG_PARAMETER, {}).get("string_value", "")
    return Path(value) if value else None


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

    def send_error(self, message: str, invalid_argument: bool = False) -> None:
        pb = self._pb
        code = pb.TritonError.INVALID_ARG if invalid_argument else pb.TritonError.INTERNAL
        response = pb.InferenceResponse(error=pb.TritonError(message, code))
        self._sender.send(response, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils  # only importable inside the Python stub

        from trispec.config import load_config
        from trispec.llm import SpeculativeLLM
        from trispec.serving.metrics import TritonMetrics

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        self.pb_utils = pb_utils
        model_config = json.loads(args["model_config"])
        config = load_config(config_path_from(model_config))
        self.llm = SpeculativeLLM.from_config(config)
        self.defaults = config.defaults
        self.loop = ServingLoop(self.llm.engine, TritonMetrics(pb_utils, args["model_name"]))
        self.loop.start()
        logger.info("specdec ready: drafter %s, scheduler %s", config.drafter.kind, config.scheduler)

    def execute(self, requests: list[Any]) -> None:
        pb = self.pb_utils
        for request in requests:
            sink = TritonResponseSink(pb, request)

            def get(name: str, request: Any = request) -> np.ndarray | None:
                tensor = pb.get_input_tensor_by_name(request, name)
                return None if tensor is None else tensor.as_numpy()

            try:
                self.loop.submit(parse_inputs(get, self.defaults), sink)
            except InvalidInputError as exc:
                sink.send_error(str(as_tensor_error(exc)), invalid_argument=True)
            except Exception as exc:
                logger.exception("could not queue a request")
                sink.send_error(f"{type(exc).__name__}: {exc}")
        # decoupled: every response is sent by the loop thread
        return None

    def finalize(self) -> None:
        self.loop.stop()
