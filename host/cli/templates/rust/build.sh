#!/usr/bin/env bash
# Builds {{name}}.wasm, the component kvwasm loads. Needs Rust (rustup);
# adds the wasm32-wasip2 target if it is missing.
set -euo pipefail
cd "$(dirname "$0")"
if ! rustup target list --installed | grep -qx wasm32-wasip2; then
    rustup target add wasm32-wasip2
fi
cargo build --release --target wasm32-wasip2 --locked
cp "${CARGO_TARGET_DIR:-target}"/wasm32-wasip2/release/{{crate}}.wasm {{name}}.wasm
echo "built {{name}}.wasm; test it with: kvwasm check --component {{name}}.wasm" >&2
