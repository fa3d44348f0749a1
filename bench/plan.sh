#!/usr/bin/env bash
# Benchmark: planning at TP 8, on synthetic sparse (header-only) checkpoints:
#   - Llama-3-405B-shaped: 126 layers, 191 files, hidden 16384, 128 heads / 8 kv heads,
#     intermediate 53248, vocab 128256;
#   - DeepSeek-V3-shaped (bench/gen_deepseek.py): 61 layers, 256 routed experts, block FP8 128×128,
#     62 files, 90,427 tensors;
#   - Qwen3.5-397B-A17B-shaped (bench/gen_family.py qwen3_5): 60 layers, 45 Gated-DeltaNet and 15
#     gated-attention, 512 routed experts + a shared one, the 27-block vision tower TP-split;
#   - MiniMax-M2-shaped (bench/gen_family.py minimax_m2): 62 layers, 256 experts, block FP8 128×128.
# Target: the planning stage (mapping + validation + every rank's pieces) under 50 ms after the
# headers are read. wload reports its stage timings in `plan --json` ("timings"); this script takes
# the median over RUNS runs and also times the whole process.
#
# Usage: bench/plan.sh [DIR]      (DIR: where to generate; default a temp dir, removed afterwards)
# Environment: RUNS=10, TARGET_MS=50, WLOAD_BIN=PATH (skip the build)
set -euo pipefail
BENCH_DIR=${1:-} source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
RUNS=${RUNS:-10}
TARGET_MS=${TARGET_MS:-50}
# Plans the checkpoint in "$dir" RUNS times; prints the medians and PASS/FAIL for label "$1".
measure() {
"$bin" plan "$dir" --tp 8 --json >/dev/null # warm-up
for _ in $(seq "$RUNS"); do
    start=$(date +%s%N)
    "$bin" plan "$dir" --tp 8 --json >"$dir/.plan.json"
    end=$(date +%s%N)
    python3 - "$dir/.plan.json" "$start" "$end" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
t = d["timings"]
tensors = sum(len(r["tensors"]) for r in d["ranks"])
wall = (int(sys.argv[3]) - int(sys.argv[2])) / 1e9
print(f'{t["headers_s"]*1e3:.2f} {t["plan_s"]*1e3:.2f} {wall*1e3:.1f} {tensors}')
PY
done | sort -k2 -n | awk -v target="$TARGET_MS" -v runs="$RUNS" -v label="$1" '
    { h[NR]=$1; p[NR]=$2; w[NR]=$3; n=$4 }
    END {
        m = int((runs + 1) / 2)
        printf "%s, tp 8: %d output tensors over 8 ranks\n", label, n
        printf "  headers read   median %.2f ms\n", h[m]
        printf "  plan           median %.2f ms (min %.2f, max %.2f)\n", p[m], p[1], p[runs]
        printf "  whole process  %.1f ms (run with the median plan time)\n", w[m]
        if (p[m] < target) { printf "PASS: plan under %d ms\n", target; exit 0 }
        printf "FAIL: plan %.2f ms is not under %d ms\n", p[m], target; exit 1
    }'
}

dir=$work/llama405b
python3 "$here/gen_checkpoint.py" --files 191 --layers 126 --real-shapes --hidden-size 16384 \
    --num-attention-heads 128 --num-key-value-heads 8 --intermediate-size 53248 \
    --vocab-size 128256 --out "$dir" --quiet

status=0
measure "Llama-3-405B-shaped" || status=1
dir=$work/deepseek_v3
python3 "$here/gen_deepseek.py" --out "$dir" --fp8-block 128 2>/dev/null
measure "DeepSeek-V3-shaped (FP8)" || status=1
dir=$work/qwen3_5
python3 "$here/gen_family.py" qwen3_5 --out "$dir" 2>/dev/null
measure "Qwen3.5-397B-A17B-shaped" || status=1
dir=$work/minimax_m2
python3 "$here/gen_family.py" minimax_m2 --out "$dir" 2>/dev/null
measure "MiniMax-M2-shaped (FP8)" || status=1
exit $status
