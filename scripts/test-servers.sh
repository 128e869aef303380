#!/usr/bin/env bash
# Installs the real servers the remote backends are tested against; the
# tests start and stop them themselves, on loopback ports:
#   - redis-server and redis-cli, from Debian's `redis-server` package;
#   - s3s-fs, an S3 server that checks SigV4 signatures, built from
#     crates.io into target/tools (0.14.1: the last release for Rust 1.95).
# Idempotent; called by scripts/test.sh and scripts/bench.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n== %s\n' "$*"; }

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    step "apt-get install redis-server (the Redis backend's tests run a real server)"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server
    # The package starts a system-wide server on :6379; the tests run their own.
    $SUDO systemctl disable --now redis-server >/dev/null 2>&1 || true
fi

S3S_FS_VERSION=0.14.1
if [ ! -x target/tools/bin/s3s-fs ]; then
    step "cargo install s3s-fs $S3S_FS_VERSION (the S3 backend's tests run a real S3 server; ~4 min)"
    cargo install --quiet --locked --root target/tools s3s-fs --version "=$S3S_FS_VERSION" --features binary
fi
