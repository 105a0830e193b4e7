"""llama.cpp's ``llama-server`` as a chat peer for ``specdec-bench --workloads multiturn``.

``scripts/llamacpp_server.sh`` builds the binary from the same llama-cpp-python sdist as
``scripts/llamacpp_anchor.sh``. Started on the target's GGUF file with the bench's thread count and
``--parallel`` slots (one by default: a slot reuses the longest common prefix with what it last held,
its ``cache_prompt``, so N + 1 interleaved conversations on N slots never hit). Each request goes to
``POST /completion`` streamed (``cache_prompt`` on, greedy): the time to its first streamed piece is
the first-token time; its final event's ``timings`` say how many prompt tokens it computed
(``prompt_n``) and took from the slot (``cache_n``; older builds: ``tokens_cached``).
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Reply:
    """One completion as a chat turn sees it."""

    text: str
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    # the prompt's and the answer's token ids, where the system knows them (ours)
    prompt_ids: tuple[int, ...] = ()
    output_ids: tuple[int, ...] = ()
    # request sent to last token
    total_s: float = 0.0

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LlamaServer:
    name = "llama-server"

    def __init__(
        self, binary: Path, model: Path, *, threads: int, slots: int = 1, context: int = 8192
    ) -> None:
        self.port = _free_port()
        command = [
            str(binary), "-m", str(model), "-t", str(threads), "--parallel", str(slots),
            "-c", str(context * slots), "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self._wait_ready(600.0)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"llama-server exited ({self.process.returncode}): {self.process.stderr.read()[-2000:]}"
                )  # type: ignore[union-attr]
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                connection.request("GET", "/health")
                if connection.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.close()
        raise RuntimeError(f"llama-server was not ready within {timeout_s:.0f} s")

    def reply(self, prompt: str, max_tokens: int) -> Reply:
        body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1}
        body |= {"cache_prompt": True, "stream": True}
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)
        start = time.perf_counter()
        connection.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"llama-server: HTTP {response.status}: {response.read()[:500]!r}")
        ttft, parts, final = None, [], {}
        for raw in response:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if event.get("content"):
                ttft = ttft if ttft is not None else time.perf_counter() - start
                parts.append(event["content"])
            if event.get("stop"):
                final = event
                break
        timings = final.get("timings", {})
        computed = int(timings.get("prompt_n", 0))
        cached = int(timings.get("cache_n", final.get("tokens_cached", 0)))
        total = time.perf_counter() - start
        return Reply(
            "".join(parts),
            ttft if ttft is not None else total,
            computed + cached,
            cached,
            int(timings.get("predicted_n", 0)),
            total_s=total,
        )

    def cold(self) -> None:
        """Nothing to drop: a slot keeps only what it last held."""

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
