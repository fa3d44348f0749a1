#!/usr/bin/env bash
# Benchmark: `wload inspect` on a synthetic checkpoint of 64 files x 2,000 tensors (128,000 tensors).
# Target: median wall time under 0.3 s for both the --json and the human output, warm page cache.
#
# Usage: bench/inspect.sh [DIR]
#   DIR   where to generate the checkpoint (default: a temp dir, removed afterwards). DIR is kept;
#         a DIR made by an earlier run is regenerated in place, any other non-empty DIR is refused.
# Environment:
#   FILES=64 TENSORS=2000   checkpoint size
#   TARGET=0.3              seconds; exit status 1 when a wload median is not below it
#   RUNS=10                 timed runs per command (after one warm-up run)
#   NO_HYPERFINE=1          use the date +%s%N loop even when hyperfine is installed
#   WLOAD_BIN=PATH          time this binary instead of building target/release/wload
#
# The reference ("peer") is a Python standard-library one-liner that reads and json.loads all the
# headers: about the least a header-only tool can do, process start-up included.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
FILES=${FILES:-64}
TENSORS=${TENSORS:-2000}
TARGET=${TARGET:-0.3}
RUNS=${RUNS:-10}
PY=${PYTHON:-python3}

cd "$root"
if [[ -n ${WLOAD_BIN:-} ]]; then
    bin=$(realpath "$WLOAD_BIN")
else
    bin="$root/target/release/wload"
    # cargo is a no-op when the release binary is up to date.
    cargo build --release --quiet
fi

own_dir=0
if [[ $# -ge 1 ]]; then
    dir=$1
    # Refuse to overwrite a folder this script did not create (it may be a real checkpoint).
    if [[ -d $dir && -n $(ls -A "$dir") && ! -e $dir/.wload-bench ]]; then
        echo "$dir exists, is not empty and was not made by $0; refusing to overwrite it" >&2
        exit 2
    fi
    mkdir -p "$dir"
    touch "$dir/.wload-bench"
else
    dir=$(mktemp -d "${TMPDIR:-/tmp}/wload-bench-inspect.XXXXXX")
    own_dir=1
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/wload-bench-times.XXXXXX")
trap 'rm -rf "$tmp"; ((own_dir == 0)) || rm -rf "$dir"' EXIT
rm -f "$dir"/*.safetensors
"$PY" "$here/gen_checkpoint.py" --files "$FILES" --tensors-per-file "$TENSORS" --out "$dir" --quiet

# Sanity check before timing: the checkpoint parses and every tensor is listed.
listed=$("$bin" inspect "$dir" --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["totals"]["tensors"])')
if [[ $listed -ne $((FILES * TENSORS)) ]]; then
    echo "wload inspect listed $listed tensors, expected $((FILES * TENSORS))" >&2
    exit 2
fi

peer_py='import glob,json,struct,sys
n=0
for p in sorted(glob.glob(sys.argv[1]+"/*.safetensors")):
    with open(p,"rb") as f:
        h=json.loads(f.read(struct.unpack("<Q",f.read(8))[0]))
    n+=len(h)-("__metadata__" in h)
assert n>0'

names=(json human python)
cmds=(
    "'$bin' inspect '$dir' --json"
    "'$bin' inspect '$dir'"
    "'$PY' -c '$peer_py' '$dir'"
)

declare -A median

if command -v hyperfine >/dev/null && [[ -z ${NO_HYPERFINE:-} ]]; then
    timer="hyperfine $(hyperfine --version | awk '{print $2}')"
    # hyperfine sends the commands' stdout to /dev/null (--output=null, its default).
    hyperfine --warmup 1 --runs "$RUNS" --output=null --style basic \
        --export-json "$tmp/hf.json" \
        -n "wload inspect --json" "${cmds[0]}" \
        -n "wload inspect" "${cmds[1]}" \
        -n "python header read (peer)" "${cmds[2]}" >&2
    read -r -a meds < <("$PY" -c 'import json,sys
print(*("%.4f" % r["median"] for r in json.load(open(sys.argv[1]))["results"]))' "$tmp/hf.json")
    for i in 0 1 2; do median[${names[$i]}]=${meds[$i]}; done
else
    timer="bash loop (date +%s%N)"
    for i in 0 1 2; do
        eval "${cmds[$i]}" >/dev/null # warm-up
        : >"$tmp/${names[$i]}"
        for ((r = 0; r < RUNS; r++)); do
            t0=$(date +%s%N)
            eval "${cmds[$i]}" >/dev/null
            t1=$(date +%s%N)
            echo $((t1 - t0)) >>"$tmp/${names[$i]}"
        done
        median[${names[$i]}]=$(sort -n "$tmp/${names[$i]}" | awk '{a[NR]=$1} END {
            m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "%.4f", m / 1e9 }')
    done
fi

pass=1
verdict() { awk -v t="$1" -v lim="$TARGET" 'BEGIN { exit !(t < lim) }'; }
echo
echo "inspect benchmark: $FILES files x $TENSORS tensors ($((FILES * TENSORS)) tensors), timer: $timer, $RUNS runs, warm cache"
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
for n in json human; do
    ratio=$(awk -v a="${median[$n]}" -v b="${median[python]}" 'BEGIN { printf "%.2f", a / b }')
    if verdict "${median[$n]}"; then v=PASS; else v=FAIL; pass=0; fi
    if [[ $n == json ]]; then label="wload inspect --json"; else label="wload inspect (human)"; fi
    printf '  %-26s median %s s  %5sx the peer  %s (target < %s s)\n' \
        "$label" "${median[$n]}" "$ratio" "$v" "$TARGET"
done
printf '  %-26s median %s s  (peer: json.loads of all %s headers)\n' \
    "python header read" "${median[python]}" "$FILES"
if ((pass)); then echo "PASS"; else echo "FAIL"; exit 1; fi
