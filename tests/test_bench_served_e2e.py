"""``specdec-bench-served`` end to end on the built-in config, our arms only (llama-server is not built
in CI): the real ``specdec-serve`` and ``specdec-openai`` started, every arm measured, and after the run
(and after a SIGINT in the middle of one) nothing of the servers left running.

The bench runs with TMPDIR in the test's folder, so every process it starts names that folder on its
command line (the model repository, the config): one still running afterwards is an orphan."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.server, pytest.mark.real_model]

BENCH = Path(sys.executable).parent / "specdec-bench-served"
ARGS = ["--workloads", "humaneval", "--num-prompts", "1", "--max-tokens", "4", "--clients", "1"]


def _running_under(folder: Path) -> list[str]:
    """The command lines of live processes that name ``folder``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(folder) in cmdline and state not in ("Z", "X"):
            found.append(cmdline)
    return found


def _nothing_left(folder: Path) -> bool:
    """True once no process names ``folder`` (one killed may take a moment to go)."""
    deadline = time.monotonic() + 60
    while _running_under(folder):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _bench(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    return subprocess.Popen(
        [str(BENCH), *ARGS, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def test_our_arms_end_to_end_and_nothing_left_running(tmp_path: Path) -> None:
    bench = _bench(tmp_path, "--json", "--threads", "1")
    out, err = bench.communicate(timeout=900)
    assert bench.returncode == 0, err[-3000:]
    rows = [json.loads(line) for line in out.splitlines()]
    header = rows[0]
    assert header["row"] == "served_header" and header["threads"] == 1 and header["commit"]
    arms = {r["arm"]: r for r in rows if r["row"] == "served"}
    assert set(arms) == {"ours", "ours plain", "offline", "offline plain"}
    for r in arms.values():
        assert (r["workload"], r["clients"], r["requests"], r["tokens"]) == ("humaneval", 1, 1, 4)
        assert r["tok_s"] > 0 and r["decode_tok_s"] > 0 and r["ttft_p50_s"] > 0
    (ratios,) = [r for r in rows if r["row"] == "served_ratios"]
    assert ratios["served_vs_offline"] > 0 and ratios["served_vs_offline_plain"] > 0
    assert ratios["ours_vs_llama_server"] is None  # no --llama-server
    assert _nothing_left(tmp_path), _running_under(tmp_path)
    assert list(tmp_path.iterdir()) == []  # its work folder (repository, logs) removed


def test_an_interrupted_run_stops_its_servers(tmp_path: Path) -> None:
    bench = _bench(tmp_path)
    assert bench.stderr is not None
    for line in bench.stderr:  # the servers are up once it says where ours answers
        if line.startswith("ours: http"):
            break
    else:
        pytest.fail(f"the bench ended before its servers were up ({bench.wait()})")
    assert any("tritonserver" in c for c in _running_under(tmp_path))
    bench.send_signal(signal.SIGINT)
    _, err = bench.communicate(timeout=300)
    assert bench.returncode == 130, err[-3000:]
    assert _nothing_left(tmp_path), _running_under(tmp_path)
