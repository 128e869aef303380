#!/usr/bin/env bash
# A real llama.cpp saves and restores its KV state through libkv_store_wasm.so
# (issue 16; docs/llama.md). Builds what it needs (llama.cpp once, into the
# tool cache: scripts/llama-build.sh), generates the tiny model, builds
# examples/llama-slot and the native backend, starts a redis-server on
# loopback, and asserts:
#   - next-token logits after a restore are bit-identical to those of the
#     context that never left memory, for several prompts, through
#     wasm://<dir> (fs guest) and wasm://redis/... (real redis-server), and
#     the same on both backends; different prompts give different logits;
#   - two prompts sharing a 224-token prefix: the second save stores only
#     the chunks that differ (exact counts);
#   - examples/native-backend (libkv_store_cfs.so) on the same directory
#     restores what the fs guest wrote with the same logits, and the reverse.
#
# --server: the same tests for llama-server itself, patched with
# examples/llama-server (scripts/llama-build.sh --server), through its HTTP
# API (scripts/llama-server-e2e.py: restarts, backends, shared prefixes, bad
# stores), after examples/include/kv_slot_test.c (a state saved in pieces,
# as the patched server does, stores the chunks one buffer does).
# KVWASM_HOSTILE_GUEST: the hostile test guest's component (its trap case
# is skipped without it; tests/tests/llama_server.rs passes it).
# --bench: the patched llama-server saving through kvwasm side by side with
# upstream's plain slot files, on a generated 16-layer model (docs/llama.md);
# KVWASM_BENCH_DIR: where the stores go (default: the system temp dir);
# KVWASM_BENCH_BASELINE: another llama-server binary (e.g. the previous
# patch's build in the tool cache) whose fs sides run beside this one's;
# KVWASM_BENCH_BASELINE_SHIM_DIR: another build's libkv_store_wasm.so (its
# directory), loaded by those baseline sides.
#
# KVWASM_SHIM_DIR: directory holding libkv_store_wasm.so (default: built
# with cargo into target/release). Prints one JSON line per run, then a
# summary of restore times.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
mode=${1:-}
case "$mode" in "" | --server | --bench) ;; *) echo "usage: $0 [--server | --bench]" >&2 && exit 2 ;; esac

# The models' sha256: scripts/llama-make-model.py [--bench] with gguf 0.19.0.
MODEL_SHA256=3c69ed62aa0fbf3854e08ac7eb1c1179996dbc147670f0aee37e8462346d1635
BENCH_MODEL_SHA256=18d2406047218a045e9f849a48e99de636ee6d4bae82f70c7b561dca4af9e861
GGUF_PINS=(gguf==0.19.0 numpy==2.4.6)
ROWS=32 # rows (cells) per chunk
N_LAYER=4

fail() {
    echo "llama-e2e: FAILED: $*" >&2
    exit 1
}

cache="${XDG_CACHE_HOME:-$HOME/.cache}/kvwasm-tools"
mkdir -p "$cache"

work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# The model: generated (never committed), its bytes checked.
venv="$cache/gguf-venv"
(
    flock 9
    if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import gguf' 2>/dev/null; then
        python3 -m venv "$venv" >&2
        "$venv/bin/pip" install -q "${GGUF_PINS[@]}" >&2
    fi
) 9>"$venv.lock"
model="$work/model.gguf"
if [ "$mode" = --bench ]; then
    "$venv/bin/python" scripts/llama-make-model.py --bench "$model"
    echo "$BENCH_MODEL_SHA256  $model" | sha256sum -c --quiet - || fail "the generated model's sha256 changed"
else
    "$venv/bin/python" scripts/llama-make-model.py "$model"
    echo "$MODEL_SHA256  $model" | sha256sum -c --quiet - || fail "the generated model's sha256 changed"
fi

mkdir -p "$work/native"
make -s -C examples/native-backend OUT="$work/native"
if [ -z "${KVWASM_SHIM_DIR:-}" ]; then
    cargo build --release --locked -q -p kvwasm-shim
    KVWASM_SHIM_DIR="$root/target/release"
fi
[ -f "$KVWASM_SHIM_DIR/libkv_store_wasm.so" ] || fail "no libkv_store_wasm.so in $KVWASM_SHIM_DIR"

if [ -n "$mode" ]; then
    server_prefix=$(bash scripts/llama-build.sh --server)
    if [ "$mode" = --server ]; then
        # the server saves a state in pieces, llama-slot in one buffer: the same chunks
        cc -O2 -Wall -Wextra -Werror -std=c11 -Iexamples/include -I"$server_prefix/include/xxhash" \
            -o "$work/kv_slot_test" examples/include/kv_slot_test.c examples/include/kv_slot.c -pthread
        "$work/kv_slot_test" >&2 || fail "kv_slot_test"
    fi
    LLAMA_SERVER="$server_prefix/bin/llama-server" LLAMA_MODEL="$model" KVWASM_SHIM_DIR="$KVWASM_SHIM_DIR" \
        KVWASM_NATIVE_DIR="$work/native" python3 scripts/llama-server-e2e.py ${mode/--server/}
    exit 0
fi

prefix=$(bash scripts/llama-build.sh)
make -s -C examples/llama-slot LLAMA="$prefix" OUT="$work"

# A real redis-server on a free loopback port, with a password that reaches
# the guest only through a granted environment variable.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
redis_port=$(free_port)
export KVWASM_LLAMA_REDIS_PASSWORD="llama-$RANDOM$RANDOM"
cat >"$work/redis.conf" <<CONF
bind 127.0.0.1
port $redis_port
dir $work
save ""
requirepass $KVWASM_LLAMA_REDIS_PASSWORD
logfile $work/redis.log
CONF
redis-server "$work/redis.conf" >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$redis_port") 2>/dev/null && break
    sleep 0.1
done
(exec 3<>"/dev/tcp/127.0.0.1/$redis_port") 2>/dev/null || fail "redis-server does not listen: $(cat "$work/redis.log")"
cat >"$work/kvwasm.toml" <<TOML
[backends.redis]
component = "builtin:redis"
net = ["127.0.0.1:$redis_port"]
env = ["KVWASM_LLAMA_REDIS_PASSWORD"]
[backends.redis.settings]
address = "127.0.0.1:$redis_port"
password_env = "KVWASM_LLAMA_REDIS_PASSWORD"
TOML
export KVWASM_CONFIG="$work/kvwasm.toml"

# field JSON NAME: a number or string field of a JSON line.
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
# run LIBDIR [OPTS] URI NAME [PROMPT]: one bounded llama-slot run with the
# backends of LIBDIR; its JSON line on stdout (and stderr, for the log).
run() {
    local lib=$1 opts=() out
    shift
    while [ "${1:0:1}" = - ]; do
        if [ "$1" = -R ]; then opts+=(-R) && shift; else opts+=("$1" "$2") && shift 2; fi
    done
    out=$(KV_STORE_LIBRARY_PATH="$lib" timeout 120 "$work/llama-slot" -r "$ROWS" "${opts[@]}" "$model" "$@") ||
        fail "llama-slot ${opts[*]} $* failed"
    echo "$out" >&2
    echo "$out"
}

fs_uri="wasm://$work/store"
redis_uri="wasm://redis/llama-e2e"
prompts=("1:37" "2:130" "3:300")
# Restore times (ms) of the round trips: the backend already loaded in the
# process ("warm"); the -R runs below restore in a new process ("cold").
declare -A warm

echo "== round trips, fs guest and Redis: bit-identical logits" >&2
for i in "${!prompts[@]}"; do
    for backend in fs redis; do
        uri=$fs_uri
        [ "$backend" = redis ] && uri=$redis_uri
        j=$(run "$KVWASM_SHIM_DIR" -o "$work/$backend-$i.logits" "$uri" "p$i" "${prompts[$i]}")
        warm[$backend$i]=$(field "$j" restore_ms)
        [ "$(field "$j" logits_identical)" = True ] || fail "logits differ after a restore: $j"
        [ "$(field "$j" tokens)" = "$(( ${prompts[$i]#*:} ))" ] || fail "token count: $j"
    done
    cmp -s "$work/fs-$i.logits" "$work/redis-$i.logits" || fail "prompt $i: fs and Redis logits differ"
done
for i in 1 2; do
    cmp -s "$work/fs-0.logits" "$work/fs-$i.logits" && fail "prompts 0 and $i give the same logits"
done
[ -s "$work/store/p0" ] || fail "no manifest p0 in the fs store"

echo "== shared prefix: the second save stores only the chunks that differ" >&2
# 224 shared tokens = 7 full chunks of 32 rows in each of the 2*N_LAYER row
# regions; the header chunk (tokens, and the first region's descriptor) and
# each region's last chunk differ. Every later region's 12-byte descriptor
# is a chunk of its own, the same for all (K and V rows of one type and
# size): stored once by the first save, deduplicated after that.
prefix_tokens=224 tail_tokens=32
shared=$((prefix_tokens / ROWS))
regions=$((2 * N_LAYER))
descriptors=$((regions - 1))
per_region=$(((prefix_tokens + tail_tokens + ROWS - 1) / ROWS))
for backend in fs redis; do
    uri="$fs_uri/dedup"
    [ "$backend" = redis ] && uri="$redis_uri/dedup"
    a=$(run "$KVWASM_SHIM_DIR" "$uri" a "7:$prefix_tokens,11:$tail_tokens")
    b=$(run "$KVWASM_SHIM_DIR" "$uri" b "7:$prefix_tokens,12:$tail_tokens")
    chunks=$((1 + descriptors + regions * per_region))
    [ "$(field "$a" chunks)" = $chunks ] && [ "$(field "$a" stored)" = $((chunks - descriptors + 1)) ] ||
        fail "$backend: first save should store $((chunks - descriptors + 1)) of $chunks chunks: $a"
    dedup=$((descriptors + regions * shared))
    [ "$(field "$b" chunks)" = $chunks ] && [ "$(field "$b" deduplicated)" = $dedup ] &&
        [ "$(field "$b" stored)" = $((chunks - dedup)) ] ||
        fail "$backend: second save should deduplicate $dedup of $chunks chunks: $b"
done

echo "== native backend on the same directory: same logits, both ways" >&2
summary=("prompt  tokens  state bytes  chunks | restore ms, cold: wasm fs  native cfs | warm: wasm fs  wasm redis  native cfs")
for i in "${!prompts[@]}"; do
    n=$(run "$work/native" -R -o "$work/cfs-$i.logits" "cfs://$work/store" "p$i")
    cmp -s "$work/fs-$i.logits" "$work/cfs-$i.logits" || fail "prompt $i: native restore gives other logits"
    w=$(run "$KVWASM_SHIM_DIR" -R -o "$work/wasm-$i.logits" "$fs_uri" "p$i")
    cmp -s "$work/fs-$i.logits" "$work/wasm-$i.logits" || fail "prompt $i: restore-only gives other logits"
    # The reverse: the native backend saves, the fs guest restores.
    r=$(run "$work/native" -o "$work/native-$i.logits" "cfs://$work/native-store" "n$i" "${prompts[$i]}")
    cmp -s "$work/fs-$i.logits" "$work/native-$i.logits" || fail "prompt $i: native round trip gives other logits"
    run "$KVWASM_SHIM_DIR" -R -o "$work/from-native-$i.logits" "wasm://$work/native-store" "n$i" >/dev/null
    cmp -s "$work/fs-$i.logits" "$work/from-native-$i.logits" ||
        fail "prompt $i: the fs guest restores the native save with other logits"
    summary+=("$(printf '%-6s %7s %12s %7s | %24s %11s | %14s %11s %11s' \
        "p$i" "$(field "$w" tokens)" "$(field "$w" state_bytes)" "$(field "$w" chunks)" \
        "$(field "$w" restore_ms)" "$(field "$n" restore_ms)" \
        "${warm[fs$i]}" "${warm[redis$i]}" "$(field "$r" restore_ms)")")
done

printf '%s\n' "${summary[@]}"
echo "llama-e2e: OK"
