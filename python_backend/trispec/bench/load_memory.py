"""Peak resident memory while loading a config's engines, against the weights they end up holding.

``measure(config)`` runs ``python -m trispec.bench.load_memory`` in a child process (a fresh heap,
nothing else loaded), under ``/usr/bin/time -v`` where that exists; the child loads the engines
exactly as serving does (``build_engines``) and reports what it holds. The peak is GNU time's
"Maximum resident set size", else the child's own VmHWM (the same kernel counter).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30


@dataclass(frozen=True)
class LoadMemory:
    peak_rss_bytes: int  # the whole process, loading included
    weights_bytes: int  # target + draft engine weights as held (packed, quantized)
    kv_bytes: int  # both KV pools, allocated and zero-filled at load
    runtime_bytes: int  # RSS before loading: Python, torch, the tokenizer
    measured_by: str  # "/usr/bin/time -v" or "VmHWM"

    @property
    def peak_vs_weights(self) -> float:
        return self.peak_rss_bytes / self.weights_bytes

    @property
    def overhead_bytes(self) -> int:
        """What loading cost beyond what stays resident (weights, KV, runtime): the transient."""
        return self.peak_rss_bytes - self.weights_bytes - self.kv_bytes - self.runtime_bytes

    def to_dict(self) -> dict[str, object]:
        return {
            "peak_load_rss_gib": round(self.peak_rss_bytes / GIB, 3),
            "weights_gib": round(self.weights_bytes / GIB, 3),
            "kv_gib": round(self.kv_bytes / GIB, 3),
            "runtime_gib": round(self.runtime_bytes / GIB, 3),
            "load_transient_gib": round(self.overhead_bytes / GIB, 3),
            "peak_vs_weights": round(self.peak_vs_weights, 3),
            "measured_by": self.measured_by,
        }


def measure(config_path: Path | None, threads: int) -> LoadMemory:
    child = [sys.executable, "-m", "trispec.bench.load_memory", "--threads", str(threads)]
    if config_path is not None:
        child += ["--config", str(config_path)]
    gnu_time = shutil.which("time", path="/usr/bin")
    command = [gnu_time, "-v", *child] if gnu_time else child
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"loading {config_path or 'the default config'} failed:\n{done.stderr[-2000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    peak, by = report["vm_hwm_bytes"], "VmHWM"
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr) if gnu_time else None
    if found:
        peak, by = int(found.group(1)) * 1024, "/usr/bin/time -v"
    return LoadMemory(peak, report["weights_bytes"], report["kv_bytes"], report["runtime_bytes"], by)


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import torch

    from trispec.checkpoints import load_tokenizer
    from trispec.config import load_config
    from trispec.runners.torch_build import build_engines

    torch.set_num_threads(args.threads)
    config = load_config(args.config)
    load_tokenizer(config.target, "target")  # resident while serving: part of the runtime
    runtime = _status_bytes("VmRSS")
    target, drafter = build_engines(config)
    engines = [target]
    draft_engine = getattr(getattr(drafter, "model", drafter), "engine", None)
    if draft_engine is not None:
        engines.append(draft_engine)
    report = {
        "weights_bytes": sum(e.model.weight_bytes for e in engines),
        "kv_bytes": sum(e.kv.k.nbytes + e.kv.v.nbytes for e in engines),
        "runtime_bytes": runtime,
        "vm_hwm_bytes": _status_bytes("VmHWM"),
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
