#!/usr/bin/env bash
# Regenerate shim-cdylib/hot-path.order: the functions of libkv_store_wasm.so
# that its calls run, most sampled first. The linker places them together at
# the start of the library's code (shim-cdylib/build.rs), so a call that
# reaches the library with cold caches (after a large transfer, or when it
# cycles through many handles) misses on fewer code pages and cache lines
# (docs/benchmarks.md, "A call with cold caches").
#
# Needs `perf` (Debian: linux-perf). Run it after changes to the call path or
# to wasmtime; names that no longer exist are ignored by the linker, so a
# stale list only loses part of its effect.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v perf >/dev/null || { echo "hot-path-order: needs perf (apt-get install linux-perf)" >&2; exit 1; }

cargo build --release --locked -p kvwasm-shim -p kvwasm-cli
make -s -C examples/native-backend OUT="$PWD/target/release"
target/release/kvwasm compile >/dev/null

data=$(mktemp)
trap 'rm -f "$data"' EXIT
# Warm and cold small calls, then puts and gets of every size: the paths a
# consumer's calls take. Call graphs add the callers of each sampled function.
perf record -q -e cpu-clock -F 25000 -g -o "$data" -- \
    target/release/kvwasm bench --only small-call,throughput --dir tmpfs=/dev/shm --reps 1 \
    --no-progress --target kvwasm=target/release/libkv_store_wasm.so=wasm://{dir} >/dev/null
perf script -i "$data" --no-demangle -F ip,sym,dso 2>/dev/null |
    awk '/libkv_store_wasm\.so/ && $2 != "[unknown]" { print $2 }' |
    sort | uniq -c | sort -rn | awk '{ print $2 }' > shim-cdylib/hot-path.order
echo "shim-cdylib/hot-path.order: $(wc -l < shim-cdylib/hot-path.order) functions"
