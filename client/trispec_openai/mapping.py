"""An OpenAI request → the Triton requests behind its choices.

Choice ``index`` runs prompt ``index // n`` (one prompt for chat); ``n`` choices of one prompt are ``n``
requests sent together, seeded ``seed + i`` when a seed is given so that seeded choices differ but repeat.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass

from trispec_client.errors import InvalidRequestError
from trispec_client.request import GenerationRequest

from trispec_openai.errors import invalid, param_of
from trispec_openai.schemas import ChatCompletionRequest, CompletionRequest
from trispec_openai.structured import Structure


@dataclass(frozen=True)
class Job:
    index: int  # the choice's index
    prompt_index: int
    request: GenerationRequest
    # FP32 inputs trispec_client's request does not carry (0 = off: not sent)
    penalties: tuple[tuple[str, float], ...] = ()
    # the OpenAI field a guided request's guide came from, named when the model refuses the guide
    guide_param: str = "response_format"
    # completions' echo: the prompt (text or token ids), put before the answer
    echo: str | list[int] | None = None
    # False for max_tokens 0 (with echo): the one token generated is dropped, only the prompt is scored
    keep_output: bool = True


def stop_word(stop: str) -> str:
    """One stop string as the model's stop_words reads it: each entry is parsed as a CSV row
    (``"a,b"`` is two words, as the BLS preprocessing does), so quote it to keep it one word."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="", quoting=csv.QUOTE_ALL).writerow([stop])
    return buffer.getvalue()


def jobs(
    body: CompletionRequest | ChatCompletionRequest,
    prompts: Sequence[str | list[int]],
    structure: Structure | None = None,
) -> list[Job]:
    """The Triton requests for ``prompts`` (the rendered chat, or the completion prompts), guided as
    ``structure`` says (response_format, tools)."""
    structure = structure or Structure()
    max_tokens = body.token_limit if isinstance(body, ChatCompletionRequest) else body.max_tokens
    echo = isinstance(body, CompletionRequest) and body.echo
    # Triton generates at least one token: max_tokens 0 sends 1 and drops it
    keep_output = max_tokens != 0
    stops = tuple(stop_word(s) for s in body.stop_list if s)
    penalties = tuple(
        (name, float(value))
        for name in ("presence_penalty", "frequency_penalty")
        if (value := getattr(body, name))
    )
    if body.repetition_penalty is not None and body.repetition_penalty != 1.0:
        penalties += (("repetition_penalty", float(body.repetition_penalty)),)
    result = []
    for prompt_index, prompt in enumerate(prompts):
        for i in range(body.n):
            try:
                text, ids = (prompt, None) if isinstance(prompt, str) else ("", tuple(prompt))
                request = GenerationRequest(
                    prompt=text,
                    prompt_token_ids=ids,
                    max_tokens=max_tokens if keep_output else 1,
                    end_id=-1 if body.ignore_eos else None,
                    min_tokens=body.min_tokens or None,
                    num_draft_tokens=body.num_draft_tokens,
                    temperature=body.temperature,
                    top_k=body.top_k,
                    top_p=body.top_p,
                    seed=None if body.seed is None else body.seed + i,
                    stop_words=stops,
                    stream=True,
                    guided_decoding_guide_type=structure.guide_type,
                    guided_decoding_guide=structure.guide,
                    cache_salt=body.cache_salt,
                    logit_bias={int(t): b for t, b in body.logit_bias.items()} if body.logit_bias else None,
                    prediction=body.prediction.text if body.prediction is not None else None,
                )
            except InvalidRequestError as exc:  # a value the tensors cannot carry (an int over INT32)
                raise invalid(exc.message, param_of(exc.message)) from None
            index = prompt_index * body.n + i
            echoed = prompt if echo else None
            result.append(Job(index, prompt_index, request, penalties, structure.param, echoed, keep_output))
    return result
