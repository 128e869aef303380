#!/usr/bin/env bash
# Installs the kvwasm toolkit from this checkout under PREFIX (default ~/.local):
#
#   PREFIX/bin/kvwasm                       the CLI (check, new, wit, inspect, bench, ...)
#   PREFIX/lib/libkv_store_wasm.so          the kv_store_v1 shim inference engines load
#   PREFIX/include/kv_store_abi.h           the vtable, for C consumers and native backends
#   PREFIX/include/kv_store_loader.h        loading a backend as llama.cpp does
#
# Builds both first (cargo build --release --locked). The CLI alone:
#   cargo install --path host/cli --locked
# (it finds the shim in $KV_STORE_LIBRARY_PATH, next to itself, or in ../lib).
set -euo pipefail

prefix="${1:-$HOME/.local}"
cd "$(dirname "$0")/.."

# The whole workspace, as scripts/test.sh builds it (then a no-op): a
# `-p` subset may resolve features differently and rebuild wasmtime.
cargo build --release --locked
built="${CARGO_TARGET_DIR:-target}/release"

install -D -m 755 "$built/kvwasm" "$prefix/bin/kvwasm"
install -D -m 755 "$built/libkv_store_wasm.so" "$prefix/lib/libkv_store_wasm.so"
install -D -m 644 examples/include/kv_store_abi.h "$prefix/include/kv_store_abi.h"
install -D -m 644 examples/include/kv_store_loader.h "$prefix/include/kv_store_loader.h"

cat >&2 <<DONE
installed under $prefix:
  $prefix/bin/kvwasm
  $prefix/lib/libkv_store_wasm.so
  $prefix/include/kv_store_abi.h, kv_store_loader.h
Engines find the shim through KV_STORE_LIBRARY_PATH=$prefix/lib (or the
system loader's path). Start a backend with: kvwasm new --lang rust my-store
DONE
