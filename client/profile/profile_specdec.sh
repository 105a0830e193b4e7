#!/usr/bin/env bash
# Profile the decoupled `specdec` model on Triton with NVIDIA's LLM benchmark client, using the
# settings genai-perf uses for a TensorRT-LLM model (`--backend tensorrtllm --endpoint-type kserve
# --streaming`), unchanged. Prints output token throughput, request latency, time to first token
# and inter-token latency at the end; leaves every artifact under --out.
#
# Usage: client/profile/profile_specdec.sh [options]      (see --help; README.md beside this file)
set -euo pipefail

usage() {
    cat <<EOF
Usage: $(basename "$0") [options]

Profiles an already-running server (gRPC at --url), or with --start-server starts one with
specdec-serve on free ports and stops it at the end.

Server:
  --url HOST:PORT         gRPC endpoint (default: \$SPECDEC_GRPC_URL or localhost:8001)
  --metrics-url URL       Prometheus metrics, for the server-side figures (default:
                          \$SPECDEC_METRICS_URL or http://HOST:<gRPC port + 1>/metrics, Triton's layout;
                          optional: skipped with a note if unreachable)
  --start-server          start specdec-serve on free ports, stop it at the end
  --config YAML           specdec config: passed to specdec-serve with --start-server, and picks
                          the tokenizer (default: the built-in SmolLM2 config)
  --ready-timeout S       seconds to wait for the model to be ready (default: 300)
  --model NAME            model name (default: specdec)

Load (small defaults: the whole profile takes a few minutes on a 2-core CPU):
  --tool T                genai-perf (default) or perf_analyzer (same requests, no genai-perf venv)
  --concurrency N         concurrent streams (default: 2)
  --request-count N       measured requests (default: 8)
  --warmup N              warm-up requests (default: = concurrency; must be 0 or a multiple of it)
  --input-tokens N        synthetic prompt length in tokens (default: 32)
  --output-tokens N       max_tokens per request (default: 32)
  --seed N                prompt sampling seed (default: 0)
  --timeout S             limit for the benchmark client run itself (default: 900)

Output:
  --out DIR               artifact directory (default: artifacts/profile/<UTC time>-<tool>)

Environment: VENV (project venv, default .venv), GENAI_PERF_VENV (default .venv-genai-perf,
created on first use), PYTHON (interpreter for that venv, default python3), SPECDEC_GRPC_URL,
SPECDEC_METRICS_URL.
EOF
}

log() { printf '[profile] %s\n' "$*" >&2; }
die() {
    printf '[profile] error: %s\n' "$*" >&2
    exit 1
}

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv=${VENV:-$repo_root/.venv}
gp_venv=${GENAI_PERF_VENV:-$repo_root/.venv-genai-perf}
gp_python=${PYTHON:-python3}
helper_py=$repo_root/client/profile/profile_helper.py
# genai-perf and its own dependencies; the constraints file pins the set this was tested with
gp_pin=genai-perf==0.0.16
gp_constraints=$repo_root/client/profile/genai-perf-constraints.txt

url=${SPECDEC_GRPC_URL:-localhost:8001}
metrics_url=${SPECDEC_METRICS_URL:-}
start_server=0
config=""
ready_timeout=300
model=specdec
tool=genai-perf
concurrency=2
request_count=8
warmup=""
input_tokens=32
output_tokens=32
seed=0
run_timeout=900
out=""

need_value() { [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value (see --help)"; }
while [[ $# -gt 0 ]]; do
    case $1 in
        --url) need_value "$@"; url=$2; shift 2 ;;
        --metrics-url) need_value "$@"; metrics_url=$2; shift 2 ;;
        --start-server) start_server=1; shift ;;
        --config) need_value "$@"; config=$2; shift 2 ;;
        --ready-timeout) need_value "$@"; ready_timeout=$2; shift 2 ;;
        --model) need_value "$@"; model=$2; shift 2 ;;
        --tool) need_value "$@"; tool=$2; shift 2 ;;
        --concurrency) need_value "$@"; concurrency=$2; shift 2 ;;
        --request-count) need_value "$@"; request_count=$2; shift 2 ;;
        --warmup) need_value "$@"; warmup=$2; shift 2 ;;
        --input-tokens) need_value "$@"; input_tokens=$2; shift 2 ;;
        --output-tokens) need_value "$@"; output_tokens=$2; shift 2 ;;
        --seed) need_value "$@"; seed=$2; shift 2 ;;
        --timeout) need_value "$@"; run_timeout=$2; shift 2 ;;
        --out) need_value "$@"; out=$2; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done

is_int() { [[ $1 =~ ^[0-9]+$ ]]; }
for pair in "concurrency=$concurrency" "request-count=$request_count" "input-tokens=$input_tokens" \
    "output-tokens=$output_tokens" "seed=$seed" "timeout=$run_timeout" "ready-timeout=$ready_timeout"; do
    is_int "${pair#*=}" || die "--${pair%%=*} must be a whole number, got '${pair#*=}'"
done
warmup=${warmup:-$concurrency}
is_int "$warmup" || die "--warmup must be a whole number, got '$warmup'"
((concurrency >= 1 && request_count >= 1 && input_tokens >= 1 && output_tokens >= 1)) ||
    die "--concurrency, --request-count, --input-tokens and --output-tokens must be at least 1"
# perf_analyzer 2.51 splits the warm-up over the concurrent workers; a worker whose share is 0
# never stops (seen here: --warmup-request-count 1 --concurrency-range 2 runs until killed).
((warmup % concurrency == 0)) ||
    die "--warmup ($warmup) must be 0 or a multiple of --concurrency ($concurrency): perf_analyzer 2.51 hangs otherwise"
case $tool in genai-perf | perf_analyzer) ;; *) die "--tool must be genai-perf or perf_analyzer, got '$tool'" ;; esac
[[ $url == *:* ]] || die "--url must be HOST:PORT (gRPC), got '$url'"
[[ -z $config || -f $config ]] || die "--config: no such file: $config"
[[ -z $config ]] || config=$(cd "$(dirname "$config")" && pwd)/$(basename "$config")

[[ -x $venv/bin/python ]] || die "no project venv at $venv (run 'make venv' first, or set VENV)"
venv=$(cd "$venv" && pwd)
mkdir -p "$(dirname "$gp_venv")"
gp_venv=$(cd "$(dirname "$gp_venv")" && pwd)/$(basename "$gp_venv")
[[ -x $venv/bin/perf_analyzer ]] ||
    die "$venv/bin/perf_analyzer is missing: it comes with tritonclient==2.51.0 ('make venv' installs it)"
command -v timeout >/dev/null || die "'timeout' (coreutils) is required"

out=${out:-$repo_root/artifacts/profile/$(date -u +%Y%m%dT%H%M%SZ)-$tool}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/specdec-profile.XXXXXX")
server_pid=""

stop_server() {
    [[ -n $server_pid ]] || return 0
    local pid=$server_pid
    server_pid=""
    kill -0 "$pid" 2>/dev/null || return 0
    log "stopping the server (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    local waited=0
    while kill -0 "$pid" 2>/dev/null && ((waited < 60)); do
        sleep 1
        waited=$((waited + 1))
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "server still running after 60 s: killing its process group"
        kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}
# The benchmark client runs in the background under `timeout` (its own process group: a TERM to
# it reaches genai-perf and the perf_analyzer it spawned), so that a signal to this script is
# handled at once rather than after the client ends.
client_pid=""
run_client() {
    local log=$1 rc=0 tee_pid
    shift
    exec 3> >(tee "$log")
    tee_pid=$!
    "$@" >&3 2>&1 &
    client_pid=$!
    wait "$client_pid" || rc=$?
    client_pid=""
    exec 3>&-
    wait "$tee_pid" 2>/dev/null || true
    return "$rc"
}
stop_client() {
    [[ -n $client_pid ]] || return 0
    kill -TERM "$client_pid" 2>/dev/null || true
    local waited=0
    while kill -0 "$client_pid" 2>/dev/null && ((waited < 20)); do
        sleep 1
        waited=$((waited + 1))
    done
    kill -KILL "$client_pid" 2>/dev/null || true
    client_pid=""
}
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_client
    stop_server
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

helper() { "$venv/bin/python" "$helper_py" "$@"; }

# ---- perf_analyzer: the tritonclient wheel's binary wants libb64.so.0d and libcudart.so.12, which
# ship under hashed names in nvidia_pytriton.libs; give it a private dir of soname links.
shopt -s nullglob
pytriton_libs=("$venv"/lib/python3*/site-packages/nvidia_pytriton.libs)
[[ ${#pytriton_libs[@]} -ge 1 ]] || die "nvidia_pytriton.libs not found in $venv (is nvidia-pytriton installed?)"
b64=("${pytriton_libs[0]}"/libb64-*.so.0d*)
cudart=("${pytriton_libs[0]}"/libcudart-*.so.12*)
shopt -u nullglob
[[ ${#b64[@]} -ge 1 && ${#cudart[@]} -ge 1 ]] ||
    die "libb64/libcudart not found in ${pytriton_libs[0]}; perf_analyzer cannot run"
mkdir -p "$work/lib" "$work/bin"
ln -s "${b64[0]}" "$work/lib/libb64.so.0d"
ln -s "${cudart[0]}" "$work/lib/libcudart.so.12"
ln -s "$venv/bin/perf_analyzer" "$work/bin/perf_analyzer"
pa_env=(env "PATH=$work/bin:$PATH" "LD_LIBRARY_PATH=$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
pa_version=$("${pa_env[@]}" timeout 30 perf_analyzer --version 2>&1) ||
    die "perf_analyzer does not run: $pa_version"
log "$pa_version"

# ---- genai-perf in its own venv (its numpy 2 / transformers must not touch the project's pins)
if [[ $tool == genai-perf ]]; then
    if ! "$gp_venv/bin/genai-perf" --version 2>/dev/null | grep -qx "genai-perf ${gp_pin#*==}"; then
        log "installing $gp_pin into $gp_venv (first use: about 2 minutes, ~1 GB)"
        [[ -x $gp_venv/bin/python ]] || "$gp_python" -m venv "$gp_venv" ||
            die "cannot create $gp_venv with $gp_python (set PYTHON to a Python >= 3.10)"
        constraint_args=()
        [[ -f $gp_constraints ]] && constraint_args=(-c "$gp_constraints")
        timeout 1200 "$gp_venv/bin/python" -m pip install -q "$gp_pin" "${constraint_args[@]}" ||
            die "pip could not install $gp_pin into $gp_venv; use --tool perf_analyzer instead"
    fi
fi

# ---- server
if ((start_server)); then
    [[ -x $venv/bin/specdec-serve ]] ||
        die "--start-server: $venv/bin/specdec-serve is not installed; start a server yourself and pass --url"
    if ! help_text=$(timeout 60 "$venv/bin/specdec-serve" --help 2>&1); then
        die "--start-server: specdec-serve does not work here (${help_text##*$'\n'}); start a server yourself and pass --url"
    fi
    read -r http_port grpc_port metrics_port < <(helper free-ports 3)
    url=127.0.0.1:$grpc_port
    metrics_url=${metrics_url:-http://127.0.0.1:$metrics_port/metrics}
    serve_args=(--host 127.0.0.1 --http-port "$http_port" --grpc-port "$grpc_port"
        --metrics-port "$metrics_port" --model-repository "$work/model_repository"
        --ready-timeout "$ready_timeout" --log-file "$out/server.log")
    [[ -n $config ]] && serve_args+=(--config "$config")
    log "starting specdec-serve on gRPC $url (log: $out/server.log)"
    # own process group (setsid), so that a stuck server can be killed with everything it started
    setsid "$venv/bin/specdec-serve" "${serve_args[@]}" >"$out/server.stdout" 2>&1 &
    server_pid=$!
fi

host=${url%:*}
grpc_port=${url##*:}
is_int "$grpc_port" || die "--url must be HOST:PORT, got '$url'"
metrics_url=${metrics_url:-http://$host:$((grpc_port + 1))/metrics}

log "waiting up to ${ready_timeout} s for model '$model' on $url"
if ! helper ready "$url" "$model" "$ready_timeout" ${server_pid:+"$server_pid"}; then
    if [[ -n $server_pid ]]; then
        log "last lines of the server's output:"
        tail -n 20 "$out/server.stdout" "$out/server.log" 2>/dev/null >&2 || true
        die "the server started with --start-server did not become ready"
    fi
    die "no ready '$model' at $url: start a server (make serve) or pass --url / --start-server"
fi

log "writing the tokenizer for ${config:-the default config} (AutoTokenizer-loadable, offline)"
# kept under --out (3.5 MB) so that command.txt can be re-run as it is
tokenizer_dir=$out/tokenizer
timeout 600 "$venv/bin/python" "$helper_py" tokenizer "$tokenizer_dir" ${config:+"$config"} ||
    die "could not write the tokenizer (is the model package installed? 'make venv')"

metrics_before=$out/metrics_before.prom
metrics_after=$out/metrics_after.prom
have_metrics=1
helper metrics "$metrics_url" "$metrics_before" 2>/dev/null || {
    have_metrics=0
    log "note: metrics at $metrics_url unreachable; server-side figures skipped (set --metrics-url)"
}

# ---- the run
cd "$out"
status=0
if [[ $tool == genai-perf ]]; then
    cmd=("$gp_venv/bin/genai-perf" profile
        -m "$model" --backend tensorrtllm --endpoint-type kserve --streaming -u "$url"
        --synthetic-input-tokens-mean "$input_tokens" --synthetic-input-tokens-stddev 0
        --output-tokens-mean "$output_tokens" --output-tokens-stddev 0
        --concurrency "$concurrency" --request-count "$request_count"
        --warmup-request-count "$warmup" --random-seed "$seed"
        --tokenizer "$tokenizer_dir" --artifact-dir "$out/genai-perf")
    printf '%q ' "${cmd[@]}" >"$out/command.txt"
    echo >>"$out/command.txt"
    log "running: ${cmd[*]}"
    # offline: the tokenizer is the local directory; COLUMNS: room for genai-perf's table
    run_client "$out/genai-perf.log" env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 COLUMNS="${COLUMNS:-160}" \
        "${pa_env[@]}" timeout "$run_timeout" "${cmd[@]}" || status=$?
else
    mkdir -p "$out/perf_analyzer"
    helper prompts "$tokenizer_dir" "$out/perf_analyzer/inputs.json" "$((request_count + warmup))" \
        "$input_tokens" "$output_tokens" "$seed"
    cmd=(perf_analyzer -m "$model" -i grpc --async --streaming -u "$url" --service-kind triton
        --concurrency-range "$concurrency" --request-count "$request_count"
        --warmup-request-count "$warmup" --stability-percentage 999
        --input-data "$out/perf_analyzer/inputs.json" --shape max_tokens:1 --shape text_input:1
        --profile-export-file "$out/perf_analyzer/profile_export.json")
    printf '%q ' "${cmd[@]}" >"$out/command.txt"
    echo >>"$out/command.txt"
    log "running: ${cmd[*]}"
    run_client "$out/perf_analyzer.log" "${pa_env[@]}" timeout "$run_timeout" "${cmd[@]}" || status=$?
fi
((status != 124)) || die "the benchmark client ran past --timeout ${run_timeout} s (artifacts so far: $out)"
((status == 0)) || die "$tool failed (exit $status); see $out/$tool.log"

((have_metrics)) && { helper metrics "$metrics_url" "$metrics_after" || log "note: metrics unreachable after the run"; }
delta_args=()
[[ -f $metrics_after ]] && delta_args=("$metrics_before" "$metrics_after")

if [[ $tool == genai-perf ]]; then
    summary_json=$(find "$out/genai-perf" -name profile_export_genai_perf.json -print -quit)
    [[ -n $summary_json ]] || die "genai-perf wrote no profile_export_genai_perf.json under $out/genai-perf"
    helper summary genai-perf "$summary_json" "${delta_args[@]}"
else
    summary_json=$out/perf_analyzer/summary.json
    helper summary perf_analyzer "$out/perf_analyzer/profile_export.json" "$tokenizer_dir" \
        "$summary_json" "${delta_args[@]}"
fi
printf '\nArtifacts: %s\n  figures: %s\n  command: %s\n' "$out" "$summary_json" "$out/command.txt"
