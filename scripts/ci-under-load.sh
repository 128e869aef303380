#!/usr/bin/env bash
# Run `.ci/run` on a fresh clone of this repository while a busy loop keeps
# every core occupied: CI must not depend on the machine being idle.
#
#   scripts/ci-under-load.sh [RUNS] [CLONE_DIR] [BUSY_LOOPS]
#
# RUNS (default 2) runs one after another, each on a new clone of HEAD in
# CLONE_DIR (default /tmp/kvwasm-ci-under-load); stops at the first failure.
# BUSY_LOOPS (default: one per core) loops spin meanwhile. Each run's log
# is CLONE_DIR.N.log. Exit status: that of the failing run,
# else 0.
set -uo pipefail
runs=${1:-2}
clone=${2:-/tmp/kvwasm-ci-under-load}
loops=${3:-$(nproc)}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

busy=()
stop_busy() {
    if [ ${#busy[@]} -gt 0 ]; then
        kill "${busy[@]}" 2>/dev/null
    fi
}
trap stop_busy EXIT
for _ in $(seq "$loops"); do
    (while :; do :; done) &
    busy+=($!)
done

for run in $(seq "$runs"); do
    log="$clone.$run.log"
    rm -rf "$clone"
    git clone -q "$repo" "$clone"
    started=$(date +%s)
    echo "== run $run of $runs: $(git -C "$clone" log --oneline -1), $loops busy loops; log: $log"
    (cd "$clone" && CI=true bash .ci/run) >"$log" 2>&1
    status=$?
    echo "== run $run: exit $status after $(($(date +%s) - started)) s (load: $(cut -d' ' -f1-3 /proc/loadavg))"
    if [ "$status" -ne 0 ]; then
        tail -40 "$log"
        exit "$status"
    fi
done
