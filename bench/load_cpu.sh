#!/usr/bin/env bash
# Benchmark: `wload load --device cpu --tp 8` of the 4-layer Llama-3-8B-shaped checkpoint from
# bench/shard.sh (about 3.6 GiB, warm page cache), against a plain single-pass copy of the same
# bytes into freshly allocated memory, measured in the same run.
# Target: wload's transfer rate (read + convert + copy + sync) at least 70% of the copy's.
#
# Usage: bench/load_cpu.sh [WORKDIR]   (reuses WORKDIR/src from bench/shard.sh if present)
# Environment: RUNS=3, WLOAD_BIN=PATH (skip the build)
set -euo pipefail
BENCH_DIR=${1:-} source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
RUNS=${RUNS:-3}
src=$work/src
ensure_llama8b_4layers "$src"
cat "$src"/*.safetensors >/dev/null

# The copy limit: every byte of the weight files read once into a new buffer (page faults
# included, as wload pays them too), one file at a time.
copy_gbps() {
    python3 - "$src" <<'PY'
import glob, os, sys, time
files = sorted(glob.glob(os.path.join(sys.argv[1], "*.safetensors")))
t = time.perf_counter(); total = 0
for p in files:
    n = os.path.getsize(p)
    buf = bytearray(n)
    with open(p, "rb", buffering=0) as f:
        view, got = memoryview(buf), 0
        while got < n:
            got += f.readinto(view[got:])
    total += n
    del view, buf
print(f"{total / (time.perf_counter() - t) / 1e9:.3f}")
PY
}
wload_gbps() {
    "$bin" load "$src" --tp 8 --device cpu --json | python3 -c '
import json, sys
d = json.load(sys.stdin); t = d["timings"]
print("%.3f %.3f" % (d["bytes"] / (t["transfer_s"] + t["sync_s"]) / 1e9, t["total_s"]))'
}
copy_gbps >/dev/null; wload_gbps >/dev/null # warm-up
cs=(); ws=(); wt=()
for _ in $(seq "$RUNS"); do
    cs+=("$(copy_gbps)")
    read -r g total <<<"$(wload_gbps)"
    ws+=("$g"); wt+=("$total")
done
med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
c=$(med "${cs[@]}"); w=$(med "${ws[@]}"); t=$(med "${wt[@]}")
awk -v c="$c" -v w="$w" -v t="$t" 'BEGIN {
    printf "plain copy into memory   %6.2f GB/s\n", c
    printf "wload load --device cpu  %6.2f GB/s (whole process %.2f s)  = %.0f%% of the copy (target >= 70%%)\n", w, t, 100 * w / c
    ok = w / c >= 0.7
    print (ok ? "PASS" : "FAIL"); exit (ok ? 0 : 1)
}'
