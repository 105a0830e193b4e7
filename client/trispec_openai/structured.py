"""OpenAI's structured output and tools → the model's guided-decoding tensors, and text → ``tool_calls``.

* ``response_format`` ``json_object``: any JSON object; ``json_schema``: its ``schema`` (strict or not,
  the schema is always enforced: every token is masked by it, as TensorRT-LLM's xgrammar reads it;
  ``strict: true`` also refuses a schema outside OpenAI's strict subset: strict.py);
  ``structural_tag``: free text in which each structure (``begin``, ``schema``, ``end``) after one of
  its ``triggers`` is constrained.
* ``tools`` with ``tool_choice`` ``"required"``: the answer is ``{"name": ..., "arguments": {...}}`` for
  one of the tools, constrained to that tool's ``parameters``; a named function
  (``{"type": "function", "function": {"name": ...}}``): the answer is that function's arguments.
  Either comes back as one ``tool_calls`` entry, ``finish_reason`` ``tool_calls``.
* ``tool_choice`` ``"auto"`` (the default with tools): the tools go to the chat template and the model
  decides; a ``<tool_call>{...}</tool_call>`` block in its text (the Hermes/Qwen format) becomes a tool
  call. Only where the model's chat template defines tool calls; elsewhere a 400 says to use
  ``"required"`` or a named function. ``"none"``: the tools are not offered, plain text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from trispec_openai.errors import invalid, unsupported
from trispec_openai.strict import check_strict, strict_flag

# where a chat template writes tool calls as <tool_call>{json}</tool_call> (Hermes, Qwen 2.5)
TOOL_CALL_TAG = "<tool_call>"
_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCalls:
    """How a choice's text becomes tool calls: ``named`` (the text is that function's arguments),
    ``wrapped`` (``{"name", "arguments"}`` objects) or ``tagged`` (``<tool_call>`` blocks in free text)."""

    mode: str
    name: str = ""

    def calls(self, text: str) -> list[dict[str, Any]] | None:
        """The tool calls in ``text`` (None: none found, the text is the answer)."""
        try:
            if self.mode == "named":
                return [_call(self.name, json.loads(text))]
            if self.mode == "wrapped":
                data = json.loads(text)
                return [_call(data["name"], data["arguments"])]
            found = [json.loads(m) for m in _TOOL_CALL.findall(text)]
            return [_call(d["name"], d.get("arguments", {})) for d in found] or None
        except (ValueError, KeyError, TypeError):
            return None  # cut short (max_tokens) or not a call: the text goes back as content


def _call(name: str, arguments: Any) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


@dataclass(frozen=True)
class Structure:
    """What one chat request asks of the model's output."""

    # the guided-decoding tensors (None: free text) and the OpenAI field they come from
    guide_type: str | None = None
    guide: str | None = None
    param: str = "response_format"
    tools: ToolCalls | None = None
    # the tools as the chat template reads them (None: not offered)
    template_tools: list[dict[str, Any]] | None = None


def _functions(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    functions: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise invalid(f"tools[{i}]: must be {{'type': 'function', 'function': {{...}}}}", "tools")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise invalid(f"tools[{i}].function.name: must be a non-empty string", "tools")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise invalid(f"tools[{i}].function.parameters: must be a JSON Schema object", "tools")
        if strict_flag(function, f"tools[{i}].function", "tools"):
            check_strict(parameters, f"function '{name}'", "tools")
        functions[name] = parameters
    return functions


def _response_format(response_format: dict[str, Any]) -> Structure:
    kind = response_format.get("type")
    if kind == "text":
        return Structure()
    if kind == "json_object":
        return Structure("json_schema", json.dumps({"type": "object"}))
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise invalid(
                "response_format.json_schema: must be an object with a name and a schema", "response_format"
            )
        schema = spec.get("schema", {"type": "object"})
        if not isinstance(schema, dict):
            raise invalid(
                "response_format.json_schema.schema: must be a JSON Schema object", "response_format"
            )
        if strict_flag(spec, "response_format.json_schema", "response_format"):
            check_strict(schema, f"response_format '{spec['name']}'", "response_format")
        return Structure("json_schema", json.dumps(schema))
    if kind == "structural_tag":  # vLLM's and trtllm-serve's: the structures and their triggers
        spec = {k: response_format.get(k) for k in ("structures", "triggers")}
        if not isinstance(spec["structures"], list) or not isinstance(spec["triggers"], list):
            raise invalid(
                "response_format: a structural_tag needs structures and triggers lists", "response_format"
            )
        return Structure("structural_tag", json.dumps(spec))
    raise unsupported(
        "response_format", f"type must be text, json_object, json_schema or structural_tag, got {kind!r}"
    )


def structure_of(
    response_format: dict[str, Any] | None,
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    chat_template: str,
) -> Structure:
    """The request's structure; raises ``OpenAIError`` (400) for what cannot be served."""
    structured = response_format is not None and response_format.get("type") != "text"
    if not tools:
        if tool_choice not in (None, "none"):
            raise invalid("tool_choice: needs tools", "tool_choice")
        return _response_format(response_format) if response_format is not None else Structure()
    functions = _functions(tools)
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return _response_format(response_format) if response_format is not None else Structure()
    if structured:
        raise unsupported("response_format", "cannot be combined with tools the model may call")
    if choice == "required":
        schema = {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"name": {"const": name}, "arguments": parameters},
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
                for name, parameters in functions.items()
            ]
        }
        return Structure("json_schema", json.dumps(schema), "tools", ToolCalls("wrapped"), tools)
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if name not in functions:
            raise invalid(f"tool_choice: names no function of tools ({', '.join(functions)})", "tool_choice")
        return Structure("json_schema", json.dumps(functions[name]), "tools", ToolCalls("named", name), tools)
    if choice != "auto":
        raise invalid("tool_choice: must be none, auto, required or {'type': 'function', ...}", "tool_choice")
    if TOOL_CALL_TAG not in chat_template:
        raise unsupported(
            "tool_choice",
            "auto: this model's chat template defines no tool calls, so they could not be told from text; "
            "use tool_choice 'required' or name a function",
        )
    return Structure(tools=ToolCalls("tagged"), template_tools=tools)
