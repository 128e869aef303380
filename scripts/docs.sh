#!/usr/bin/env bash
# Builds the user guide (book.toml, sources in docs/) with mdbook into
# target/book, installing mdbook once per machine into the tool cache:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/kvwasm-tools/mdbook-$MDBOOK_VERSION/bin/mdbook
# Usage: bash scripts/docs.sh [OUT_DIR]     (default target/book)
# Links and anchors are checked by host/cli/tests/docs.rs (cargo test).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

MDBOOK_VERSION=0.5.4
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/kvwasm-tools/mdbook-$MDBOOK_VERSION"
MDBOOK="$CACHE/bin/mdbook"
OUT="${1:-target/book}"

if [ ! -x "$MDBOOK" ]; then
    mkdir -p "$(dirname "$CACHE")"
    # Clones share the cache: one installs while the others wait, then
    # find it in place.
    (
        flock 9
        if [ ! -x "$MDBOOK" ]; then
            printf '== cargo install mdbook %s into %s (~3 min, once)\n' "$MDBOOK_VERSION" "$CACHE" >&2
            # Installed beside the cache and moved into place, so an
            # interrupted build never leaves a cache that looks complete.
            # Only the renderer and its search index: no file watcher, no server.
            rm -rf "$CACHE.partial"
            cargo install --quiet --locked --root "$CACHE.partial" mdbook \
                --version "=$MDBOOK_VERSION" --no-default-features --features search
            rm -rf "$CACHE"
            mv -T "$CACHE.partial" "$CACHE"
        fi
    ) 9>"$CACHE.lock"
fi

"$MDBOOK" build --dest-dir "$(realpath -m "$OUT")" .
echo "the guide: $OUT/index.html" >&2
