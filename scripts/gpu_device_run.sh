#!/usr/bin/env bash
# The device run (docs/gpu.md, "The device run"): on a lent GPU, from the repository root, twice on one
# warm machine. Writes env.txt, device_tests.txt, bench.jsonl and bench.txt under $OUT (./device-out
# where OUT is unset).
#
#   bash scripts/gpu_device_run.sh tests   # 1st call: environment, the device tests (compiled), the bench
#   bash scripts/gpu_device_run.sh         # 2nd call, same machine: the bench again (Triton cache warm)
#
# Python packages the device image lacks travel as wheels in .whl/ (docs/gpu.md says which and how).
set -u
out=${OUT:-device-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || exit 1
fi
export PYTHONPATH=$PWD/python_backend${PYTHONPATH:+:$PYTHONPATH}
{
  nvidia-smi -L
  python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name(0), torch.cuda.get_device_capability())"
  python3 -c "import numpy, pydantic, pytest, yaml; print('imports ok')"
  git log -1 --format='commit %H' 2>/dev/null || true
} 2>&1 | tee "$out/env.txt"
if [ "${1:-}" = tests ]; then
  timeout "${TESTS_S:-150}" python3 -m pytest -q -m device -p no:cacheprovider tests/test_on_device.py 2>&1 \
    | tee "$out/device_tests.txt"
fi
timeout "${BENCH_S:-420}" python3 scripts/gpu_spec_bench.py --budget-s "${BUDGET_S:-270}" --out "$out/bench.jsonl" 2>&1 \
  | tee "$out/bench.txt"
