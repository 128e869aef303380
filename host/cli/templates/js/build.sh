#!/usr/bin/env bash
# Builds {{name}}.wasm with @bytecodealliance/componentize-js (from npm),
# installed once into ${XDG_CACHE_HOME:-~/.cache}/kvwasm-tools. Needs Node.js
# 20 or later and npm.
set -euo pipefail
cd "$(dirname "$0")"
VERSION=0.23.0
tools="${XDG_CACHE_HOME:-$HOME/.cache}/kvwasm-tools"
prefix="$tools/componentize-js-$VERSION"
mkdir -p "$tools"
(
    flock 9
    if [ ! -e "$prefix/.installed" ]; then
        echo "== installing @bytecodealliance/componentize-js $VERSION into $prefix" >&2
        npm install --prefix "$prefix" --no-audit --no-fund --silent \
            "@bytecodealliance/componentize-js@$VERSION"
        touch "$prefix/.installed"
    fi
) 9>"$tools/.componentize-js-$VERSION.lock"
"$prefix/node_modules/.bin/componentize-js" --wit wit --world-name {{world}} \
    -o {{name}}.wasm store.js
echo "built {{name}}.wasm; test it with: kvwasm check --component {{name}}.wasm --config kvwasm.toml" >&2
