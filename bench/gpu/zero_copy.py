"""Experiment behind docs/benchmarks.md "load (GPU)": can the GPU copy straight from page-cache
pages (mmap + cuMemHostRegister READ_ONLY, no host memcpy) beat wload's pinned staging ring?

Registers each chunk of the mmap'd files, copies it with cuMemcpyHtoD, unregisters it; and, for
reference, copies from the plain (pageable) mapping. Needs torch (for the context) and numpy.
Usage: python3 bench/gpu/zero_copy.py FILE.safetensors...   (files warm in the page cache)
"""
import ctypes
import mmap
import os
import sys
import threading
import time

import numpy as np
import torch

PAGE = 4096
READ_ONLY = 0x08  # CU_MEMHOSTREGISTER_READ_ONLY

torch.empty(1, device="cuda")  # creates and binds the primary context
cu = ctypes.CDLL("libcuda.so.1")
cu.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
cu.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
cu.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
cu.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
cu.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
cu.cuDeviceGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
ctx = ctypes.c_void_p()
cu.cuCtxGetCurrent(ctypes.byref(ctx))
for name, attr in [("HOST_REGISTER_SUPPORTED", 99), ("READ_ONLY_HOST_REGISTER_SUPPORTED", 113)]:
    v = ctypes.c_int()
    cu.cuDeviceGetAttribute(ctypes.byref(v), attr, 0)
    print(name, v.value)

maps = []
for f in sys.argv[1:]:
    fd = os.open(f, os.O_RDONLY)
    n = os.fstat(fd).st_size
    m = mmap.mmap(fd, n, prot=mmap.PROT_READ, flags=mmap.MAP_SHARED)
    arr = np.frombuffer(m, dtype=np.uint8)
    maps.append((m, arr, arr.ctypes.data, n))
total = sum(n for *_, n in maps)
dev = torch.empty(total, dtype=torch.uint8, device="cuda")


def run(chunk, threads, register):
    jobs, at = [], 0
    for _, _, base, n in maps:
        jobs += [(base + s, min(chunk, n - s), at + s) for s in range(0, n, chunk)]
        at += n
    lock, it, errors = threading.Lock(), iter(jobs), []

    def work():
        cu.cuCtxSetCurrent(ctx)
        while True:
            with lock:
                job = next(it, None)
            if job is None:
                return
            host, n, dst = job
            lo = host & ~(PAGE - 1)
            span = ((host + n + PAGE - 1) & ~(PAGE - 1)) - lo
            if register and (r := cu.cuMemHostRegister_v2(lo, span, READ_ONLY)):
                errors.append(r)
                return
            if r := cu.cuMemcpyHtoD_v2(dev.data_ptr() + dst, host, n):
                errors.append(r)
            if register:
                cu.cuMemHostUnregister(lo)

    torch.cuda.synchronize()
    t = time.perf_counter()
    pool = [threading.Thread(target=work) for _ in range(threads)]
    for p in pool:
        p.start()
    for p in pool:
        p.join()
    torch.cuda.synchronize()
    rate = total / (time.perf_counter() - t) / 1e9
    kind = "registered" if register else "pageable"
    print(f"{kind:10} chunk {chunk >> 20:4} MiB x{threads}: {rate:6.2f} GB/s errors {errors[:3]}")


for register in (True, False):
    for chunk in (16 << 20, 64 << 20, 256 << 20):
        for threads in (1, 4, 8):
            run(chunk, threads, register)
