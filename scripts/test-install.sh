#!/usr/bin/env bash
# scripts/install.sh into a temporary prefix, then what was installed, used
# from there alone: the installed kvwasm finds the installed shim (../lib)
# and passes `kvwasm check --quick`; examples/c-consumer compiles against
# the installed headers only and saves and restores through the installed
# shim. Called by scripts/test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
prefix="$scratch/prefix"

bash scripts/install.sh "$prefix" 2>/dev/null
for installed in bin/kvwasm lib/libkv_store_wasm.so include/kv_store_abi.h include/kv_store_loader.h; do
    [ -f "$prefix/$installed" ] || { echo "install.sh did not install $installed" >&2; exit 1; }
done

# Nothing from the build tree: no library path, run from elsewhere.
cd "$scratch"
env -u KV_STORE_LIBRARY_PATH -u KVWASM_CONFIG "$prefix/bin/kvwasm" check --quick --component builtin:memory
env -u KV_STORE_LIBRARY_PATH "$prefix/bin/kvwasm" new --lang c from-install >/dev/null 2>&1
[ -f from-install/wit/kv-store.wit ] || { echo "the installed kvwasm new wrote no WIT" >&2; exit 1; }

# A consumer built against the installed headers alone (main.c's directory
# has none), loading the installed shim as llama.cpp does.
cp "$repo/examples/c-consumer/main.c" consumer.c
${CC:-cc} -O2 -Wall -Wextra -Werror -I"$prefix/include" -o consumer consumer.c -ldl
out=$(KV_STORE_LIBRARY_PATH="$prefix/lib" ./consumer "wasm://$scratch/store")
grep -q "every byte verified" <<<"$out" || { echo "consumer: $out" >&2; exit 1; }
echo "scripts/install.sh: the installed kvwasm, shim and headers work from $prefix"
