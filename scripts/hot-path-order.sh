#!/usr/bin/env bash
# shim-cdylib/hot-path.order: the functions of libkv_store_wasm.so that its
# calls run. shim-cdylib/build.rs has the linker place them together at the
# start of the library's code, so a call that finds the core's caches cold
# (after a consumer's large copy) misses on fewer code pages and cache lines
# (docs/benchmarks.md, "A call with cold caches").
#
#   bash scripts/hot-path-order.sh           regenerate the list (needs perf:
#                                            apt-get install linux-perf)
#   bash scripts/hot-path-order.sh --check   how much of the list the built
#                                            library has; fails below 90%
#
# The list names mangled symbols, whose hashes change with the toolchain,
# Cargo.lock and features: regenerate it after upgrading either, or when
# --check fails. The library is built as scripts/setup.sh builds it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
order=shim-cdylib/hot-path.order
lib=target/release/libkv_store_wasm.so

if [[ "${1:-}" == --check ]]; then
    total=$(grep -c . "$order")
    found=$(nm "$lib" | awk 'NR == FNR { want[$1] = 1; next } $3 in want && !seen[$3]++ { n++ } END { print n + 0 }' "$order" -)
    echo "hot-path.order: $found of $total functions are in $lib"
    if (( found * 10 < total * 9 )); then
        echo "hot-path.order is stale: run bash scripts/hot-path-order.sh" >&2
        exit 1
    fi
    exit 0
fi

command -v perf >/dev/null || { echo "hot-path-order: needs perf (apt-get install linux-perf)" >&2; exit 1; }
cargo build --release --locked -p kvwasm-shim -p kvwasm-cli
target/release/kvwasm compile >/dev/null

data=$(mktemp)
list=$(mktemp)
trap 'rm -f "$data" "$list"' EXIT
# Warm and cold empty calls, then puts and gets of every size, on the
# calling thread (comm "kvwasm"; the library's own threads are left out).
perf record -q -e cpu-clock -F 25000 -g -o "$data" -- \
    target/release/kvwasm bench --only small-call,throughput --dir tmpfs=/dev/shm --reps 1 \
    --no-progress --target kvwasm="$lib"='wasm://{dir}' >/dev/null
# One record per sample: "comm" then its call chain, innermost first. The
# functions sampled themselves come first, most samples first; then the
# callers the chains add (frame-pointer chains are partial without frame
# pointers, but every name in them did run).
perf script -i "$data" --no-demangle -F comm,ip,sym,dso |
    awk -v RS= -F '\n' '
        $1 ~ /^ *kvwasm / {
            for (i = 2; i <= NF; i++) {
                split($i, f, " ")
                if ($i !~ /libkv_store_wasm\.so/ || f[2] == "[unknown]") continue
                if (i == 2) leaf[f[2]]++; else caller[f[2]]++
            }
        }
        END {
            for (s in leaf) print 2, leaf[s], s
            for (s in caller) if (!(s in leaf)) print 1, caller[s], s
        }' |
    sort -k1,1nr -k2,2nr | awk '{ print $3 }' > "$list"
count=$(grep -c . "$list" || true)
if (( count < 100 )); then
    echo "hot-path-order: only $count functions sampled; $order left as it was" >&2
    exit 1
fi
mv "$list" "$order"
echo "$order: $count functions"
