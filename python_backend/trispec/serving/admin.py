"""An operator's reset of the prefix cache, behind the admin key: how the model recognises one, who may
send it, and what it answers.

The only way into a Triton model is an inference request, so a reset is one: a request to the served
model whose one input is ``reset_prefix_cache`` = true, carrying the admin key as a request
parameter named as the header Triton's admin APIs take (``specdec-admin-key``). Over gRPC that is the
header itself: Triton shows a model no header unless told to, and ``specdec-serve`` starts it
forwarding that one as a request parameter (``triton_command.header_forward_flags``). Triton's HTTP
``generate`` endpoint forwards no header (2.51), so there the key is a key of the body, which
becomes a parameter: ``{"reset_prefix_cache": true, "specdec-admin-key": "..."}``. (The reset is an
input, not a parameter: the Python backend reads a batched model's batch size from a request's
first input, so a request needs one.) The stubs get the key's SHA-256 in their environment
(``triton_command.ADMIN_KEY_DIGEST_ENV``; the word ``open`` under ``--open-admin-apis``); a model
started any other way has none and refuses every reset.

What a reset does (``BlockManager.reset_prefix_cache``, run by the serving loop between two steps):
every KV pool's cache, the target's and a draft model's, is emptied; running requests go on, their
blocks untouched, their text the same. vLLM's ``POST /reset_prefix_cache`` and SGLang's
``/flush_cache`` refuse while requests run instead (vLLM preempts them with
``reset_running_requests=true``; vllm/v1/core/block_pool.py ``reset_prefix_cache``, SGLang's
scheduler ``flush_cache``).
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from trispec.errors import InvalidInputError
from trispec.serving.live import ErrorKind, ResponseSink
from trispec.serving.triton_command import ADMIN_KEY_HEADER, OPEN_ADMIN, admin_key_digest
from trispec.step import PrefixCacheReset

if TYPE_CHECKING:
    from trispec.llm_engine import LLMEngine

logger = logging.getLogger(__name__)

# the input (BOOL, true) that makes a request a reset (vLLM's route name)
RESET_INPUT = "reset_prefix_cache"
# what a refusal for the key counts as in specdec_requests_rejected_total{reason}
ADMIN_KEY_REASON = "admin_key"


def admin_key_of(parameters_json: str) -> tuple[str | None, str]:
    """A request's parameters (Triton's JSON) split into the admin key it carries (the forwarded
    header, or the HTTP body's key of that name, whatever its case) and the rest (JSON, for the
    generation parameters' own check)."""
    parameters: dict[str, Any] = json.loads(parameters_json) if parameters_json else {}
    key = None
    for name in [n for n in parameters if n.lower() == ADMIN_KEY_HEADER]:
        key = str(parameters.pop(name))
    return key, json.dumps(parameters)


def check_reset_alone(inputs: list[str]) -> None:
    """A reset carries no other input: refuse one that does rather than guess which was meant."""
    others = sorted(name for name in inputs if name != RESET_INPUT)
    if others:
        raise InvalidInputError(RESET_INPUT, f"a reset takes no other input, got {', '.join(others)}")


def authorize(key: str | None, digest: str | None) -> None:
    """Raise ``InvalidInputError`` (field: the header) unless ``key`` opens the admin APIs of a server
    whose stubs were given ``digest`` (``triton_command.ADMIN_KEY_DIGEST_ENV``; None: a model not
    started by specdec-serve)."""
    if digest == OPEN_ADMIN:
        return
    if not digest:
        raise InvalidInputError(
            ADMIN_KEY_HEADER,
            "this model was not started by specdec-serve, which gives it the admin key to check: "
            "no reset without one",
            reason=ADMIN_KEY_REASON,
        )
    if key is None:
        raise InvalidInputError(
            ADMIN_KEY_HEADER, f"{RESET_INPUT} needs the admin key in this header", reason=ADMIN_KEY_REASON
        )
    if not hmac.compare_digest(admin_key_digest(key), digest):
        raise InvalidInputError(ADMIN_KEY_HEADER, "not this server's admin key", reason=ADMIN_KEY_REASON)


def reset_report(pools: Mapping[str, PrefixCacheReset]) -> dict[str, Any]:
    """What a reset answers: per KV pool, the cached blocks it emptied and the blocks running
    sequences still hold (found by no request admitted later)."""
    return {
        "reset": True,
        "pools": {
            name: {"emptied_blocks": reset.emptied_blocks, "held_blocks": reset.held_blocks}
            for name, reset in pools.items()
        },
    }


def reset_response(pools: Mapping[str, PrefixCacheReset]) -> dict[str, np.ndarray]:
    """The reset's one response: ``text_output`` holds ``reset_report`` as JSON."""
    text = json.dumps(reset_report(pools), sort_keys=True)
    return {"text_output": np.array([text.encode("utf-8")], dtype=object)}


# a reset's answer: its response's tensors, or an error's message and kind
Outcome = dict[str, np.ndarray] | tuple[str, ErrorKind]


def run_reset(engine: LLMEngine) -> Outcome:
    """Reset every pool's prefix cache (on the thread that steps ``engine``, between two steps)."""
    try:
        pools = engine.reset_prefix_cache()
    except NotImplementedError as exc:
        return f"{RESET_INPUT}: {exc}", "invalid"
    except Exception as exc:
        logger.exception("resetting the prefix cache failed")
        return f"internal error: {RESET_INPUT}: {type(exc).__name__}: {exc}", "internal"
    logger.info("prefix cache reset by an operator: %s", reset_report(pools)["pools"])
    return reset_response(pools)


def answer(sink: ResponseSink, outcome: Outcome) -> None:
    """A reset's one response; a sender that fails is logged, not raised."""
    try:
        if isinstance(outcome, dict):
            sink.send(outcome, True)
        else:
            sink.send_error(*outcome)
    except Exception:
        logger.exception("answering a prefix-cache reset failed")
