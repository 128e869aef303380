#!/usr/bin/env bash
# open() latency of libkv_store_wasm.so, as `kvwasm demo` measures it, over
# RUNS fresh processes each: with an empty artifact cache (compile on first
# use), with a warm cache (first open in a process), and a second open in
# the same process. Prints each sample and the median. Needs a release build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RUNS=${RUNS:-7}
kvwasm=target/release/kvwasm
demo() { "$kvwasm" demo --sessions 1 --prefix-tokens 64 --unique-tokens 64 --layers 1 "$@"; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

cold=() warm=() again=()
for _ in $(seq "$RUNS"); do
    cache=$(mktemp -d)
    line=$(KVWASM_CACHE_DIR=$cache demo | grep '^  open')
    cold+=("$(awk '{print $3}' <<<"$line")")
    line=$(KVWASM_CACHE_DIR=$cache demo | grep '^  open')
    warm+=("$(awk '{print $3}' <<<"$line")")
    again+=("$(awk '{print $10}' <<<"$line")")
    rm -rf "$cache"
done
printf '%-34s %-40s %s\n' "case" "samples (ms)" "median (ms)"
printf '%-34s %-40s %s\n' "first open, empty cache (compile)" "${cold[*]}" "$(printf '%s\n' "${cold[@]}" | median)"
printf '%-34s %-40s %s\n' "first open, warm cache" "${warm[*]}" "$(printf '%s\n' "${warm[@]}" | median)"
printf '%-34s %-40s %s\n' "another open, same process" "${again[*]}" "$(printf '%s\n' "${again[@]}" | median)"
