#!/usr/bin/env bash
# shim-cdylib/hot-path.order: the functions of libkv_store_wasm.so that its
# calls run. shim-cdylib/build.rs has the linker place them together at the
# start of the library's code, so a call that finds the core's caches cold
# (after a consumer's large copy) misses on fewer code pages and cache lines
# (docs/benchmarks.md, "A call with cold caches").
#
#   bash scripts/hot-path-order.sh           regenerate the list (needs perf:
#                                            apt-get install linux-perf)
#   bash scripts/hot-path-order.sh --check   whether the built library has the
#                                            list (90% of it or more) and in
#                                            its order
#
# The list names mangled symbols, whose hashes change with the toolchain,
# Cargo.lock and features (and `.llvm.N` suffixes with edits to their code):
# regenerate it after such changes, or when --check fails. The library is
# built as scripts/setup.sh builds it (--workspace: features unify across
# the workspace, and they change the hashes).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
order=shim-cdylib/hot-path.order
lib=target/release/libkv_store_wasm.so

if [[ "${1:-}" == --check ]]; then
    total=$(grep -c . "$order" || true)
    # Names found, and how many of them sit at a lower address than the
    # name before them in the list (0 when the linker followed it).
    read -r found disordered < <(nm -n "$lib" | awk '
        NR == FNR { rank[$1] = FNR; names = FNR; next }
        ($3 in rank) && !seen[$3]++ { at[rank[$3]] = FNR; n++ }
        END {
            for (r = 1; r <= names; r++) if (r in at) { if (at[r] < last) d++; last = at[r] }
            print n + 0, d + 0
        }' "$order" -)
    echo "hot-path.order: $found of $total functions are in $lib, $disordered out of order"
    if (( found * 10 < total * 9 || disordered * 10 > found )); then
        echo "hot-path.order is stale or was not applied: run bash scripts/hot-path-order.sh" >&2
        exit 1
    fi
    exit 0
fi

command -v perf >/dev/null || { echo "hot-path-order: needs perf (apt-get install linux-perf)" >&2; exit 1; }
cargo build --release --locked --workspace
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
# callers the chains add. Without frame pointers a chain can name a function
# that did not run (a stale return address): it only takes room in the
# ordered block.
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
cat "$list" > "$order"
echo "$order: $count functions"
