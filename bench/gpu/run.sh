#!/usr/bin/env bash
# GPU benchmark, for a machine with an NVIDIA GPU, PyTorch and safetensors (nothing is downloaded).
# 1. measures pinned host-to-device bandwidth with torch (the ceiling for any loader);
# 2. times `wload load --device cuda --tp 1` on the 4-layer Llama-3-8B-shaped checkpoint (3.6 GiB,
#    warm page cache), with --check on a separate run to prove the bytes on the device are right;
# 3. times `safetensors.torch.load_file(..., device="cuda")` on the same files (the peer);
# and reports the three as GB/s and ratios. Target: wload at least 80% of the pinned bandwidth.
#
# Usage: bench/gpu/run.sh [WORKDIR]
# Environment: WLOAD_BIN (default target/release/wload, built if cargo is there), PYTHON, RUNS=3
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
RUNS=${RUNS:-3}
PY=${PYTHON:-python3}
cd "$root"
bin=${WLOAD_BIN:-$root/target/release/wload}
if [[ ! -x $bin ]]; then
    cargo build --release --locked --quiet
fi
work=${1:-/tmp/wload-gpu-bench}
src=$work/src
mkdir -p "$work"
if [[ ! -f $src/config.json ]]; then
    python3 "$root/bench/gen_checkpoint.py" --files 2 --layers 4 --real-shapes --random --quiet --out "$src"
fi
cat "$src"/*.safetensors >/dev/null
nvidia-smi --query-gpu=name,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader || true

pinned=$("$PY" - <<'PY'
import torch, time
n = 1 << 30
h = torch.empty(n, dtype=torch.uint8).pin_memory()
d = torch.empty(n, dtype=torch.uint8, device="cuda")
d.copy_(h, non_blocking=True); torch.cuda.synchronize()
best = 0.0
for _ in range(5):
    t = time.perf_counter(); d.copy_(h, non_blocking=True); torch.cuda.synchronize()
    best = max(best, n / (time.perf_counter() - t) / 1e9)
print(f"{best:.2f}")
PY
)

wl=()
for _ in $(seq "$RUNS"); do
    wl+=("$("$bin" load "$src" --tp 1 --device cuda --json | "$PY" -c '
import json, sys
d = json.load(sys.stdin); t = d["timings"]
print("%.2f" % (d["bytes"] / (t["transfer_s"] + t["sync_s"]) / 1e9))')")
done
"$bin" load "$src" --tp 1 --device cuda --check -q >/dev/null && check=ok || check=FAILED

peer=$("$PY" - "$src" "$RUNS" <<'PY'
import glob, os, sys, time, torch
from safetensors.torch import load_file
files = sorted(glob.glob(os.path.join(sys.argv[1], "*.safetensors")))
best = 0.0
for _ in range(int(sys.argv[2])):
    torch.cuda.synchronize(); t = time.perf_counter(); total = 0; keep = []
    for f in files:
        sd = load_file(f, device="cuda")
        total += sum(v.numel() * v.element_size() for v in sd.values()); keep.append(sd)
    torch.cuda.synchronize()
    best = max(best, total / (time.perf_counter() - t) / 1e9)
    del keep; torch.cuda.empty_cache()
print(f"{best:.2f}")
PY
)
w=$(printf '%s\n' "${wl[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
awk -v p="$pinned" -v w="$w" -v s="$peer" -v c="$check" 'BEGIN {
    printf "pinned H2D (torch)                 %6.2f GB/s\n", p
    printf "wload load --device cuda --tp 1    %6.2f GB/s = %.0f%% of pinned (target >= 80%%), --check %s\n", w, 100 * w / p, c
    printf "safetensors load_file(cuda)        %6.2f GB/s = %.0f%% of pinned; wload is %.2fx it\n", s, 100 * s / p, w / s
    ok = (w / p >= 0.8) && c == "ok"
    print (ok ? "PASS" : "FAIL"); exit (ok ? 0 : 1)
}'
