#!/usr/bin/env bash
# Benchmark: `wload shard --tp 8` in three variants:
#   bf16      a Llama-3-8B-shaped checkpoint with 4 layers, about 3.6 GiB of random bf16 data in
#             two files plus an index;
#   fp8       the same model with its linear weights in FP8 (E4M3) and F32 scales per 128 x 128
#             block, as DeepSeek-V3 / Qwen3-FP8 ship (about 2.8 GiB);
#   deepseek  a reduced DeepSeek-V3-shaped block-FP8 checkpoint (MLA, 3 layers, 8 routed experts
#             and a shared one, about 2.7 GB), with --enable-expert-parallel;
#   mxfp4     a reduced gpt-oss-120b-shaped MXFP4 checkpoint (bench/gen_gpt_oss.py: 2 layers of
#             128 experts in U8 blocks and E8M0 scales, vocab 32000, about 3.8 GB), unpadded, and
#   mxfp4-triton  the same padded as vLLM's TRITON backend pads it (--moe-backend triton);
#   int4      the Llama-3-8B-shaped model with 8 layers in compressed-tensors pack-quantized W4A16,
#             group 32 (I32 packed weights, BF16 group scales; about 3.1 GB);
# each against
#   - the copy limit: `cp -r` of the same folder, and
#   - the peer: bench/peer_reshard.py (safetensors + torch on the CPU, what users write today;
#     bf16 only, as it reshards unquantized checkpoints),
# all with a warm page cache, in one run, reported as ratios. Also wload's peak RSS, its own timing
# line (write, and what hashing for wload.json added after the last write), and the load average
# (the ratios mean little on a busy machine).
# Targets: wload ≤ 1.1 × cp for bf16 (issue 14: the manifest's hashes included), ≤ 1.25 × cp for
# the others; ≥ 5 × faster than the peer; peak RSS ≤ 512 MiB.
#
# Usage: bench/shard.sh [WORKDIR]     (default: a temp dir under /var/tmp, removed afterwards)
# Environment: RUNS=3, VARIANTS="bf16 fp8 deepseek mxfp4 mxfp4-triton int4" (any of them), PYTHON (with torch + safetensors;
#              default .venv-bench/bin/python if present), WLOAD_BIN=PATH (skip the build)
set -euo pipefail
BENCH_DIR=${1:-} source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
RUNS=${RUNS:-3}
VARIANTS=${VARIANTS:-bf16 fp8 deepseek mxfp4 mxfp4-triton int4}
for v in $VARIANTS; do
    [[ $v =~ ^(bf16|fp8|deepseek|mxfp4|mxfp4-triton|int4)$ ]] || { echo "bench/shard.sh: unknown variant '$v' in VARIANTS (bf16, fp8, deepseek, mxfp4, mxfp4-triton, int4)" >&2; exit 2; }
done
if [[ -z ${PYTHON:-} ]]; then
    if [[ -x .venv-bench/bin/python ]]; then PYTHON=.venv-bench/bin/python; else PYTHON=python3; fi
fi

warm() { cat "$src"/* >/dev/null; }
# Runs "$@" RUNS times after a warm-up, cleaning $work/dst before each; prints the median seconds.
# A failed run ends it with that run's status, its stderr left in $work/err.
median() {
    local times=() i s e rc
    for i in $(seq 0 "$RUNS"); do
        rm -rf "$work/dst"
        warm
        s=$(date +%s%N)
        "$@" 2>"$work/err" || { rc=$?; rm -rf "$work/dst"; return "$rc"; }
        e=$(date +%s%N)
        cat "$work/err" >&2
        [[ $i -gt 0 ]] && times+=("$(( (e - s) / 1000000 ))")
    done
    rm -rf "$work/dst"
    printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {printf "%.3f", a[int((NR+1)/2)]/1000}'
}

# The peer's time on $src, after checking that its output and wload's agree byte for byte (the
# peer writes one part per rank); NA when $PYTHON lacks torch or safetensors. Fails (after saying
# why on stderr) when the peer fails or the outputs differ.
peer_time() {
    if ! "$PYTHON" -c 'import torch, safetensors' 2>/dev/null; then
        echo "peer skipped: $PYTHON has no torch/safetensors (pip install torch safetensors)" >&2
        echo NA
        return
    fi
    local t
    t=$(RUNS=1 median "$PYTHON" "$here/peer_reshard.py" "$src" --tp 8 --out "$work/dst") ||
        { cat "$work/err" >&2; return 1; }
    "$PYTHON" "$here/peer_reshard.py" "$src" --tp 8 --out "$work/peer" >&2 || return 1
    "$bin" shard "$src" --tp 8 -o "$work/dst" -q --force >&2 || return 1
    if ! python3 "$root/tests/data/golden/tools/compare_shards.py" "$work/peer" "$work/dst" \
        --ignore-parts >"$work/cmp" 2>&1; then
        tail -5 "$work/cmp" >&2
        return 1
    fi
    tail -1 "$work/cmp" >&2
    rm -rf "$work/peer" "$work/dst"
    echo "$t"
}

bf16_ratio=NA
failed=0
# LABEL DIR ENSURE PEER(yes|no) [SHARD FLAGS...]: times one variant and prints its rows; sets
# failed=1 on a miss.
run_variant() {
    local label=$1 ensure=$3 with_peer=$4 cp_s wl_s rss_kb peer_s=NA rc=0 load0 target=1.25
    [[ $label == bf16 ]] && target=1.1
    src=$2
    shift 4
    local flags=("$@")
    "$ensure" "$src"
    echo "== $label: $(du -sh --apparent-size "$src" | cut -f1) in $src" >&2
    load0=$(cut -d' ' -f1 /proc/loadavg)
    cp_s=$(median cp -r "$src" "$work/dst")
    wl_s=$(median "$bin" shard "$src" --tp 8 "${flags[@]}" -o "$work/dst" -q) || rc=$?
    echo "$label ($(du -sh --apparent-size "$src" | cut -f1))"
    printf 'cp -r            %7.3f s\n' "$cp_s"
    if [[ $rc -ne 0 ]]; then
        echo "wload shard tp8  FAILED (exit $rc):"
        sed -n '1,6s/^/    /p' "$work/err"
        echo "FAIL"
        failed=1
        return
    fi
    rm -rf "$work/dst"; warm
    rss_kb=$( { /usr/bin/time -f '%M' "$bin" shard "$src" --tp 8 "${flags[@]}" -o "$work/dst" \
        >"$work/summary"; } 2>&1 | tail -1)
    rm -rf "$work/dst"
    if [[ $with_peer == yes ]] && ! peer_s=$(peer_time); then
        peer_s=FAILED
        rm -rf "$work/peer" "$work/dst"
    fi
    sed -n 's/^time: /wload own timing: /p' "$work/summary"
    echo "load average     $load0 before, $(cut -d' ' -f1 /proc/loadavg) after (this benchmark adds up to 2 on its own)"
    awk -v cp="$cp_s" -v wl="$wl_s" -v peer="$peer_s" -v rss="$rss_kb" -v bf16="$bf16_ratio" \
        -v label="$label" -v with_peer="$with_peer" -v target="$target" 'BEGIN {
        printf "wload shard tp8  %7.3f s   = %.2f x cp   (target <= %s", wl, wl / cp, target
        if (label != "bf16" && bf16 != "NA") printf "; bf16: %.2f x", bf16
        print ")"
        if (peer == "FAILED") print "python peer      FAILED, or its output differs from wload output (details on stderr)"
        else if (peer != "NA") printf "python peer      %7.3f s   wload is %.1f x faster (target >= 5)\n", peer, peer / wl
        else if (with_peer == "no") print "python peer      skipped (it reshards unquantized checkpoints only)"
        printf "wload peak RSS   %7.1f MiB (target <= 512)\n", rss / 1024
        ok = (wl / cp <= target) && (rss / 1024 <= 512) && (peer == "NA" || (peer != "FAILED" && peer / wl >= 5))
        print (ok ? "PASS" : "FAIL")
        exit (ok ? 0 : 1)
    }' || failed=1
    [[ $label == bf16 ]] && bf16_ratio=$(awk -v a="$wl_s" -v b="$cp_s" 'BEGIN {print a / b}')
    return 0
}

for v in $VARIANTS; do
    case $v in
        bf16) run_variant bf16 "$work/src" ensure_llama8b_4layers yes ;;
        fp8) run_variant "fp8 block 128" "$work/src-fp8" ensure_llama8b_4layers_fp8 no ;;
        deepseek) run_variant "DeepSeek-V3-shaped fp8, EP" "$work/src-deepseek" ensure_deepseek_small no \
            --enable-expert-parallel ;;
        mxfp4) run_variant "gpt-oss-shaped mxfp4" "$work/src-mxfp4" ensure_gpt_oss_small no ;;
        mxfp4-triton) run_variant "gpt-oss-shaped mxfp4, padded (triton)" "$work/src-mxfp4" \
            ensure_gpt_oss_small no --moe-backend triton ;;
        int4) run_variant "int4 W4A16 group 32" "$work/src-int4" ensure_llama8b_8layers_int4 no ;;
    esac
done
exit "$failed"
