#!/usr/bin/env bash
# Installs what kvwasm needs on a machine that has only the Rust toolchain,
# then builds everything (release). Idempotent; sourced by demo.sh/test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n== %s\n' "$*"; }

if ! rustup target list --installed | grep -qx wasm32-wasip2; then
    step "rustup target add wasm32-wasip2 (guest backends are WebAssembly components)"
    rustup target add wasm32-wasip2
fi

# Debian packages: a C compiler, make and xxhash.h for the C examples
# (examples/c-consumer, examples/native-backend, tests/broken-backends);
# hiredis below.
missing=()
command -v cc >/dev/null || missing+=(gcc libc6-dev)
command -v make >/dev/null || missing+=(make)
[ -f /usr/include/xxhash.h ] || missing+=(libxxhash-dev)
# hiredis for examples/hiredis-baseline, the C Redis client `kvwasm bench
# --remote --hiredis` measures against (built by make, never by cargo).
[ -f /usr/include/hiredis/hiredis.h ] || missing+=(libhiredis-dev)
if [ ${#missing[@]} -gt 0 ]; then
    step "apt-get install ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

step "cargo build --release --workspace (first build: ~10 min on 2 cores)"
cargo build --release --workspace --locked
