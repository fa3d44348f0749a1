#!/usr/bin/env bash
# Benchmark: `wload shard --tp 8` on a Llama-3-8B-shaped checkpoint with 4 layers (about 3.6 GiB of
# random bf16 data in two files plus an index), against
#   - the copy limit: `cp -r` of the same folder, and
#   - the peer: bench/peer_reshard.py (safetensors + torch on the CPU, what users write today),
# all with a warm page cache, in one run, reported as ratios. Also wload's peak RSS.
# Targets: wload ≤ 1.25 × cp, ≥ 5 × faster than the peer, peak RSS ≤ 512 MiB.
#
# Usage: bench/shard.sh [WORKDIR]     (default: a temp dir under /var/tmp, removed afterwards)
# Environment: RUNS=3, PYTHON (with torch + safetensors; default .venv-bench/bin/python if present),
#              WLOAD_BIN=PATH (skip the build)
set -euo pipefail
BENCH_DIR=${1:-} source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
RUNS=${RUNS:-3}
if [[ -z ${PYTHON:-} ]]; then
    if [[ -x .venv-bench/bin/python ]]; then PYTHON=.venv-bench/bin/python; else PYTHON=python3; fi
fi
src=$work/src
ensure_llama8b_4layers "$src"
du -sh --apparent-size "$src" >&2

warm() { cat "$src"/* >/dev/null; }
# Runs "$@" RUNS times after a warm-up, cleaning $work/dst before each; prints the median seconds.
median() {
    local times=()
    for i in $(seq 0 "$RUNS"); do
        rm -rf "$work/dst"
        warm
        local s e
        s=$(date +%s%N)
        "$@"
        e=$(date +%s%N)
        [[ $i -gt 0 ]] && times+=("$(( (e - s) / 1000000 ))")
    done
    rm -rf "$work/dst"
    printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {printf "%.3f", a[int((NR+1)/2)]/1000}'
}

cp_s=$(median cp -r "$src" "$work/dst")
wl_s=$(median "$bin" shard "$src" --tp 8 -o "$work/dst" -q)
rm -rf "$work/dst"; warm
rss_kb=$( { /usr/bin/time -f '%M' "$bin" shard "$src" --tp 8 -o "$work/dst" -q; } 2>&1 | tail -1)
# Cross-check: the peer and wload agree byte for byte (the peer writes one part per rank).
peer_s=NA
if "$PYTHON" -c 'import torch, safetensors' 2>/dev/null; then
    peer_s=$(RUNS=1 median "$PYTHON" "$here/peer_reshard.py" "$src" --tp 8 --out "$work/dst")
    "$PYTHON" "$here/peer_reshard.py" "$src" --tp 8 --out "$work/peer"
    "$bin" shard "$src" --tp 8 -o "$work/dst" -q --force
    python3 "$root/tests/data/golden/tools/compare_shards.py" "$work/peer" "$work/dst" --ignore-parts | tail -1
    rm -rf "$work/peer" "$work/dst"
else
    echo "peer skipped: $PYTHON has no torch/safetensors (pip install torch safetensors)" >&2
fi

awk -v cp="$cp_s" -v wl="$wl_s" -v peer="$peer_s" -v rss="$rss_kb" 'BEGIN {
    printf "cp -r            %7.3f s\n", cp
    printf "wload shard tp8  %7.3f s   = %.2f x cp   (target <= 1.25)\n", wl, wl / cp
    if (peer != "NA") printf "python peer      %7.3f s   wload is %.1f x faster (target >= 5)\n", peer, peer / wl
    printf "wload peak RSS   %7.1f MiB (target <= 512)\n", rss / 1024
    ok = (wl / cp <= 1.25) && (rss / 1024 <= 512) && (peer == "NA" || peer / wl >= 5)
    print (ok ? "PASS" : "FAIL")
    exit (ok ? 0 : 1)
}'
