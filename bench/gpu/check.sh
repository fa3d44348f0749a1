#!/usr/bin/env bash
# Correctness of the CUDA path on a real GPU (one is enough). For every golden fixture of the test
# suite, at TP 1 and 2 (plus EP for the MoE fixtures and PP 2 for Llama), each rank is loaded onto GPU 0 with
# --check (every tensor copied back and compared with the host's bytes) and --checksums, and the
# checksums are compared with the CPU path's, which the test suite proves byte-identical to vLLM.
# A pre-sharded folder written by `wload shard` is loaded the same way, and asking for more GPUs
# than there are must fail cleanly (exit 1, no crash).
#
# Usage: bench/gpu/check.sh [WORKDIR]      (run from anywhere; needs python3, no network)
# Environment: WLOAD_BIN (default target/release/wload); FIXTURES="a b ..." checks only those
# fixtures (default: all). Writes WORKDIR/check.json.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${WLOAD_BIN:-$root/target/release/wload}
work=${1:-/tmp/wload-gpu-check}
rm -rf "$work" && mkdir -p "$work"
fixtures=$root/tests/data/golden/fixtures
pass=0
fail=0
results=()

same_sums() { # cuda.json cpu.json -> 0 when every rank's tensors have equal names and checksums
    python3 - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ka = [(t["name"], t["dtype"], t["shape"], t["xxh3"]) for r in a["ranks"] for t in r["checksums"]]
kb = [(t["name"], t["dtype"], t["shape"], t["xxh3"]) for r in b["ranks"] for t in r["checksums"]]
sys.exit(0 if ka == kb and ka else 1)
PY
}

one() { # label, then wload load arguments (without --device)
    local label=$1
    shift
    local ok=ok
    if ! "$bin" load "$@" --device cuda --check --checksums --json >"$work/cuda.json" 2>"$work/cuda.err"; then
        ok="cuda load failed: $(tail -c 600 "$work/cuda.err")"
    elif ! "$bin" load "$@" --device cpu --checksums --json >"$work/cpu.json" 2>"$work/cpu.err"; then
        ok="cpu load failed: $(tail -c 600 "$work/cpu.err")"
    elif ! same_sums "$work/cuda.json" "$work/cpu.json"; then
        ok="checksums differ between cuda and cpu"
    fi
    if [[ $ok == ok ]]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
    printf '%-58s %s\n' "$label" "$ok"
    results+=("$(python3 -c 'import json,sys; print(json.dumps({"case": sys.argv[1], "result": sys.argv[2]}))' "$label" "$ok")")
}

# Flags a fixture needs to be accepted at all (Llama 4's tower is not mapped: text model only).
declare -A FLAGS=([llama4]="--language-model-only")
"$bin" --version
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
for fx in "$fixtures"/*/; do
    name=$(basename "$fx")
    [[ -z ${FIXTURES:-} || " $FIXTURES " == *" $name "* ]] || continue
    for tp in 1 2; do
        for ((r = 0; r < tp; r++)); do
            # shellcheck disable=SC2086
            one "$name tp$tp rank $r" "$fx" --tp "$tp" --ranks "$r" ${FLAGS[$name]:-}
        done
    done
done
for moe in mixtral qwen2_moe qwen3_moe_fp8_block deepseek_v3 gpt_oss minimax_m2 qwen3_5_moe \
    glm4_moe_lite deepseek_v32 mistral_large_3 llama4; do
    [[ -d $fixtures/$moe ]] || continue
    [[ -z ${FIXTURES:-} || " $FIXTURES " == *" $moe "* ]] || continue
    for r in 0 1; do
        # shellcheck disable=SC2086
        one "$moe tp2 ep rank $r" "$fixtures/$moe" --tp 2 --enable-expert-parallel --ranks "$r" ${FLAGS[$moe]:-}
    done
done
for r in 0 1 2 3; do
    one "llama_gqa tp2 pp2 rank $r" "$fixtures/llama_gqa" --tp 2 --pp 2 --ranks "$r"
done
if "$bin" shard "$fixtures/llama_gqa" --tp 2 --output "$work/sharded" -q; then
    for r in 0 1; do
        one "pre-sharded llama_gqa tp2 rank $r" "$work/sharded" --tp 2 --ranks "$r"
    done
else
    fail=$((fail + 1))
    echo "shard of llama_gqa failed"
fi
# More ranks than GPUs: a clean runtime error, never a crash.
count=$(nvidia-smi -L 2>/dev/null | wc -l)
"$bin" load "$fixtures/llama_gqa" --tp $((count + 1)) --device cuda >/dev/null 2>"$work/too_many.err"
rc=$?
if [[ $rc == 1 ]]; then
    pass=$((pass + 1))
    echo "too few GPUs: exit 1: $(head -c 300 "$work/too_many.err")"
else
    fail=$((fail + 1))
    echo "too few GPUs: exit $rc (expected 1): $(head -c 600 "$work/too_many.err")"
fi
printf '%s\n' "${results[@]}" | python3 -c '
import json, sys
cases = [json.loads(l) for l in sys.stdin if l.strip()]
json.dump({"pass": sys.argv[1], "fail": sys.argv[2], "cases": cases}, open(sys.argv[3], "w"), indent=1)
' "$pass" "$fail" "$work/check.json"
echo "passed $pass, failed $fail"
[[ $fail == 0 ]]
