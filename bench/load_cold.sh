#!/usr/bin/env bash
# Benchmark: `wload load --device cpu --tp 1 --cold` of the 4-layer Llama-3-8B-shaped checkpoint
# (about 3.6 GiB, see bench/common.sh) against, in the same run and after the same eviction from
# the page cache (posix_fadvise DONTNEED on every file):
#   - the storage's sequential read limit: `dd iflag=direct bs=16M` of the same files;
#   - Python's `safetensors.torch.load_file` of the same files (PYTHON picks the interpreter);
#     where torch is not installed, `safetensors.numpy.load_file` (the same Rust reader, into
#     numpy arrays; ml_dtypes supplies bfloat16), and the report says which.
# Targets: wload >= 90% of dd, and faster than Python. Each figure is the median of RUNS.
#
# Usage: bench/load_cold.sh [WORKDIR]   (reuses WORKDIR/src if present)
# Environment: RUNS=3, WLOAD_BIN=PATH (skip the build), PYTHON=python3, IO=auto (wload's --io)
set -euo pipefail
BENCH_DIR=${1:-} source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
RUNS=${RUNS:-3}
PY=${PYTHON:-python3}
IO=${IO:-auto}
src=$work/src
ensure_llama8b_4layers "$src"
files=("$src"/*.safetensors)
bytes=$(stat -c %s "${files[@]}" | awk '{s += $1} END {print s}')

evict() {
    python3 - "${files[@]}" <<'PY'
import os, sys
for f in sys.argv[1:]:
    fd = os.open(f, os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
PY
}
now() { date +%s.%N; }
dd_gbps() {
    evict
    local t0 t1
    t0=$(now)
    for f in "${files[@]}"; do
        dd if="$f" of=/dev/null iflag=direct bs=16M status=none
    done
    t1=$(now)
    awk -v b="$bytes" -v a="$t0" -v z="$t1" 'BEGIN {printf "%.3f", b / (z - a) / 1e9}'
}
wload_gbps() { # GB/s of the transfer, the resident share it saw, the mode auto chose
    "$bin" load "$src" --tp 1 --device cpu --cold --io "$IO" --json | python3 -c '
import json, sys
d = json.load(sys.stdin); t = d["timings"]
print("%.3f %.3f %s %.2f" % (d["bytes"] / (t["transfer_s"] + t["sync_s"]) / 1e9,
    d["cache"]["resident_share"], d["io"]["used"], t["total_s"]))'
}
have_peer=0
peer=none
if "$PY" -c 'import torch, safetensors.torch' 2>/dev/null; then
    have_peer=1
    peer=torch
elif "$PY" -c 'import ml_dtypes, numpy, safetensors.numpy' 2>/dev/null; then
    have_peer=1
    peer=numpy
fi
peer_gbps() {
    evict
    "$PY" - "$peer" "${files[@]}" <<'PY'
import sys, time
if sys.argv[1] == "torch":
    from safetensors.torch import load_file
    size = lambda v: v.numel() * v.element_size()
else:
    import ml_dtypes  # registers bfloat16 with numpy
    from safetensors.numpy import load_file
    size = lambda v: v.nbytes
t = time.perf_counter(); total = 0; keep = []
for f in sys.argv[2:]:
    sd = load_file(f)
    total += sum(size(v) for v in sd.values()); keep.append(sd)
print(f"{total / (time.perf_counter() - t) / 1e9:.3f}")
PY
}

ds=(); ws=(); ps=(); res=(); mode=""; tot=()
for _ in $(seq "$RUNS"); do
    ds+=("$(dd_gbps)")
    read -r g r m t <<<"$(wload_gbps)"
    ws+=("$g"); res+=("$r"); mode=$m; tot+=("$t")
    if [[ $have_peer == 1 ]]; then ps+=("$(peer_gbps)"); fi
done
med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
d=$(med "${ds[@]}"); w=$(med "${ws[@]}"); r=$(med "${res[@]}"); t=$(med "${tot[@]}")
p=none
if [[ $have_peer == 1 ]]; then p=$(med "${ps[@]}"); fi
awk -v d="$d" -v w="$w" -v p="$p" -v peer="$peer" -v r="$r" -v m="$mode" -v t="$t" -v b="$bytes" -v n="$RUNS" 'BEGIN {
    printf "source %.2f GiB, cold (evicted before every run; wload saw %.1f%% cached), median of %d\n", b / 2^30, 100 * r, n
    printf "dd iflag=direct bs=16M           %6.2f GB/s  (the storage limit)\n", d
    printf "wload load --device cpu --cold   %6.2f GB/s  = %.0f%% of dd (target >= 90%%); io %s, whole process %.2f s\n", w, 100 * w / d, m, t
    ok = w / d >= 0.9
    if (p == "none") {
        print "safetensors load_file            not measured: safetensors with torch or numpy not importable (set PYTHON)"
    } else {
        printf "safetensors.%-5s load_file      %6.2f GB/s; wload is %.2fx it (target > 1)\n", peer, p, w / p
        ok = ok && w > p
    }
    print (ok ? "PASS" : "FAIL"); exit (ok ? 0 : 1)
}'
