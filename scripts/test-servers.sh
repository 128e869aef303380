#!/usr/bin/env bash
# Installs the real servers the remote backends are tested against; the
# tests start and stop them themselves, on loopback ports:
#   - redis-server and redis-cli, from Debian's `redis-server` package;
#   - s3s-fs, an S3 server that checks SigV4 signatures: s3s-fs 0.14.1's
#     store (the last release for Rust 1.95) served with TCP_NODELAY by
#     tests/servers/s3, built once into ${XDG_CACHE_HOME:-~/.cache}/kvwasm-tools
#     and linked into target/tools/bin;
#   - stunnel4, from Debian, the TLS-terminating proxy in front of s3s-fs
#     (the S3-over-https tests; redis-server's own tls-port serves Redis);
#   - nats-server, from Debian's `nats-server` package (the NATS event
#     source's tests);
#   - a Python venv in target/tools/pyenv with pyzmq and msgpack from PyPI,
#     for tests/scripts/kv_publisher.py (a vLLM/SGLang-shaped KV event
#     publisher, the ZMQ event source's tests).
# Idempotent; called by scripts/test.sh and scripts/bench-remote.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n== %s\n' "$*"; }

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
APT_UPDATED=""
apt_install() {
    if [ -z "$APT_UPDATED" ]; then
        $SUDO apt-get update -qq
        APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@"
}

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    step "apt-get install redis-server (the Redis backend's tests run a real server)"
    apt_install redis-server
    # The package starts a system-wide server on :6379; the tests run their own.
    $SUDO systemctl disable --now redis-server >/dev/null 2>&1 || true
fi

# Built once per machine into a cache outside the clone (it takes ~4 min),
# then linked where the tests and scripts/bench-remote.sh look for it. The
# cache is keyed by the crate's manifest, lock file and source and by the
# compiler: a change builds it anew (the build kept is one binary, ~8 MB).
S3_SERVER=tests/servers/s3
S3_SERVER_KEY=$( (cat "$S3_SERVER"/Cargo.toml "$S3_SERVER"/Cargo.lock "$S3_SERVER"/src/main.rs; rustc -V) | sha256sum | cut -c1-16)
S3S_FS_CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/kvwasm-tools/s3-test-server-$S3_SERVER_KEY"
if [ ! -x "$S3S_FS_CACHE/bin/s3s-fs" ]; then
    mkdir -p "$(dirname "$S3S_FS_CACHE")"
    # Clones share the cache: one builds while the others wait, then find
    # it in place.
    (
        flock 9
        if [ ! -x "$S3S_FS_CACHE/bin/s3s-fs" ]; then
            step "cargo build $S3_SERVER (s3s-fs 0.14.1) into $S3S_FS_CACHE (the S3 backend's tests run a real S3 server; ~4 min, once)"
            # Built beside the cache and moved into place, so an
            # interrupted build never leaves a cache that looks complete.
            rm -rf "$S3S_FS_CACHE.partial"
            cargo build --quiet --release --locked --manifest-path "$S3_SERVER/Cargo.toml" \
                --target-dir "$S3S_FS_CACHE.target"
            mkdir -p "$S3S_FS_CACHE.partial/bin"
            cp "$S3S_FS_CACHE.target/release/s3s-fs" "$S3S_FS_CACHE.partial/bin/"
            rm -rf "$S3S_FS_CACHE" "$S3S_FS_CACHE.target"
            mv -T "$S3S_FS_CACHE.partial" "$S3S_FS_CACHE"
        fi
    ) 9>"$S3S_FS_CACHE.lock"
fi
mkdir -p target/tools/bin
ln -sfn "$S3S_FS_CACHE/bin/s3s-fs" target/tools/bin/s3s-fs

if ! command -v stunnel4 >/dev/null && ! command -v stunnel >/dev/null; then
    step "apt-get install stunnel4 (the S3-over-https tests put s3s-fs behind it)"
    apt_install stunnel4 || echo "stunnel4 could not be installed: the https tests will fail; install it by hand" >&2
    $SUDO systemctl disable --now stunnel4 >/dev/null 2>&1 || true
fi

if ! command -v nats-server >/dev/null; then
    step "apt-get install nats-server (the NATS event source's tests run a real server)"
    apt_install nats-server
    # Should the package start a system-wide server, the tests run their own.
    $SUDO systemctl disable --now nats-server >/dev/null 2>&1 || true
fi

# Pinned, so a cached venv is reused only while it holds exactly these.
PY_REQUIREMENTS="pyzmq==27.3.0 msgpack==1.2.4"
PYENV=target/tools/pyenv
if [ "$(cat "$PYENV/requirements" 2>/dev/null)" != "$PY_REQUIREMENTS" ]; then
    step "python venv $PYENV with $PY_REQUIREMENTS (the ZMQ event source's tests run a real publisher)"
    rm -rf "$PYENV"
    python3 -m venv "$PYENV"
    # shellcheck disable=SC2086 # one word per requirement
    "$PYENV/bin/pip" install --quiet --disable-pip-version-check $PY_REQUIREMENTS
    echo "$PY_REQUIREMENTS" >"$PYENV/requirements"
fi
