#!/usr/bin/env bash
# The main job: build kvwasm, then run `kvwasm demo` — a simulated inference
# engine saving and restoring sessions through libkv_store_wasm.so into the
# embedded, sandboxed filesystem backend (zero configuration). Extra
# arguments go to `kvwasm demo` (see `target/release/kvwasm demo --help`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
printf '\n== kvwasm demo\n'
exec target/release/kvwasm demo "$@"
