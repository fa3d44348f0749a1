#!/usr/bin/env bash
# GPU benchmark, for a machine with an NVIDIA GPU, PyTorch and safetensors, and no network
# (nothing is downloaded, nothing is built: give it a release wload built elsewhere).
#   1. pinned host-to-device bandwidth, measured with the CUDA driver through torch (the ceiling
#      for any loader): 1 GiB pinned buffer copied to the GPU, best of 5;
#   2. the 4-layer Llama-3-8B-shaped checkpoint (3.6 GiB of random bf16, bench/gen_checkpoint.py),
#      generated in WORKDIR unless already there;
#   3. `wload load --device cuda --tp 1 --check`, warm (files read first) and cold (--cold: the
#      files evicted from the page cache, checked with mincore), each --repeat RUNS: median GB/s,
#      and --check copies every tensor of the last run back and compares it with the host's;
#   4. safetensors.torch.load_file(f, device="cuda") on the same files, warm and cold (the same
#      eviction, posix_fadvise), best of RUNS;
# then prints the ratios and writes them as JSON. Target: wload warm >= 90% of pinned H2D.
# Exit 0 on PASS, 1 on FAIL (a failed --check, or the target missed); the JSON is written either
# way. About 1-2 minutes on an H200 with RUNS=3 (the first run generates the checkpoint).
#
# Usage: bench/gpu/run.sh [WORKDIR] [--json PATH]
# Environment:
#   WLOAD_BIN   the wload binary (default: target/release/wload of this checkout, which must exist)
#   JSON_OUT    where to write the results (default WORKDIR/run.json; --json wins)
#   RUNS=3, PYTHON=python3
#   SKIP_TORCH=1  only the wload steps (no torch, no nvidia-smi): what the test suite runs against
#                 a stub libcuda; GEN_ARGS then sizes the checkpoint (gen_checkpoint.py options).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
RUNS=${RUNS:-3}
PY=${PYTHON:-python3}
SKIP_TORCH=${SKIP_TORCH:-0}
work=/tmp/wload-gpu-bench
json_out=${JSON_OUT:-}
while [[ $# -gt 0 ]]; do
    case $1 in
    --json)
        json_out=${2:?--json needs a path}
        shift 2
        ;;
    -*)
        echo "run.sh: unknown option $1 (usage: run.sh [WORKDIR] [--json PATH])" >&2
        exit 2
        ;;
    *)
        work=$1
        shift
        ;;
    esac
done
bin=${WLOAD_BIN:-$root/target/release/wload}
if [[ ! -x $bin ]]; then
    echo "run.sh: no wload binary at $bin; build one elsewhere (cargo build --release) and set WLOAD_BIN" >&2
    exit 2
fi
src=$work/src
json_out=${json_out:-$work/run.json}
mkdir -p "$work" "$(dirname "$json_out")"
step() { printf '== %s\n' "$*" >&2; }

"$bin" --version
if [[ ! -f $src/config.json ]]; then
    step "generating the checkpoint in $src"
    # shellcheck disable=SC2086 # GEN_ARGS is a list of options
    "$PY" "$root/bench/gen_checkpoint.py" ${GEN_ARGS:---files 2 --layers 4 --real-shapes} \
        --random --quiet --out "$src"
fi

pinned=null
if [[ $SKIP_TORCH != 1 ]]; then
    nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current \
        --format=csv,noheader || true
    step "pinned host-to-device bandwidth (torch)"
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
fi

# One `wload load` with --repeat and --check; prints a JSON summary line of its report.
wload_run() { # label, extra arguments
    local label=$1
    shift
    step "wload load --device cuda --tp 1 --check --repeat $RUNS $* ($label)"
    local out=$work/wload-$label.json
    if ! "$bin" load "$src" --tp 1 --device cuda --check --repeat "$RUNS" --json -q "$@" >"$out" 2>"$work/wload-$label.err"; then
        echo "wload load ($label) failed:" >&2
        tail -c 2000 "$work/wload-$label.err" >&2
        "$PY" -c 'import json,sys; print(json.dumps({"ok": False, "error": open(sys.argv[1]).read()[-2000:]}))' "$work/wload-$label.err"
        return 0
    fi
    "$PY" - "$out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
t, r = d["timings"], d["ranks"][0]
rep = d.get("repeats") or {}
g = d["bytes"] / (t["transfer_s"] + t["sync_s"]) / 1e9
print(json.dumps({
    "ok": True,
    "bytes": d["bytes"],
    "gbps_median": rep.get("gbps_median", g), "gbps_min": rep.get("gbps_min", g),
    "gbps_max": rep.get("gbps_max", g),
    "io": d["io"]["used"], "io_why": d["io"]["why"],
    "resident_share": d["cache"]["resident_share"],
    "staging_bytes": d["io"]["staging_bytes_per_rank"],
    "read_gbps": r["read_gbps"], "h2d_gbps": r["h2d_gbps"], "overlap": r["overlap"],
    "staging_wait_s": r["staging_wait_s"], "open_devices_s": t["open_devices_s"],
    "check": "ok",
}))
PY
}

cat "$src"/*.safetensors >/dev/null
warm=$(wload_run warm)
cold=$(wload_run cold --cold)

peer_warm=null
peer_cold=null
if [[ $SKIP_TORCH != 1 ]]; then
    peer() { # cold (0/1) -> best GB/s of safetensors load_file(device="cuda")
        "$PY" - "$src" "$RUNS" "$1" <<'PY'
import glob, os, sys, time, torch
from safetensors.torch import load_file
files = sorted(glob.glob(os.path.join(sys.argv[1], "*.safetensors")))
cold = sys.argv[3] == "1"
best = 0.0
for _ in range(int(sys.argv[2])):
    if cold:
        for f in files:
            fd = os.open(f, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
    else:
        for f in files:
            with open(f, "rb") as h:
                while h.read(1 << 24):
                    pass
    torch.cuda.synchronize(); t = time.perf_counter(); total = 0; keep = []
    for f in files:
        sd = load_file(f, device="cuda")
        total += sum(v.numel() * v.element_size() for v in sd.values()); keep.append(sd)
    torch.cuda.synchronize()
    best = max(best, total / (time.perf_counter() - t) / 1e9)
    del keep; torch.cuda.empty_cache()
print(f"{best:.2f}")
PY
    }
    step "safetensors load_file(device=cuda), warm"
    peer_warm=$(peer 0)
    step "safetensors load_file(device=cuda), cold"
    peer_cold=$(peer 1)
fi

"$PY" - "$json_out" "$pinned" "$peer_warm" "$peer_cold" "$warm" "$cold" <<'PY'
import json, sys
out, pinned, pw, pc = sys.argv[1], *(json.loads(a) for a in sys.argv[2:5])
warm, cold = json.loads(sys.argv[5]), json.loads(sys.argv[6])
ok = warm.get("ok") and cold.get("ok")
ratio = warm["gbps_median"] / pinned if ok and pinned else None
res = {
    "pinned_h2d_gbps": pinned,
    "wload_warm": warm, "wload_cold": cold,
    "safetensors_warm_gbps": pw, "safetensors_cold_gbps": pc,
    "warm_vs_pinned": ratio,
    "warm_vs_safetensors": warm["gbps_median"] / pw if ok and pw else None,
    "cold_vs_safetensors": cold["gbps_median"] / pc if ok and pc else None,
    "target": "wload warm >= 90% of pinned H2D",
}
res["pass"] = bool(ok) and (ratio is None or ratio >= 0.9)
json.dump(res, open(out, "w"), indent=1)
f = lambda v: "-" if v is None else f"{v:6.2f}"
if pinned is not None:
    print(f"pinned H2D (torch)                   {f(pinned)} GB/s")
for label, w, p in (("warm", warm, pw), ("cold", cold, pc)):
    if not w.get("ok"):
        print(f"wload load --device cuda ({label})    FAILED: {w['error'].strip()[-300:]}")
        continue
    extra = f" = {100 * w['gbps_median'] / pinned:.0f}% of pinned" if pinned else ""
    print(f"wload load --device cuda ({label})    {f(w['gbps_median'])} GB/s median "
          f"(min {w['gbps_min']:.2f}, max {w['gbps_max']:.2f}){extra}; io {w['io']}, "
          f"{100 * w['resident_share']:.0f}% cached at start; --check {w['check']}")
    print(f"  stages: read {w['read_gbps']:.2f} GB/s busy, H2D {w['h2d_gbps']:.2f} GB/s on the GPU, "
          f"overlap {w['overlap']:.2f}, staging {w['staging_bytes'] / 2**20:.0f} MiB pinned, "
          f"waited {w['staging_wait_s']:.3f} s for slots")
    if p is not None:
        print(f"safetensors load_file(cuda) ({label}) {f(p)} GB/s; wload is {w['gbps_median'] / p:.2f}x it")
if ratio is not None:
    print(f"target: warm >= 90% of pinned: {100 * ratio:.0f}%")
print("PASS" if res["pass"] else "FAIL")
print(f"results: {out}")
sys.exit(0 if res["pass"] else 1)
PY
