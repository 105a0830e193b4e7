#!/usr/bin/env bash
# llama.cpp's own speed on the GGUF files we run, to read our figures against (issue 36). Not in CI.
#
# Builds llama.cpp from the source vendored in the llama-cpp-python sdist (its sdist from PyPI;
# cmake + ninja, ~5 minutes on 2 cores) into a cache directory outside the repository, once; then runs
# llama-bench on each file: prompt processing of 111 tokens (pp111, the time to a first token), and
# plain decoding of 64 tokens (tg64) from an empty context and at a depth of 256.
#
#   scripts/llamacpp_anchor.sh [--threads N] [--reps N] [--json] [FILE.gguf ...]
#
# Without files: the Qwen2.5-Coder 1.5B and 0.5B Q4_K_M files of qwen-coder-pair-gguf.yaml, from the
# cache specdec keeps them in. --json prints llama-bench's JSON lines (what specdec-bench
# --anchor-llamacpp reads); otherwise its markdown table. Environment: SPECDEC_CACHE_DIR (default
# ~/.cache/specdec), LLAMACPP_PY_VERSION (the sdist, default 0.3.36), PYTHON (default .venv/bin/python).
set -euo pipefail

threads=2 reps=3 format=md files=()
while [ $# -gt 0 ]; do
    case "$1" in
        --threads) threads=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --json) format=jsonl; shift ;;
        -h|--help) sed -n 2,15p "$0"; exit 0 ;;
        *) files+=("$1"); shift ;;
    esac
done

here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/llamacpp_source.sh"
cache=${SPECDEC_CACHE_DIR:-$HOME/.cache/specdec}
version=${LLAMACPP_PY_VERSION:-0.3.36}
python=${PYTHON:-$here/.venv/bin/python}
root=$cache/llamacpp
src=$root/llama_cpp_python-$version/vendor/llama.cpp
build=$root/build-$version
bench=$build/bin/llama-bench

if [ ! -x "$bench" ]; then
    mkdir -p "$root"
    PYTHON=$python llamacpp_source "$root" "$version"
    echo "building llama-bench in $build (a few minutes)" >&2
    # GGML_NATIVE: this CPU's own ISA (AVX-512 VNNI where it has it), as a local build does
    configure() {
        cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
            -DCMAKE_C_FLAGS="$1" -DCMAKE_CXX_FLAGS="$1" \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF \
            -DBUILD_SHARED_LIBS=OFF >&2
        ninja -C "$build" llama-bench >&2
    }
    configure ""
    # A CPU may report AMX that its VM does not run reliably: llama-bench's AMX tiles then die on an
    # instruction (seen: SIGILL at tilezero in a worker thread, where a one-thread probe passed). A
    # short run on the first file shows it; then the build goes again without AMX.
    smoke=${files[0]:-$cache/models/qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf}
    if [ -f "$smoke" ] && ! "$bench" -m "$smoke" -t "$threads" -r 1 -p 32 -n 1 >/dev/null 2>&1; then
        echo "llama-bench failed its first run (AMX the VM does not run?): building again without AMX" >&2
        configure "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    fi
fi

if [ ${#files[@]} -eq 0 ]; then
    files=("$cache/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" "$cache/models/qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf")
fi
for f in "${files[@]}"; do
    [ -f "$f" ] || { echo "no such file: $f (make models-qwen fetches the Qwen pair)" >&2; exit 1; }
    "$bench" -m "$f" -t "$threads" -r "$reps" -p 111 -n 64 -d 0,256 -o "$format"
done
