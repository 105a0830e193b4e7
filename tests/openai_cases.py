"""What the OpenAI front end's tests send: the model name, prompts, messages, a schema and a tool."""

from __future__ import annotations

from openai.types.chat import ChatCompletionMessageParam

MODEL = "specdec"
PROMPT = "The capital of France is"
# greedy SmolLM2 keeps counting for hundreds of tokens: a generation that is still running when cut
LONG_PROMPT = "Count from 1 to 1000: 1, 2, 3, 4, 5,"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the capital of France?"}]

CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "population": {"type": "integer", "minimum": 0},
    },
    "required": ["city", "population"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CITY_FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
