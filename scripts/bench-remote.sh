#!/usr/bin/env bash
# The remote backends' benchmark in docs/benchmarks.md: a 96 × 1 MiB save,
# the same save warm (same handle, then a new one), and restores, through
# libkv_store_wasm.so into a real Redis and a real S3 server (s3s-fs), both
# on loopback with their data on tmpfs, next to the native C backend on
# tmpfs. Each remote backend runs twice: `dedup_check = "put"` (the
# default: exact put_chunk return codes) and `"flush"` (MemKV's batching).
# Redis runs once more over TLS (`redis-tls`): the same server's
# `tls-port`, with a CA and certificate made here by openssl.
# Then `kvwasm bench --remote`: the same guests against native clients
# (the `redis` crate, pipelined; hiredis in C, examples/hiredis-baseline,
# skipped with a message if libhiredis-dev is missing; reqwest with
# aws-sigv4) on the same servers, side by side, with ratios and CPU per
# operation (issues 17, 43), and on a Redis Cluster of 3 masters + 3
# replicas started by target/release/kv-redis-cluster (the tests' cluster):
# builtin:redis in `mode = "cluster"` against the `redis` crate's cluster
# client, each beside itself on the one server (issue 42).
# `--remote-only` skips the first part. Other arguments go to `kvwasm bench`
# (e.g. --reps 3, --quick; with --remote-only also --same-handle).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
remote_only=false
if [[ "${1:-}" == --remote-only ]]; then
    remote_only=true
    shift
fi
# The options of `kvwasm bench --remote` alone cannot go to the second part.
if ! "$remote_only"; then
    for arg in "$@"; do
        case "$arg" in
        --same-handle | --guests* | --redis-pid* | --s3-pid*)
            echo "$arg applies to the native-client comparison only: use --remote-only $arg" >&2
            exit 2
            ;;
        esac
    done
fi
bash scripts/setup.sh >/dev/null
bash scripts/test-servers.sh
make -s -C examples/native-backend OUT="$PWD/target/release"

work=$(mktemp -d /dev/shm/kvwasm-bench-remote.XXXXXX)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing listens on 127.0.0.1:$1 ($2); see $work" >&2
    exit 1
}

redis_port=$(free_port)
redis_tls_port=$(free_port)
# A test CA and a server certificate for 127.0.0.1 (P-256), for `tls-port`.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=kvwasm-bench-ca -keyout "$work/ca.key" -out "$work/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=127.0.0.1 \
    -keyout "$work/server.key" -out "$work/server.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >"$work/server.ext"
openssl x509 -req -in "$work/server.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" \
    -CAcreateserial -days 2 -extfile "$work/server.ext" -out "$work/server.pem" 2>/dev/null
export KVWASM_BENCH_REDIS_PASSWORD="bench-$RANDOM$RANDOM"
cat >"$work/redis.conf" <<CONF
bind 127.0.0.1
port $redis_port
dir $work
appendonly yes
appendfsync everysec
save ""
requirepass $KVWASM_BENCH_REDIS_PASSWORD
logfile $work/redis.log
tls-port $redis_tls_port
tls-cert-file $work/server.pem
tls-key-file $work/server.key
tls-ca-cert-file $work/ca.pem
tls-auth-clients no
CONF
redis-server "$work/redis.conf" >/dev/null 2>&1 &
pids+=($!)
redis_pid=$!
wait_port "$redis_port" redis-server

s3_port=$(free_port)
export AWS_ACCESS_KEY_ID="AKBENCH$RANDOM" AWS_SECRET_ACCESS_KEY="sk-bench-$RANDOM$RANDOM"
mkdir -p "$work/s3/kv-cache"
target/tools/bin/s3s-fs --host 127.0.0.1 --port "$s3_port" \
    --access-key "$AWS_ACCESS_KEY_ID" --secret-key "$AWS_SECRET_ACCESS_KEY" "$work/s3" \
    >/dev/null 2>"$work/s3s-fs.log" &
pids+=($!)
s3_pid=$!
wait_port "$s3_port" s3s-fs

# One save (96 MiB) is staged in one batch; a restore's prefetch fits.
limits='memory_limit_mib = 512
call_timeout_ms = 30000'
redis_entry() {
    cat <<ENTRY
[backends.$1]
component = "builtin:redis"
net = ["127.0.0.1:${3:-$redis_port}"]
env = ["KVWASM_BENCH_REDIS_PASSWORD"]
$limits
settings = { address = "127.0.0.1:${3:-$redis_port}", password_env = "KVWASM_BENCH_REDIS_PASSWORD", dedup_check = "$2", max_pending_mib = 128, timeout_ms = 20000 }
${4:-}
ENTRY
}
s3_entry() {
    cat <<ENTRY
[backends.$1]
component = "builtin:s3"
http = ["http://127.0.0.1:$s3_port"]
env = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
$limits
settings = { endpoint = "http://127.0.0.1:$s3_port", bucket = "kv-cache", dedup_check = "$2", max_pending_mib = 128, timeout_ms = 20000 }
ENTRY
}
{
    redis_entry redis put
    redis_entry redis-batched flush
    redis_entry redis-tls put "$redis_tls_port" "tls = { ca_file = \"$work/ca.pem\" }"
    s3_entry s3 put
    s3_entry s3-batched flush
} >"$work/kvwasm.toml"
export KVWASM_CONFIG="$work/kvwasm.toml"
target/release/kvwasm check-config >/dev/null

hiredis=()
if make -s -C examples/hiredis-baseline OUT="$PWD/target/release" 2>"$work/hiredis.log"; then
    hiredis=(--hiredis "$PWD/target/release/libkvwasm_bench_hiredis.so")
else
    echo "the hiredis (C) rows are skipped: $(cat "$work/hiredis.log")" >&2
fi
target/release/kv-redis-cluster \
    target/release/kvwasm bench --remote --redis "127.0.0.1:$redis_port" --s3 "http://127.0.0.1:$s3_port" \
    --redis-cluster '{nodes}' "${hiredis[@]}" \
    --redis-pid "$redis_pid" --s3-pid "$s3_pid" --json target/bench-remote-native.json "$@"
"$remote_only" && exit 0

shim=target/release/libkv_store_wasm.so
target/release/kvwasm bench --only save-restore,small-call --dir "tmpfs=$work" \
    --target "native=target/release/libkv_store_cfs.so=cfs://{dir}" \
    --target "redis=$shim=wasm://redis/bench{dir}" \
    --target "redis-batched=$shim=wasm://redis-batched/bench{dir}" \
    --target "redis-tls=$shim=wasm://redis-tls/bench{dir}" \
    --target "s3=$shim=wasm://s3/bench{dir}" \
    --target "s3-batched=$shim=wasm://s3-batched/bench{dir}" \
    --json target/bench-remote-samples.json "$@"
