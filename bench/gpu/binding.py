"""The Python binding on a GPU: `Plan.load(device="cuda")` filling torch-allocated CUDA tensors
(what the vLLM plugin does) against the ceilings, for a machine with an NVIDIA GPU and PyTorch and
no network (nothing is downloaded or built here: bring the wheel, `maturin build --release` in
python/ elsewhere).

  1. pinned host-to-device bandwidth through torch (1 GiB pinned buffer, best of 5): the warm
     ceiling for any loader;
  2. the storage's parallel read rate: the checkpoint's files read cold with O_DIRECT by 8
     threads in 16 MiB blocks, as wload reads cold: the cold ceiling;
  3. the 4-layer Llama-3-8B-shaped checkpoint (3.6 GiB of random bf16, bench/gen_checkpoint.py),
     generated in WORKDIR unless there;
  4. the plan at TP 1, one torch.empty CUDA tensor per planned tensor, then RUNS loads warm (the
     files read first) and RUNS cold (evicted with posix_fadvise, read with the io the engine
     picks) on torch's current stream: median GB/s of the transfer until the last copy landed
     (as `wload load` reports it), and of the whole call (opening the device and allocating the
     pinned ring included);
  5. every tensor of the last warm load copied back and compared with the same plan loaded into
     host memory (the path the test suite proves byte-identical to vLLM).

Targets (issue 29): warm >= 90 % of pinned H2D, cold >= 90 % of the storage's read rate. Prints a
table and writes JSON; exit 0 on PASS, 1 on FAIL (a mismatch or a target missed), 2 on bad usage.

    python3 bench/gpu/binding.py [WORKDIR] [--wheel PATH] [--runs N] [--json PATH]

--wheel: the wheel built elsewhere (python/target/wheels/wload-*.whl), unpacked into WORKDIR and
imported from there; without it `import wload` must already work.
"""

import argparse
import glob
import json
import mmap
import os
import statistics
import subprocess
import sys
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BLOCK = 16 << 20
READERS = 8


def step(msg):
    print(f"== {msg}", file=sys.stderr, flush=True)


def import_wload(work, wheel):
    if wheel:
        dest = os.path.join(work, "wheel")
        with zipfile.ZipFile(wheel) as z:
            z.extractall(dest)
        sys.path.insert(0, dest)
    try:
        import wload
    except ImportError as e:
        sys.exit(f"binding.py: cannot import wload ({e}); pass --wheel python/target/wheels/*.whl")
    return wload


def pinned_h2d(torch):
    n = 1 << 30
    h = torch.empty(n, dtype=torch.uint8).pin_memory()
    d = torch.empty(n, dtype=torch.uint8, device="cuda")
    d.copy_(h, non_blocking=True)
    torch.cuda.synchronize()
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        d.copy_(h, non_blocking=True)
        torch.cuda.synchronize()
        best = max(best, n / (time.perf_counter() - t) / 1e9)
    del h, d
    torch.cuda.empty_cache()
    return best


def evict(files):
    os.sync()
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm_up(files):
    for f in files:
        with open(f, "rb") as h:
            while h.read(BLOCK):
                pass


def storage_read_rate(files):
    """GB/s of READERS threads reading every file cold with O_DIRECT, BLOCK at a time."""
    evict(files)
    jobs = [(f, off) for f in files for off in range(0, os.path.getsize(f), BLOCK)]
    lock = threading.Lock()
    total = [0]

    def work():
        buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT needs
        fds = {}
        try:
            while True:
                with lock:
                    if not jobs:
                        return
                    f, off = jobs.pop()
                fd = fds.get(f)
                if fd is None:
                    fd = fds[f] = os.open(f, os.O_RDONLY | os.O_DIRECT)
                n = os.preadv(fd, [buf], off)
                with lock:
                    total[0] += n
        finally:
            for fd in fds.values():
                os.close(fd)
            buf.close()

    t = time.perf_counter()
    # Through futures, so that a reader's exception is raised here, not lost with its thread.
    with ThreadPoolExecutor(READERS) as pool:
        for f in [pool.submit(work) for _ in range(READERS)]:
            f.result()
    return total[0] / (time.perf_counter() - t) / 1e9


def load_runs(torch, plan, dests, files, runs, cold):
    """RUNS loads of rank 0 into `dests`: GB/s of each transfer (reads, staging and copies until
    the last landed, as `wload load` reports it), GB/s of each whole call (with opening the device
    and allocating the pinned ring), and the last call's dict."""
    stream = torch.cuda.current_stream()
    rates, calls, last = [], [], None
    for _ in range(runs):
        if cold:
            evict(files)
        else:
            warm_up(files)
        torch.cuda.synchronize()
        t = time.perf_counter()
        last = plan.load(0, dests, device="cuda", device_index=torch.cuda.current_device(),
                         stream=stream.cuda_stream)
        torch.cuda.synchronize()
        calls.append(last.bytes / (time.perf_counter() - t) / 1e9)
        rates.append(last.bytes / (last.transfer_s + last.sync_s) / 1e9)
    return rates, calls, last


def mismatches(np, plan, gpu):
    """Tensors whose GPU bytes differ from the same plan loaded into host memory."""
    host = {t.name: np.empty(t.nbytes, np.uint8) for t in plan.tensors(0)}
    plan.load(0, {n: b.ctypes.data for n, b in host.items()})
    return [n for n, b in host.items() if not (gpu[n].cpu().numpy() == b).all()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work", nargs="?", default="/tmp/wload-gpu-binding")
    ap.add_argument("--wheel")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    work = args.work
    os.makedirs(work, exist_ok=True)
    json_out = args.json or os.path.join(work, "binding.json")
    wload = import_wload(work, args.wheel)
    import numpy as np
    import torch

    src = os.path.join(work, "src")
    if not os.path.isfile(os.path.join(src, "config.json")):
        step(f"generating the checkpoint in {src}")
        subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gen_checkpoint.py"),
                        "--files", "2", "--layers", "4", "--real-shapes", "--random", "--quiet",
                        "--out", src], check=True)
    files = sorted(glob.glob(os.path.join(src, "*.safetensors")))

    step("pinned host-to-device bandwidth (torch)")
    pinned = pinned_h2d(torch)
    step(f"storage read rate ({READERS} threads, O_DIRECT, {BLOCK >> 20} MiB blocks, cold)")
    storage = storage_read_rate(files)

    plan = wload.plan(src, tp=1)
    gpu = {t.name: torch.empty(t.nbytes, dtype=torch.uint8, device="cuda")
           for t in plan.tensors(0)}
    dests = {n: g.data_ptr() for n, g in gpu.items()}
    step(f"Plan.load(device='cuda'), warm, {args.runs} runs")
    warm, warm_calls, warm_last = load_runs(torch, plan, dests, files, args.runs, cold=False)
    step("comparing every tensor with the host-memory load")
    bad = mismatches(np, plan, gpu)
    step(f"Plan.load(device='cuda'), cold, {args.runs} runs")
    cold, cold_calls, cold_last = load_runs(torch, plan, dests, files, args.runs, cold=True)

    res = {
        "device": torch.cuda.get_device_name(),
        "bytes": warm_last.bytes,
        "pinned_h2d_gbps": pinned,
        "storage_read_gbps": storage,
        "warm_gbps": warm, "warm_median_gbps": statistics.median(warm),
        "warm_call_gbps": warm_calls, "warm_last": warm_last.to_dict(),
        "cold_gbps": cold, "cold_median_gbps": statistics.median(cold),
        "cold_call_gbps": cold_calls, "cold_last": cold_last.to_dict(),
        "mismatched_tensors": bad,
    }
    res["warm_vs_pinned"] = res["warm_median_gbps"] / pinned
    res["cold_vs_storage"] = res["cold_median_gbps"] / storage
    res["pass"] = not bad and res["warm_vs_pinned"] >= 0.9 and res["cold_vs_storage"] >= 0.9
    with open(json_out, "w") as f:
        json.dump(res, f, indent=1)

    print(f"{res['device']}, {res['bytes'] / 2**30:.2f} GiB at TP 1")
    print(f"pinned H2D (torch)              {pinned:6.2f} GB/s")
    print(f"storage, {READERS} O_DIRECT readers     {storage:6.2f} GB/s")
    for label, rates, calls, last, ceiling, cname in (
        ("warm", warm, warm_calls, warm_last, pinned, "pinned H2D"),
        ("cold", cold, cold_calls, cold_last, storage, "storage"),
    ):
        med = statistics.median(rates)
        print(f"Plan.load(cuda) {label}            {med:6.2f} GB/s median (min {min(rates):.2f}, "
              f"max {max(rates):.2f}) = {100 * med / ceiling:.0f}% of {cname}; io {last.io}")
        print(f"  whole call (device opened, pinned ring allocated): "
              f"{statistics.median(calls):.2f} GB/s median")
        print(f"  stages: read {last.read_s + last.direct_read_s:.3f}s, staging "
              f"{last.host_copy_s:.3f}s, on the GPU {last.device_copy_s:.3f}s, waited "
              f"{last.staging_wait_s:.3f}s for slots, sync {last.sync_s:.3f}s, "
              f"{last.staging_bytes / 2**20:.0f} MiB pinned")
    print(f"bytes: {'every tensor equal to the host load' if not bad else f'{len(bad)} differ: {bad[:5]}'}")
    print("targets: warm >= 90% of pinned H2D, cold >= 90% of storage")
    print("PASS" if res["pass"] else "FAIL")
    print(f"results: {json_out}")
    return 0 if res["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
