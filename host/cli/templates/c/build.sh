#!/usr/bin/env bash
# Builds {{name}}.wasm from store.c, with tools from the package registries
# only, installed once into ${XDG_CACHE_HOME:-~/.cache}/kvwasm-tools:
#   wit-bindgen-cli (crates.io)   writes the C bindings of wit/ into gen/
#   clang, lld, wasi-libc (Debian) compile and link for wasm32-wasi
#   wasm-tools (crates.io)        makes the component, with the WASI
#   wasi-preview1-component-adapter-provider (crates.io) adapter
# Needs cargo (rustup) and, for the Debian packages, apt-get as root or
# through sudo.
set -euo pipefail
cd "$(dirname "$0")"

WIT_BINDGEN=0.63.0
WASM_TOOLS=1.262.0
ADAPTER=48.0.8
tools="${XDG_CACHE_HOME:-$HOME/.cache}/kvwasm-tools"
mkdir -p "$tools"
log() { printf '== %s\n' "$*" >&2; }

install_tools() {
    local missing=()
    command -v clang >/dev/null || missing+=(clang)
    command -v wasm-ld >/dev/null || missing+=(lld)
    [ -e /usr/lib/wasm32-wasi/libc.a ] || missing+=(wasi-libc)
    compgen -G '/usr/lib/llvm-*/lib/clang/*/lib/wasi/libclang_rt.builtins-wasm32.a' >/dev/null ||
        missing+=(libclang-rt-dev-wasm32)
    if [ ${#missing[@]} -gt 0 ]; then
        log "apt-get install ${missing[*]}"
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >&2
    fi
    if [ ! -x "$tools/wit-bindgen-$WIT_BINDGEN/bin/wit-bindgen" ]; then
        log "cargo install wit-bindgen-cli $WIT_BINDGEN (C only)"
        cargo install wit-bindgen-cli --version "$WIT_BINDGEN" --locked \
            --no-default-features --features c --root "$tools/wit-bindgen-$WIT_BINDGEN"
    fi
    if [ ! -x "$tools/wasm-tools-$WASM_TOOLS/bin/wasm-tools" ]; then
        log "cargo install wasm-tools $WASM_TOOLS (component tooling only)"
        cargo install wasm-tools --version "$WASM_TOOLS" --locked --no-default-features \
            --features component,validate,print,parse,wit-component \
            --root "$tools/wasm-tools-$WASM_TOOLS"
    fi
    local adapter="$tools/wasi-adapter-$ADAPTER/wasi_snapshot_preview1.reactor.wasm"
    if [ ! -e "$adapter" ]; then
        log "the WASI preview-1 adapter from wasi-preview1-component-adapter-provider $ADAPTER"
        local fetch="$tools/wasi-adapter-$ADAPTER/fetch"
        mkdir -p "$fetch/src"
        touch "$fetch/src/lib.rs"
        printf '[package]\nname = "adapter-fetch"\nversion = "0.0.0"\nedition = "2021"\n[workspace]\n[dependencies]\nwasi-preview1-component-adapter-provider = "=%s"\n' \
            "$ADAPTER" >"$fetch/Cargo.toml"
        cargo fetch --manifest-path "$fetch/Cargo.toml" >&2
        local manifest
        manifest=$(cargo metadata --format-version 1 --manifest-path "$fetch/Cargo.toml" |
            grep -o '"manifest_path":"[^"]*/wasi-preview1-component-adapter-provider-[^"]*"' |
            cut -d'"' -f4)
        cp "$(dirname "$manifest")/artefacts/wasi_snapshot_preview1.reactor.wasm" "$adapter"
    fi
}

(
    flock 9
    install_tools
) 9>"$tools/.c-toolchain.lock"

rm -rf gen
"$tools/wit-bindgen-$WIT_BINDGEN/bin/wit-bindgen" c wit --world {{world}} --out-dir gen >/dev/null
clang --target=wasm32-wasi -mexec-model=reactor -O2 -Wall -Wextra -Werror -Igen \
    -o gen/core.wasm store.c gen/{{world_c}}.c gen/{{world_c}}_component_type.o
"$tools/wasm-tools-$WASM_TOOLS/bin/wasm-tools" component new gen/core.wasm \
    --adapt "wasi_snapshot_preview1=$tools/wasi-adapter-$ADAPTER/wasi_snapshot_preview1.reactor.wasm" \
    -o {{name}}.wasm
echo "built {{name}}.wasm; test it with: kvwasm check --component {{name}}.wasm --config kvwasm.toml" >&2
