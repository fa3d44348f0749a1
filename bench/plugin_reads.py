#!/usr/bin/env python3
"""Bytes one node reads from storage when each rank loads in its own process, as the vLLM plugin
(`--load-format wload`) loads: every process plans the checkpoint (`wload.plan(source, tp=N)`)
and fills its own rank (`Plan.load(rank, ...)`, host memory here), all ranks at once, after the
checkpoint's files were dropped from the page cache.

Counted with Linux's /proc/self/io `read_bytes` (bytes a process caused to be read from storage;
page-cache hits count nothing), from just before `wload.plan` to just after `Plan.load`, summed
over the ranks and given as a ratio to the checkpoint files' bytes: 1.0 means every byte came off
storage once for the whole node.

Usage: bench/plugin_reads.py [--tp 2 4] [--dir DIR] [--layers 3] [--hidden 2048] ...
  The checkpoint is generated (random bf16, Llama-shaped) into DIR, which must be on a block
  device (not tmpfs: there is no storage to count); DIR defaults to a temporary folder under
  /var/tmp, removed afterwards. PYTHON of the running interpreter must import wload and numpy.

Also imported by python/tests/test_node_reads.py, which asserts the ratio.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# One rank's process: ready once imported, then waits for "go" so that every rank starts at once
# (as vLLM's workers do), then reports its storage reads and times as one JSON line.
WORKER = r"""
import json, sys, time
import numpy as np
import wload

def read_bytes():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    raise SystemExit("no read_bytes in /proc/self/io")

source, tp, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
print("ready", flush=True)
sys.stdin.readline()
r0, t0 = read_bytes(), time.perf_counter()
p = wload.plan(source, tp=tp)
bufs = {t.name: np.empty(t.nbytes, dtype=np.uint8) for t in p.tensors(rank)}
report = p.load(rank, {n: b.ctypes.data for n, b in bufs.items()})
r1, t1 = read_bytes(), time.perf_counter()
print(json.dumps({"rank": rank, "read_bytes": r1 - r0, "seconds": t1 - t0,
                  "bytes": report.bytes, "io": report.io, "io_why": getattr(report, "io_why", "")}), flush=True)
"""


def generate(folder, layers=3, hidden=2048, heads=16, kv_heads=8, intermediate=5632,
             vocab=8192, files=2):
    """A random bf16 Llama-shaped checkpoint in `folder` (real bytes on disk, not holes)."""
    subprocess.run(
        [sys.executable, os.path.join(HERE, "gen_checkpoint.py"), "--files", str(files),
         "--layers", str(layers), "--real-shapes", "--random", "--quiet",
         "--hidden-size", str(hidden), "--num-attention-heads", str(heads),
         "--num-key-value-heads", str(kv_heads), "--intermediate-size", str(intermediate),
         "--vocab-size", str(vocab), "--out", folder],
        check=True,
    )


def checkpoint_files(folder):
    return sorted(os.path.join(folder, f) for f in os.listdir(folder)
                  if f.endswith(".safetensors"))


def evict(paths):
    """Every file written back and dropped from the page cache."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def own_read_bytes():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no read_bytes: this kernel does not count I/O")


def check_accounting(paths):
    """Storage reads are counted here: a cold read of the first file must show up in
    read_bytes. Raises (never skips) where it does not (tmpfs, no task I/O accounting)."""
    evict(paths[:1])
    before = own_read_bytes()
    with open(paths[0], "rb") as f:
        while f.read(16 << 20):
            pass
    got = own_read_bytes() - before
    size = os.path.getsize(paths[0])
    if got < size // 2:
        raise RuntimeError(
            f"reading {paths[0]} ({size} bytes) cold counted {got} bytes in /proc/self/io "
            "read_bytes: storage reads are not counted here (tmpfs? no task I/O accounting?); "
            "put the checkpoint on a block device")


def measure(folder, tp, python=sys.executable):
    """Every rank of `tp` loaded by its own process, all at once, cold: per-rank results."""
    paths = checkpoint_files(folder)
    procs = [subprocess.Popen([python, "-c", WORKER, folder, str(tp), str(r)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for r in range(tp)]
    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a rank's process did not start")
        evict(paths)
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"a rank's process failed (exit {p.returncode})")
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return results


def summary(folder, tp, results):
    total = sum(os.path.getsize(p) for p in checkpoint_files(folder))
    read = sum(r["read_bytes"] for r in results)
    return {"tp": tp, "checkpoint_bytes": total, "read_bytes": read, "ratio": read / total,
            "seconds": max(r["seconds"] for r in results), "ranks": results}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--dir", help="where to generate the checkpoint (kept if given)")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=5632)
    ap.add_argument("--json", action="store_true", help="one JSON document per TP size")
    a = ap.parse_args(argv)
    tmp = None
    folder = a.dir
    if folder is None:
        tmp = tempfile.TemporaryDirectory(dir="/var/tmp", prefix="wload-plugin-reads-")
        folder = tmp.name
    try:
        if not (os.path.isdir(folder) and checkpoint_files(folder)):
            generate(folder, layers=a.layers, hidden=a.hidden, intermediate=a.intermediate)
        check_accounting(checkpoint_files(folder))
        for tp in a.tp:
            s = summary(folder, tp, measure(folder, tp))
            if a.json:
                print(json.dumps(s))
                continue
            print(f"tp {tp}: {s['read_bytes'] / 2**20:.1f} MiB read for a "
                  f"{s['checkpoint_bytes'] / 2**20:.1f} MiB checkpoint: {s['ratio']:.3f}x "
                  f"({s['seconds']:.2f} s, slowest rank)")
            for r in s["ranks"]:
                print(f"  rank {r['rank']}: {r['read_bytes'] / 2**20:.1f} MiB read "
                      f"({r['read_bytes'] / s['checkpoint_bytes']:.3f}x), {r['seconds']:.2f} s, "
                      f"io {r['io']}, {r['bytes'] / 2**20:.1f} MiB loaded")
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    t = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t:.1f} s in all)", file=sys.stderr)
