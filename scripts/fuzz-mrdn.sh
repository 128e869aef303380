#!/usr/bin/env bash
# libFuzzer (cargo-fuzz, nightly) on the MRDN decoders for a bounded time:
#   bash scripts/fuzz-mrdn.sh [SECONDS]      (default 60)
# cargo-fuzz is installed once into a cache outside the clone
# (${XDG_CACHE_HOME:-~/.cache}/kvwasm-tools/cargo-fuzz); the corpus lives in
# target/fuzz-corpus/mrdn-decode, its instrumented build beside cargo-fuzz.
# Exits non-zero on any crash.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-60}
tools="${XDG_CACHE_HOME:-$HOME/.cache}/kvwasm-tools/cargo-fuzz"
if [ ! -x "$tools/bin/cargo-fuzz" ]; then
    echo "installing cargo-fuzz into $tools"
    cargo install cargo-fuzz --locked --version 0.13.2 --root "$tools"
fi
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
corpus=target/fuzz-corpus/mrdn-decode
mkdir -p "$corpus"
# Seeds: the worked vector of interop-facts.md §2 and an empty-body frame.
python3 - "$corpus" <<'PY'
import sys, pathlib
d = pathlib.Path(sys.argv[1])
head = bytes.fromhex("4d52444e" "01000000" "12000000" "00000000" "b5991e5ca82b6864630d4c369fd90835")
(d / "worked").write_bytes(head + b"hello disagg world")
(d / "empty").write_bytes(bytes.fromhex("4d52444e" "01000000" "00000000" "00000000" "af1349b9f5f9a1a6a0404dea36dcc949"))
PY
corpus=$(realpath "$corpus")
cd host/mrdn/fuzz
# The instrumented build is cached outside the clone, beside cargo-fuzz.
CARGO_TARGET_DIR="$tools/target" PATH="$tools/bin:$PATH" \
    cargo +nightly fuzz run decode --release "$corpus" -- \
    -max_total_time="$seconds" -max_len=4096 -print_final_stats=1
