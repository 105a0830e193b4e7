"""End to end against the shared real server (``e2e_server``, admin APIs behind a key): an operator
empties the prefix cache through specdec-openai's ``POST /reset_prefix_cache`` or Triton's own
generate endpoint. A repeated prompt hits before and reports ``cached_tokens`` 0 after; without the
admin key, or with another, it is refused and nothing is emptied; a stream running across the reset
goes on with the text of the same request alone.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator

import openai
import pytest
import tritonclient.grpc as grpcclient
import urllib3
from e2e_server import bls_inputs, grpc_stream
from served import Server, openai_frontend

pytestmark = [pytest.mark.server, pytest.mark.real_model]

# long enough for several full KV blocks, whatever the tokenizer
PROMPT = "The printing press changed how knowledge spread across Europe, because " * 6
HEADER = "specdec-admin-key"


@pytest.fixture(scope="module")
def server(e2e_server: Server) -> Server:
    """The real server the test_server_*.py files share (``e2e_server``)."""
    return e2e_server


@pytest.fixture(scope="module")
def frontend(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with openai_frontend(server.grpc, tmp_path_factory.mktemp("openai") / "frontend.log") as url:
        yield url


def cached_tokens(frontend: str, prompt: str = PROMPT) -> int:
    client = openai.OpenAI(base_url=f"{frontend}/v1", api_key="unused", timeout=120, max_retries=0)
    usage = client.completions.create(model="specdec", prompt=prompt, max_tokens=2, temperature=0).usage
    assert usage is not None and usage.prompt_tokens_details is not None
    return int(usage.prompt_tokens_details.cached_tokens or 0)


def reset(frontend: str, key: str | None) -> urllib3.BaseHTTPResponse:
    headers = {HEADER: key} if key is not None else {}
    return urllib3.request("POST", f"{frontend}/reset_prefix_cache", headers=headers, timeout=120)


def test_a_reset_empties_the_cache_and_only_the_admin_key_may_ask(server: Server, frontend: str) -> None:
    key = server.admin_key_file.read_text().strip()
    resets = server.metric_or_zero("specdec_prefix_cache_resets_total")
    refused = server.metric_or_zero("specdec_requests_rejected_total", reason="admin_key")
    cached_tokens(frontend)
    assert cached_tokens(frontend) > 0  # sent again: its prompt is cached
    for wrong in (None, "not-the-key"):
        answer = reset(frontend, wrong)
        assert answer.status == 403, answer.data[:300]
        error = json.loads(answer.data)["error"]
        # each replica's refusal, named by its address
        assert error["code"] == "permission_denied" and error["message"].startswith(
            f"{server.grpc}: {HEADER}:"
        )
    assert urllib3.request("POST", f"{frontend}/flush_cache", timeout=120).status == 403  # SGLang's name
    assert cached_tokens(frontend) > 0  # refused: nothing was emptied
    answer = reset(frontend, key)
    assert answer.status == 200, answer.data[:300]
    (replica,) = json.loads(answer.data)["replicas"]
    assert replica["url"] == server.grpc and replica["pools"]["target"]["emptied_blocks"] > 0, replica
    # the draft model's pool too (the int8 self-draft indexes no block it copied from the target, so it
    # had none cached here; test_prefix_cache_reset.py empties a model drafter's)
    assert set(replica["pools"]) == {"target", "drafter"}, replica
    assert cached_tokens(frontend) == 0
    assert cached_tokens(frontend) > 0  # and it fills again
    # Triton's own generate endpoint takes the same request, the key in the body (it forwards no header)
    url = f"http://{server.http}/v2/models/specdec/generate"
    body = {"reset_prefix_cache": True}
    direct = urllib3.request("POST", url, json={**body, HEADER: key}, timeout=120)
    assert direct.status == 200, direct.data[:300]
    assert json.loads(json.loads(direct.data)["text_output"])["pools"]["target"]["emptied_blocks"] > 0
    assert cached_tokens(frontend) == 0
    without = urllib3.request("POST", url, json=body, headers={HEADER: key}, timeout=120)
    assert without.status == 400 and f"{HEADER}: " in without.data.decode(), without.data[:300]
    assert server.metric("specdec_prefix_cache_resets_total") == resets + 2
    assert server.metric("specdec_requests_rejected_total", reason="admin_key") == refused + 4


def test_a_stream_running_across_a_reset_keeps_its_text(server: Server, frontend: str) -> None:
    """A greedy stream that runs until the test ends it (so it certainly holds its blocks while the
    cache is emptied), read for 8 responses past the reset: its text is the text of the same request
    alone, with as many tokens."""
    key = server.admin_key_file.read_text().strip()
    prompt = "Write a long story about a lighthouse keeper. " + PROMPT
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    text, tokens, after_reset = "", 0, -1
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)), stream_timeout=600)
        inputs = bls_inputs(prompt, max_tokens=1900, end_id=49151, stream=True)  # ends only when cut
        client.async_stream_infer("specdec", inputs, enable_empty_final_response=True)
        answer: list[urllib3.BaseHTTPResponse] = []
        resetting = threading.Thread(target=lambda: answer.append(reset(frontend, key)))
        while after_reset < 8:
            result, error = responses.get(timeout=120)
            assert error is None, error
            assert not result.get_response().parameters["triton_final_response"].bool_param
            text += result.as_numpy("text_output").reshape(-1)[0].decode()
            tokens = int(result.as_numpy("output_token_count").reshape(-1)[0])
            if resetting.ident is None:
                resetting.start()  # once it streams: its prompt's blocks are held
            elif answer:
                after_reset += 1
            elif not resetting.is_alive():
                pytest.fail("the reset request raised (see above)")
        client.stop_stream(cancel_requests=True)
    finally:
        client.close()
    assert answer[0].status == 200, answer[0].data[:300]
    held = json.loads(answer[0].data)["replicas"][0]["pools"]["target"]["held_blocks"]
    assert held > 0  # the stream's blocks, left to it
    alone = grpc_stream(server, prompt, max_tokens=tokens, end_id=49151, stream=True)
    assert alone.error is None and text and alone.text.startswith(text), (text, alone.text)
