"""Helpers for ``profile_specdec.sh``; run with the project's venv Python (tokenizers, tritonclient).

Subcommands:
  free-ports N                     print N free TCP ports on 127.0.0.1
  ready URL MODEL TIMEOUT [PID]    wait until MODEL is ready on the gRPC URL (exit 1 on timeout, or at
                                   once if process PID, the server we started, has exited)
  tokenizer DIR [CONFIG]           write tokenizer.json + tokenizer_config.json for the config's target
                                   model into DIR, loadable offline by transformers' AutoTokenizer
  prompts TOKENIZER_DIR OUT N IN_TOKENS OUT_TOKENS SEED
                                   perf_analyzer --input-data JSON shaped like genai-perf's tensorrtllm
                                   backend: text_input, max_tokens, stream, exclude_input_in_output
  metrics URL OUT                  save the server's Prometheus metrics to OUT (exit 1 if unreachable)
  summary genai-perf JSON [BEFORE AFTER]
  summary perf_analyzer EXPORT TOKENIZER_DIR SUMMARY_OUT [BEFORE AFTER]
                                   print the figures (perf_analyzer: computed as genai-perf does)
"""

from __future__ import annotations

import base64
import json
import math
import os
import random
import re
import socket
import sys
import time
import urllib.request
from pathlib import Path

# Plain prose to cut synthetic prompts from (genai-perf cuts its prompts from Shakespeare).
CORPUS = (
    "The river ran slowly past the old mill, carrying leaves and small branches toward the sea. "
    "In the village the bakers had been at work since before dawn, and the smell of bread drifted "
    "over the square where the market traders were setting out their stalls. A boy chased a dog "
    "between the carts, and an old woman counted apples into a basket while she argued about the "
    "weather with her neighbour. Nobody noticed the stranger who walked in from the north road, "
    "his coat grey with dust, until he stopped at the fountain and asked for the way to the "
    "harbour. The harbour master, he said, was expecting a letter, and the letter was in his bag. "
    "Later that morning the clouds broke, the rain came down on the tiled roofs, and the traders "
    "hurried to cover their goods with sheets of canvas. By noon the square was empty again, the "
    "fountain overflowing, and the stranger was gone, leaving only a set of wet footprints on the "
    "steps of the town hall and a question that nobody in the village could answer."
)

# figures printed at the end, in genai-perf's names and units
FIGURES = (
    ("output_token_throughput", "Output token throughput", "tokens/s"),
    ("request_throughput", "Request throughput", "requests/s"),
    ("request_latency", "Request latency", "ms"),
    ("time_to_first_token", "Time to first token", "ms"),
    ("inter_token_latency", "Inter-token latency", "ms"),
    ("output_token_throughput_per_user", "Output tokens/s per user", "tokens/s"),
    ("output_sequence_length", "Output sequence length", "tokens"),
    ("input_sequence_length", "Input sequence length", "tokens"),
    ("request_count", "Requests measured", "count"),
)


def die(message: str, code: int = 1) -> None:
    print(f"profile_helper: {message}", file=sys.stderr)
    sys.exit(code)


# ---------------------------------------------------------------- server
def free_ports(count: int) -> None:
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    print(" ".join(str(s.getsockname()[1]) for s in socks))
    for s in socks:
        s.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (exited, not yet reaped by the shell) counts as dead
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_ready(url: str, model: str, timeout: float, pid: int | None) -> None:
    import tritonclient.grpc as grpcclient

    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if pid is not None and not _alive(pid):
            die(f"the server process {pid} exited before {model} became ready")
        try:
            client = grpcclient.InferenceServerClient(url)
            if client.is_model_ready(model, client_timeout=5.0):
                return
            last = f"server at {url} answers, model {model!r} not ready"
        except Exception as exc:
            last = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        time.sleep(1.0)
    die(f"model {model!r} not ready on {url} after {timeout:.0f} s ({last})")


def save_metrics(url: str, out: str) -> None:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            Path(out).write_bytes(resp.read())
    except OSError as exc:
        die(f"cannot read metrics from {url}: {exc}")


# ---------------------------------------------------------------- tokenizer and prompts
def write_tokenizer(out_dir: str, config_path: str | None) -> None:
    from trispec.checkpoints import load_tokenizer
    from trispec.config import load_config

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = load_config(config_path or None)
    tok = load_tokenizer(config.target, "target")
    tok.backend.save(str(out / "tokenizer.json"))

    def name(token_id: int | None) -> str | None:
        return None if token_id is None else tok.backend.id_to_token(token_id)

    conf = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": config.scheduler.max_context,
        "bos_token": name(tok.bos_id),
        "eos_token": name(tok.eos_id),
        "pad_token": name(tok.info.pad_id),
        "add_bos_token": tok.info.add_bos,
        "clean_up_tokenization_spaces": False,
        "chat_template": tok.info.chat_template,
    }
    conf = {k: v for k, v in conf.items() if v is not None}
    (out / "tokenizer_config.json").write_text(json.dumps(conf, indent=2) + "\n", encoding="utf-8")


def _load_tokenizer(tok_dir: str):
    import tokenizers

    return tokenizers.Tokenizer.from_file(str(Path(tok_dir) / "tokenizer.json"))


def write_prompts(tok_dir: str, out: str, count: int, in_tokens: int, out_tokens: int, seed: int) -> None:
    tok = _load_tokenizer(tok_dir)
    ids = tok.encode(CORPUS, add_special_tokens=False).ids
    while len(ids) < 2 * in_tokens + 1:
        ids = ids + ids
    rng = random.Random(seed)
    data = []
    for _ in range(count):
        start = rng.randrange(0, len(ids) - in_tokens)
        data.append(
            {
                "text_input": [tok.decode(ids[start : start + in_tokens])],
                "max_tokens": [out_tokens],
                "exclude_input_in_output": [True],
                "stream": [True],
            }
        )
    Path(out).write_text(json.dumps({"data": data}, indent=2) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- summaries
def _stats(values: list[float], unit: str) -> dict[str, float | str]:
    vals = sorted(values)
    if not vals:
        return {"unit": unit}

    def pct(p: float) -> float:  # numpy's default (linear) percentile, as genai-perf uses
        k = (len(vals) - 1) * p / 100
        lo, hi = math.floor(k), math.ceil(k)
        return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)

    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
    out: dict[str, float | str] = {"unit": unit, "avg": mean, "min": vals[0], "max": vals[-1]}
    out.update({f"p{p}": pct(p) for p in (50, 90, 99)})
    out["std"] = std
    return out


def _text(value: object) -> str:
    if isinstance(value, dict) and "b64" in value:
        return base64.b64decode(value["b64"]).decode("utf-8", "replace")
    if isinstance(value, list):
        return "".join(_text(v) for v in value)
    return "" if value is None else str(value)


def summarize_perf_analyzer(export: str, tok_dir: str, out: str) -> dict:
    """The genai-perf LLM metrics, from perf_analyzer's own profile export (same formulas)."""
    tok = _load_tokenizer(tok_dir)

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    doc = json.loads(Path(export).read_text(encoding="utf-8"))
    req_lat, ttft, itl, tps_user, osl, isl = [], [], [], [], [], []
    first_ts, last_ts = math.inf, -math.inf
    for experiment in doc.get("experiments", []):
        for req in experiment.get("requests", []):
            res_ts = req.get("response_timestamps") or []
            if not res_ts:
                continue
            start = req["timestamp"]
            first_ts, last_ts = min(first_ts, start), max(last_ts, res_ts[-1])
            latency = res_ts[-1] - start
            first = res_ts[0] - start
            n_out = count("".join(_text(r.get("text_output")) for r in req.get("response_outputs", [])))
            req_lat.append(latency / 1e6)
            ttft.append(first / 1e6)
            osl.append(n_out)
            isl.append(count(_text(req.get("request_inputs", {}).get("text_input"))))
            if len(res_ts) > 1 and n_out > 1:
                step = (latency - first) / (n_out - 1)
                itl.append(step / 1e6)
                tps_user.append(1e9 / step)
    if not req_lat:
        die(f"no completed requests in {export}")
    duration_s = (last_ts - first_ts) / 1e9
    summary = {
        "request_latency": _stats(req_lat, "ms"),
        "time_to_first_token": _stats(ttft, "ms"),
        "inter_token_latency": _stats(itl, "ms"),
        "output_token_throughput_per_user": _stats(tps_user, "tokens/sec/user"),
        "output_sequence_length": _stats(osl, "tokens"),
        "input_sequence_length": _stats(isl, "tokens"),
        "output_token_throughput": {"unit": "tokens/sec", "avg": sum(osl) / duration_s},
        "request_throughput": {"unit": "requests/sec", "avg": len(req_lat) / duration_s},
        "request_count": {"unit": "count", "avg": len(req_lat)},
        "source": "computed by client/profile/profile_helper.py from perf_analyzer's profile export",
    }
    Path(out).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


_METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def _counters(path: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        m = _METRIC_LINE.match(line)
        if not m:
            continue
        name, labels, value = m.groups()
        if name == "specdec_requests_total":
            reason = re.search(r'finish_reason="([^"]*)"', labels or "")
            name = f"{name}[{reason.group(1) if reason else '?'}]"
        elif name == "nv_inference_request_success" and 'model="specdec"' not in (labels or ""):
            continue
        try:
            totals[name] = totals.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return totals


def print_server_delta(before: str, after: str) -> None:
    if not (Path(before).is_file() and Path(after).is_file()):
        return
    b, a = _counters(before), _counters(after)

    def delta(name: str) -> float:
        return a.get(name, 0.0) - b.get(name, 0.0)

    print("\nServer-side (Prometheus counter deltas over the whole run, warm-up requests included):")
    print(f"  requests finished        {delta('nv_inference_request_success'):.0f}")
    reasons = {k.split("[", 1)[1].rstrip("]"): delta(k) for k in a if k.startswith("specdec_requests_total[")}
    if any(reasons.values()):
        listed = ", ".join(f"{k}={v:.0f}" for k, v in sorted(reasons.items()) if v)
        print(f"  finish reasons           {listed}")
    gen, drafted, accepted = (
        delta(n)
        for n in (
            "specdec_generated_tokens_total",
            "specdec_draft_tokens_total",
            "specdec_accepted_tokens_total",
        )
    )
    drafts, rounds = delta("specdec_drafts_total"), delta("specdec_verify_rounds_total")
    steps = delta("specdec_verify_steps_total")
    loop_s, loops = delta("specdec_round_latency_seconds_sum"), delta("specdec_round_latency_seconds_count")
    print(f"  tokens generated         {gen:.0f}")
    if drafted:
        print(
            f"  draft acceptance         {accepted:.0f}/{drafted:.0f} = {100 * accepted / drafted:.1f}%"
            f" ({drafts:.0f} of {rounds:.0f} sequence-rounds drafted)"
        )
    if rounds:
        print(f"  tokens per verify round  {gen / rounds:.2f} (per sequence, as mean_accepted_length)")
    if steps:
        print(f"  sequences per verify     {rounds / steps:.2f} (batched target passes: {steps:.0f})")
    if loops:
        print(f"  model loop round         {1000 * loop_s / loops:.0f} ms mean ({loops:.0f} rounds)")


def print_summary(summary: dict, tool: str) -> None:
    print(f"\n=== specdec profile summary ({tool}) ===")
    print(f"{'metric':<27}{'avg':>11}{'p50':>11}{'p90':>11}{'p99':>11}  unit")
    for key, label, unit in FIGURES:
        stats = summary.get(key)
        if not isinstance(stats, dict) or "avg" not in stats:
            continue
        cells = "".join(
            f"{stats[c]:>11.2f}" if isinstance(stats.get(c), (int, float)) else f"{'':>11}"
            for c in ("avg", "p50", "p90", "p99")
        )
        print(f"{label:<27}{cells}  {unit}")


def summary(argv: list[str]) -> None:
    tool = argv[0]
    if tool == "genai-perf":
        path, rest = argv[1], argv[2:]
        print_summary(json.loads(Path(path).read_text(encoding="utf-8")), "genai-perf")
    elif tool == "perf_analyzer":
        export, tok_dir, out, rest = argv[1], argv[2], argv[3], argv[4:]
        print_summary(summarize_perf_analyzer(export, tok_dir, out), "perf_analyzer")
    else:
        die(f"unknown tool {tool!r}", 2)
    if len(rest) == 2:
        print_server_delta(*rest)


def main(argv: list[str]) -> None:
    if not argv:
        die(__doc__ or "usage", 2)
    cmd, args = argv[0], argv[1:]
    needs = {"free-ports": 1, "ready": 3, "tokenizer": 1, "prompts": 6, "metrics": 2, "summary": 2}
    if cmd not in needs:
        die(f"unknown subcommand {cmd!r}\n{__doc__}", 2)
    if len(args) < needs[cmd]:
        die(f"{cmd}: expected at least {needs[cmd]} arguments, got {len(args)}\n{__doc__}", 2)
    try:
        numbers = {
            "free-ports": lambda: [int(args[0])],
            "ready": lambda: [float(args[2])] + ([int(args[3])] if len(args) > 3 else []),
            "prompts": lambda: [int(a) for a in args[2:6]],
        }.get(cmd, list)()
    except ValueError as exc:
        die(f"{cmd}: {exc}", 2)
    if cmd == "free-ports":
        free_ports(numbers[0])
    elif cmd == "ready":
        wait_ready(args[0], args[1], numbers[0], numbers[1] if len(numbers) > 1 else None)
    elif cmd == "tokenizer":
        write_tokenizer(args[0], args[1] if len(args) > 1 else None)
    elif cmd == "prompts":
        write_prompts(args[0], args[1], *numbers)
    elif cmd == "metrics":
        save_metrics(args[0], args[1])
    else:
        summary(args)


if __name__ == "__main__":
    main(sys.argv[1:])
