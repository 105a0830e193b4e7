"""llama.cpp's ``llama-server`` as a chat peer for ``specdec-bench --workloads multiturn``.

``scripts/llamacpp_server.sh`` builds the binary from the same llama-cpp-python sdist as
``scripts/llamacpp_anchor.sh``. Started on the target's GGUF file with the bench's thread count and
``--parallel`` slots (one by default: a slot reuses the longest common prefix with what it last held,
its ``cache_prompt``, so N + 1 interleaved conversations on N slots never hit). Each request goes to
``POST /completion`` streamed (``cache_prompt`` on, greedy): the time to its first streamed piece is
the first-token time; its final event's ``timings`` say how many prompt tokens it computed
(``prompt_n``) and took from the slot (``cache_n``; older builds: ``tokens_cached``).

``specdec-bench-served`` starts it too, through its OpenAI endpoint: ``cache_prompt=False`` (every
prompt computed: ``--no-cache-prompt --cache-ram 0``) and, with ``draft``, speculative decoding on a
draft GGUF file (``-md FILE --spec-type draft-simple --spec-draft-n-max N``: this llama.cpp no longer
takes ``--draft-max``, and ``-md`` alone loads the draft without drafting with it).
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from trispec.bench.children import stop_with_parent


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


def llama_server_command(
    binary: Path,
    model: Path,
    *,
    threads: int,
    slots: int,
    context: int,
    port: int,
    draft: Path | None = None,
    draft_max: int = 4,
    cache_prompt: bool = True,
) -> list[str]:
    """``slots`` slots of ``context`` tokens each; the draft (if any) on the same threads."""
    command = [
        str(binary), "-m", str(model), "-t", str(threads), "--parallel", str(slots),
        "-c", str(context * slots), "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    if not cache_prompt:
        command += ["--no-cache-prompt", "--cache-ram", "0"]
    if draft is not None:
        command += ["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(draft_max)]
        command += ["-td", str(threads)]
    return command


class LlamaServer:
    name = "llama-server"

    def __init__(
        self,
        binary: Path,
        model: Path,
        *,
        threads: int,
        slots: int = 1,
        context: int = 8192,
        draft: Path | None = None,
        draft_max: int = 4,
        cache_prompt: bool = True,
    ) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = llama_server_command(
            binary, model, threads=threads, slots=slots, context=context, port=self.port, draft=draft,
            draft_max=draft_max, cache_prompt=cache_prompt,
        )  # fmt: skip
        # its log goes to a file: a pipe nobody reads fills up, and the server blocks writing to it
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 -- open while the server runs; close() closes it
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=self.log, preexec_fn=stop_with_parent
        )
        try:
            self._wait_ready(600.0)
        except BaseException:  # Ctrl-C while it loads too: no server left behind
            self.close()
            raise

    def _log_tail(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-2000:]

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self._log_tail()
                raise RuntimeError(f"llama-server exited ({self.process.returncode}): {tail}")
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                connection.request("GET", "/health")
                if connection.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
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
        self.log.close()
