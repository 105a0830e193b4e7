#!/usr/bin/env bash
# llama.cpp's llama-server, the peer of `specdec-bench --workloads multiturn --llama-server PATH`
# (issue 40) and of `specdec-bench-served --llama-server PATH` (issue 55). Not in CI.
#
# Builds llama-server from the source vendored in the llama-cpp-python sdist, as
# scripts/llamacpp_anchor.sh builds llama-bench (its sdist from PyPI; cmake + ninja, a few
# minutes on 2 cores), into its own build directory in the cache, once; then prints the binary's path.
#
#   scripts/llamacpp_server.sh            # prints e.g. ~/.cache/specdec/llamacpp/build-server-0.3.36/bin/llama-server
#   .venv/bin/specdec-bench --config python_backend/trispec/configs/qwen-coder-pair-gguf.yaml \
#       --workloads multiturn --llama-server "$(scripts/llamacpp_server.sh)"
#
# Environment: SPECDEC_CACHE_DIR (default ~/.cache/specdec), LLAMACPP_PY_VERSION (the sdist, default
# 0.3.36), PYTHON (default .venv/bin/python), LLAMACPP_NO_AMX=1 (build without AMX: a VM that reports
# AMX it does not run kills llama-server with SIGILL, "llama-server exited (-4)", as
# scripts/llamacpp_anchor.sh finds for llama-bench; remove the build folder and build again with it).
set -euo pipefail

case "${1:-}" in -h|--help) sed -n 2,17p "$0"; exit 0 ;; esac

here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/llamacpp_source.sh"
cache=${SPECDEC_CACHE_DIR:-$HOME/.cache/specdec}
version=${LLAMACPP_PY_VERSION:-0.3.36}
python=${PYTHON:-$here/.venv/bin/python}
root=$cache/llamacpp
src=$root/llama_cpp_python-$version/vendor/llama.cpp
build=$root/build-server-$version
server=$build/bin/llama-server

if [ ! -x "$server" ]; then
    mkdir -p "$root"
    PYTHON=$python llamacpp_source "$root" "$version"
    echo "building llama-server in $build (a few minutes)" >&2
    # GGML_NATIVE: this CPU's own ISA, as a local build does; no curl (models are local files)
    flags=""
    [ "${LLAMACPP_NO_AMX:-0}" = 1 ] && flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF >&2
    ninja -C "$build" llama-server >&2
fi
echo "$server"
