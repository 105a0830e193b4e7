"""The ``json`` workload: schema-guided prompts (structured output, as agents and tool calls send them).

Each prompt asks for one record about a subject as JSON matching a schema, and shows the schema; the
request carries the same schema as its guide, so every answer is valid JSON of that shape. The
schemas cover what real ones hold: nested objects, arrays with bounds, enums, patterns, integers
with ranges, optional fields. ``json_free`` is the same prompts without the guide: the guided vs
unguided comparison. Built here, deterministic: subjects x schemas in a fixed order.
"""

from __future__ import annotations

import json
from typing import Any

_NAME = {"type": "string", "maxLength": 40}
SCHEMAS: dict[str, dict[str, Any]] = {
    "city": {
        "type": "object",
        "properties": {
            "name": _NAME,
            "country": _NAME,
            "population": {"type": "integer", "minimum": 0},
            "landmarks": {"type": "array", "items": _NAME, "minItems": 1, "maxItems": 3},
        },
        "required": ["name", "country", "population", "landmarks"],
        "additionalProperties": False,
    },
    "person": {
        "type": "object",
        "properties": {
            "name": _NAME,
            "born": {"type": "integer", "minimum": 1000, "maximum": 2025},
            "occupation": _NAME,
            "nationality": _NAME,
            "alive": {"type": "boolean"},
        },
        "required": ["name", "born", "occupation", "alive"],
        "additionalProperties": False,
    },
    "product": {
        "type": "object",
        "properties": {
            "name": _NAME,
            "category": {"enum": ["food", "electronics", "clothing", "tool", "toy", "other"]},
            "price_usd": {"type": "number", "minimum": 0},
            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        },
        "required": ["name", "category", "price_usd", "sku"],
        "additionalProperties": False,
    },
    "tool_call": {
        "type": "object",
        "properties": {
            "function": {"enum": ["get_weather", "search_web", "send_email"]},
            "arguments": {
                "type": "object",
                "properties": {
                    "query": _NAME,
                    "location": _NAME,
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
        "required": ["function", "arguments"],
        "additionalProperties": False,
    },
    "event": {
        "type": "object",
        "properties": {
            "title": _NAME,
            "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
            "location": {
                "type": "object",
                "properties": {"city": _NAME, "country": _NAME},
                "required": ["city", "country"],
                "additionalProperties": False,
            },
            "attendees": {"type": "integer", "minimum": 0, "maximum": 1000000},
        },
        "required": ["title", "date", "location"],
        "additionalProperties": False,
    },
}
SUBJECTS = (
    "Paris", "Tokyo", "Ada Lovelace", "a cordless drill", "the Olympic Games", "Nairobi", "Isaac Newton",
    "a chocolate bar", "a concert in Berlin", "the weather in Lisbon", "Marie Curie", "a laptop",
    "Buenos Aires", "a chess tournament", "a winter jacket", "searching for flights to Rome",
)  # fmt: skip
TEMPLATE = (
    "Give {subject} as one {kind} record in JSON matching this schema. Reply with the JSON only.\n{schema}"
)


def json_prompts() -> list[tuple[str, str, str]]:
    """(prompt text, schema as JSON text, source) for every subject x schema, in a fixed order."""
    prompts = []
    for i, subject in enumerate(SUBJECTS):
        for j, (kind, schema) in enumerate(SCHEMAS.items()):
            if (i + j) % 2:  # half the pairs: 40 prompts, each schema with 8 subjects
                continue
            text = json.dumps(schema, separators=(",", ":"))
            prompts.append(
                (TEMPLATE.format(subject=subject, kind=kind, schema=text), text, f"{kind}:{subject}")
            )
    return prompts
