#!/usr/bin/env bash
# Builds Dynamo's standalone KV indexer (the `dynamo-kv-router` 1.6.1 crate,
# tests/oracle/dynamo-indexer) once per machine into the tool cache:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/kvwasm-tools/dynamo-kv-indexer-1.6.1/bin/dynamo-kv-indexer
# It is the oracle of tests/tests/indexer_parity.rs. A stamp file holding the
# hash of the oracle's Cargo.lock marks a finished build; while it matches,
# this script does nothing. Prints the binary's path on stdout (everything
# else goes to stderr). Installs libzmq (Debian's libzmq3-dev) if missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CRATE=tests/oracle/dynamo-indexer
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/kvwasm-tools/dynamo-kv-indexer-1.6.1"
BIN="$CACHE/bin/dynamo-kv-indexer"
STAMP="$CACHE/.built"
LOCK_HASH=$(sha256sum "$CRATE/Cargo.lock" | cut -d' ' -f1)

log() { printf '== %s\n' "$*" >&2; }
built() { [ -x "$BIN" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$LOCK_HASH" ]; }

if built; then
    echo "$BIN"
    exit 0
fi

mkdir -p "$CACHE"
# Clones share the cache: one builds while the others wait, then find it built.
(
    flock 9
    if built; then
        exit 0
    fi
    if ! pkg-config --exists libzmq 2>/dev/null; then
        log "apt-get install libzmq3-dev pkg-config (the zmq crate links libzmq)"
        SUDO=""
        [ "$(id -u)" -eq 0 ] || SUDO="sudo"
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libzmq3-dev pkg-config >&2
    fi
    log "cargo build the dynamo-kv-router 1.6.1 indexer into $CACHE (~15 min on 2 cores, once)"
    start=$(date +%s)
    # The target directory stays in the cache, so a new Cargo.lock rebuilds
    # only what changed.
    cargo build --release --locked --manifest-path "$CRATE/Cargo.toml" \
        --target-dir "$CACHE/target" >&2
    mkdir -p "$CACHE/bin"
    # Copied beside and moved into place: an interrupted copy never looks built.
    cp "$CACHE/target/release/dynamo-kv-indexer" "$BIN.partial"
    mv -f "$BIN.partial" "$BIN"
    echo "$LOCK_HASH" >"$STAMP"
    log "built in $(($(date +%s) - start))s: $BIN"
) 9>"$CACHE.lock"
echo "$BIN"
