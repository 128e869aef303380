#!/usr/bin/env bash
# Builds kvwasm-vendor-starter.wasm, the component kvwasm loads. Needs Rust (rustup);
# adds the wasm32-wasip2 target if it is missing.
set -euo pipefail
cd "$(dirname "$0")"
if ! rustup target list --installed | grep -qx wasm32-wasip2; then
    rustup target add wasm32-wasip2
fi
cargo build --release --target wasm32-wasip2 --locked
cp "${CARGO_TARGET_DIR:-target}"/wasm32-wasip2/release/kvwasm_vendor_starter.wasm kvwasm-vendor-starter.wasm
echo "built kvwasm-vendor-starter.wasm; test it with: kvwasm check --component kvwasm-vendor-starter.wasm" >&2
