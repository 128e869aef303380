#!/usr/bin/env bash
# Every test: formatting, lints (host and guests), unit and end-to-end tests,
# the C consumer, the Redis and S3 backends against real servers, the user
# guide's build, and a smoke run of the demo. Installs what it needs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
bash scripts/test-servers.sh
# llama.cpp for tests/tests/llama_e2e.rs, built once into the tool cache
# (~12 min on an empty cache, 2 cores; a no-op afterwards).
bash scripts/llama-build.sh >/dev/null
bash scripts/llama-build.sh --server >/dev/null # tests/tests/llama_server.rs (examples/llama-server)
# Dynamo's standalone indexer (dynamo-kv-router 1.6.1), the oracle of
# host/cli/tests/indexer_parity.rs, built once into the tool cache
# (~15 min on an empty cache, 2 cores; a no-op afterwards).
KVWASM_DYNAMO_ORACLE=$(bash scripts/dynamo-oracle.sh)
export KVWASM_DYNAMO_ORACLE

step() { printf '\n== %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check
(cd guest-backends && cargo fmt --all -- --check)

step "cargo clippy (host workspace, then guests for wasm32-wasip2)"
cargo clippy --release --workspace --all-targets --locked -- -D warnings
(cd guest-backends && cargo clippy --release --target wasm32-wasip2 --workspace --locked -- -D warnings)

step "guest unit and property tests (native): guest-support, fs chunk paths, Redis replies, S3 errors, fabrics, KV indexer"
(cd guest-backends && cargo test --release --locked -p kvwasm-guest-support)
(cd guest-backends && cargo test --release --locked -p kvwasm-kv-indexer-core)
(cd guest-backends && cargo test --release --locked -p kvwasm-advisor-core)
# --lib: the guests' cdylib targets do not link natively (export names).
(cd guest-backends && cargo test --release --locked -p kvwasm-guest-fs -p kvwasm-guest-redis -p kvwasm-guest-s3 -p kvwasm-fabric-synthetic -p kvwasm-fabric-tcp -p kvwasm-fabric-hostile --lib)

step "libFuzzer on the MRDN decoders (60 s)"
bash scripts/fuzz-mrdn.sh 60

step "cargo test --release --workspace"
cargo test --release --workspace --locked

step "the user guide: mdbook build (links and the config reference are checked by host/cli/tests/docs.rs above)"
bash scripts/docs.sh target/book

step "scripts/install.sh into a temporary prefix: the installed kvwasm, shim and headers work alone"
bash scripts/test-install.sh

step "kvwasm check --quick: the fs guest behind the shim, and the native C backend"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
make -s -C examples/native-backend OUT="$scratch"
target/release/kvwasm check --quick --component builtin:fs
target/release/kvwasm check --quick --lib "$scratch/libkv_store_cfs.so" --uri "cfs://$scratch/data"

step "kvwasm bench --quick (smoke: seconds, no timing assertions)"
mkdir -p "$scratch/bench"
target/release/kvwasm bench --quick --no-progress --native "$scratch/libkv_store_cfs.so" \
    --dir "scratch=$scratch/bench" --plot "$scratch/bench.svg" >/dev/null
target/release/kvwasm bench --events --quick >/dev/null
target/release/kvwasm bench --fabric --quick >/dev/null
target/release/kvwasm bench --component builtin:memory --quick >/dev/null
target/release/kvwasm bench --scale --quick --native "$scratch/libkv_store_cfs.so" \
    --dir "scratch=$scratch/bench" --plot "$scratch/scale.svg" >/dev/null

step "kvwasm demo (smoke)"
target/release/kvwasm compile
target/release/kvwasm demo --sessions 2
