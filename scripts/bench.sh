#!/usr/bin/env bash
# The benchmark behind docs/benchmarks.md: the native C backend (baseline)
# and libkv_store_wasm.so with the fs guest, side by side, on tmpfs and disk.
# Extra arguments go to `kvwasm bench` (e.g. --reps 9, --quick).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh >/dev/null
make -s -C examples/native-backend OUT="$PWD/target/release"
target/release/kvwasm compile >/dev/null   # warm the artifact cache
# Warns if the library was linked without most of its hot-path order.
bash scripts/hot-path-order.sh --check || true
exec target/release/kvwasm bench --plot docs/benchmarks.svg --json target/bench-samples.json "$@"
