#!/usr/bin/env bash
# Every test: formatting, lints (host and guests), unit and end-to-end tests,
# the C consumer, the Redis and S3 backends against real servers, the user
# guide's build, and a smoke run of the demo. Installs what it needs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Each step's wall time, printed as it ends and again as a table at the end
# (also when a step fails): where a CI run's time went (docs/testing.md).
timings=()
step_name=""
step_start=$SECONDS
end_step() {
    if [ -n "$step_name" ]; then
        local took=$((SECONDS - step_start))
        timings+=("$(printf '%4d:%02d  %s' $((took / 60)) $((took % 60)) "$step_name")")
        printf '== %s: %d s\n' "$step_name" "$took"
    fi
    step_name=""
}
step() {
    end_step
    step_name=$1
    step_start=$SECONDS
    printf '\n== %s\n' "$*"
}
# A full disk fails a test far from its cause (ENOSPC in whichever test
# writes next): say up front how much room there is, and again on failure.
# A run needs about 12 GiB: the build (~4 GiB here and under guest-backends/),
# the tool cache on a fresh machine, and tests that write up to 2 GiB at once.
disk_room() {
    df -h --output=avail,target . "${TMPDIR:-/tmp}" "${XDG_CACHE_HOME:-$HOME/.cache}" 2>/dev/null |
        sed 's/^/   /' || true
}
scratch=$(mktemp -d)
on_exit() {
    local status=$?
    # Nothing here may replace the run's own status.
    set +e
    end_step
    printf '\n== time per step (min:s)%s\n' "$([ "$status" -eq 0 ] || echo ", until the failure")"
    printf '%s\n' "${timings[@]}"
    printf '%4d:%02d  total\n' $((SECONDS / 60)) $((SECONDS % 60))
    if [ "$status" -ne 0 ]; then
        printf '\n== free disk space at the failure\n'
        disk_room
    fi
    rm -rf "$scratch"
    exit "$status"
}
trap on_exit EXIT
# Interrupted or stopped: the table says so, and the status says which.
trap 'exit 130' INT
trap 'exit 143' TERM

printf '== free disk space (a run needs about 12 GiB)\n'
disk_room
if [ "$(df -Pk . | awk 'NR == 2 { print $4 }')" -lt $((12 * 1024 * 1024)) ] 2>/dev/null; then
    echo "warning: less than 12 GiB free on the clone's filesystem: tests may fail with ENOSPC" >&2
fi

# Clippy lints the workspace's crates as they build: clippy-driver, the
# compiler `cargo clippy` itself runs, compiles them (dependencies stay with
# rustc), and CLIPPY_ARGS, how `cargo clippy` hands `-- -D warnings` on,
# makes any warning fail the build. A separate `cargo clippy` would
# type-check every dependency a second time (~6 min of a busy 2-core run).
# So this run's binaries are clippy-driver builds: no MIR optimisations
# (LLVM still optimises at opt-level 3) and other symbol hashes. They are
# tested, not shipped or benchmarked. Every cargo command on this workspace
# below runs with the same settings (any other rebuilds the workspace's
# crates); locally, `cargo clippy --release --workspace --all-targets
# --locked -- -D warnings` lints the same targets.
sysroot=$("${RUSTC:-rustc}" --print sysroot)
clippy_driver=$sysroot/bin/clippy-driver
if [ ! -x "$clippy_driver" ]; then
    rustup component add clippy
fi
linted=(env "RUSTC_WORKSPACE_WRAPPER=$clippy_driver" "CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__")
# Should cargo or clippy-driver ever stop honouring these, lints would pass
# unnoticed: a one-file package must build as written and fail, with a
# clippy::len_zero error, with one line changed.
lint_probe() {
    mkdir -p "$scratch/lint-probe/src"
    printf '[package]\nname = "lint-probe"\nversion = "0.0.0"\nedition = "2024"\n[workspace]\n' \
        >"$scratch/lint-probe/Cargo.toml"
    printf 'fn main() {\n    let v: &[u8] = &[1];\n    assert!(%s);\n}\n' "$1" >"$scratch/lint-probe/src/main.rs"
    "${linted[@]}" cargo build --quiet --offline --manifest-path "$scratch/lint-probe/Cargo.toml" \
        --target-dir "$scratch/lint-probe/target" >"$scratch/lint-probe.log" 2>&1
}
if ! lint_probe 'v.is_empty()'; then
    cat "$scratch/lint-probe.log" >&2
    echo "error: a clean one-file package does not build with $clippy_driver as the workspace compiler" >&2
    exit 1
fi
if lint_probe 'v.len() == 0' || ! grep -q 'clippy::len.zero' "$scratch/lint-probe.log"; then
    cat "$scratch/lint-probe.log" >&2
    echo "error: with RUSTC_WORKSPACE_WRAPPER=$clippy_driver and CLIPPY_ARGS=-D warnings, a clippy warning does not fail a build: lints would not be checked" >&2
    exit 1
fi

step "setup: toolchain target, packages, cargo build --release --workspace (linted)"
"${linted[@]}" bash scripts/setup.sh
step "test servers: redis-server, s3s-fs, stunnel, nats-server, pyzmq"
bash scripts/test-servers.sh
step "llama.cpp and Dynamo's indexer, built once into the tool cache"
# llama.cpp for tests/tests/llama_e2e.rs, built once into the tool cache
# (~12 min on an empty cache, 2 cores; a no-op afterwards).
bash scripts/llama-build.sh >/dev/null
bash scripts/llama-build.sh --server >/dev/null # tests/tests/llama_server.rs (examples/llama-server)
# Dynamo's standalone indexer (dynamo-kv-router 1.6.1), the oracle of
# host/cli/tests/indexer_parity.rs, built once into the tool cache
# (~15 min on an empty cache, 2 cores; a no-op afterwards).
KVWASM_DYNAMO_ORACLE=$(bash scripts/dynamo-oracle.sh)
export KVWASM_DYNAMO_ORACLE

step "cargo fmt --check"
cargo fmt --all -- --check
(cd guest-backends && cargo fmt --all -- --check)

step "clippy: every host target built linted (the test binaries too), then cargo clippy on the guests for wasm32-wasip2"
"${linted[@]}" cargo build --release --workspace --all-targets --locked
(cd guest-backends && cargo clippy --release --target wasm32-wasip2 --workspace --locked -- -D warnings)

step "guest unit and property tests (native): guest-support, fs chunk paths, Redis replies, S3 errors, fabrics, KV indexer"
# One invocation: the three crates' dependencies resolve and build once.
(cd guest-backends && cargo test --release --locked -p kvwasm-guest-support -p kvwasm-fs-layout -p kvwasm-kv-indexer-core -p kvwasm-advisor-core)
# --lib: the guests' cdylib targets do not link natively (export names).
(cd guest-backends && cargo test --release --locked -p kvwasm-guest-fs -p kvwasm-guest-redis -p kvwasm-guest-s3 -p kvwasm-fabric-synthetic -p kvwasm-fabric-tcp -p kvwasm-fabric-hostile --lib)

step "libFuzzer on the MRDN decoders (60 s)"
bash scripts/fuzz-mrdn.sh 60

step "cargo test --release --workspace"
"${linted[@]}" cargo test --release --workspace --locked

step "the user guide: mdbook build (links and the config reference are checked by host/cli/tests/docs.rs above)"
bash scripts/docs.sh target/book

step "scripts/install.sh into a temporary prefix: the installed kvwasm, shim and headers work alone"
"${linted[@]}" bash scripts/test-install.sh

step "kvwasm check --quick: the fs guest behind the shim, and the native C backend"
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
