#!/usr/bin/env bash
# Builds {{name}}.wasm with componentize-py (from PyPI), installed once into
# ${XDG_CACHE_HOME:-~/.cache}/kvwasm-tools. Needs python3 (3.10 or later)
# with venv.
set -euo pipefail
cd "$(dirname "$0")"
VERSION=0.25.1
tools="${XDG_CACHE_HOME:-$HOME/.cache}/kvwasm-tools"
venv="$tools/componentize-py-$VERSION"
mkdir -p "$tools"
(
    flock 9
    if [ ! -e "$venv/.installed" ]; then
        echo "== installing componentize-py $VERSION into $venv" >&2
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet "componentize-py==$VERSION"
        touch "$venv/.installed"
    fi
) 9>"$tools/.componentize-py-$VERSION.lock"
"$venv/bin/componentize-py" -d wit -w kvwasm:kv-store/{{world}} componentize app -o {{name}}.wasm
echo "built {{name}}.wasm; test it with: kvwasm check --component {{name}}.wasm --config kvwasm.toml" >&2
