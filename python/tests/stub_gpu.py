"""The program test_cuda_stub.py runs, in a process whose LD_LIBRARY_PATH puts the stub libcuda
(tests/data/stub_libcuda.c) first: a GPU in host memory, so `Plan.load(device="cuda")` is
exercised end to end without one. "Device memory" here is numpy buffers full of garbage (the stub
copies to any address at or above 64 KiB); copies queued on a stream land only when the stream
or a later event is synchronised, so a load that returned before its copies landed, or reused a
staging slot too early, leaves garbage or wrong bytes that the comparison sees.

    python stub_gpu.py golden|refusals|interrupt      prints every failure; exit 1 if any
"""

import ctypes
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from test_golden import (  # noqa: E402
    CASES,
    CUDA_REPORT_KEYS,
    GARBAGE,
    GQA,
    REPORT_KEYS,
    same_as_vllm,
)

import wload  # noqa: E402

CU = ctypes.CDLL("libcuda.so.1")
CU.stub_stream_ops.restype = ctypes.c_size_t
CU.stub_stream_ops.argtypes = [ctypes.c_void_p]


def new_stream():
    """A stream of the stub, as torch.cuda.Stream() would make: its handle as an integer."""
    s = ctypes.c_void_p()
    assert CU.cuStreamCreate(ctypes.byref(s), 1) == 0
    return s.value


def load_on_gpu(p, rank, stream):
    bufs = {t.name: np.full(t.nbytes, GARBAGE, np.uint8) for t in p.tensors(rank)}
    before = CU.stub_stream_ops(stream)
    r = p.load(rank, {n: b.ctypes.data for n, b in bufs.items()}, device="cuda", stream=stream)
    return bufs, r, CU.stub_stream_ops(stream) - before


def current_context():
    c = ctypes.c_void_p()
    assert CU.cuCtxGetCurrent(ctypes.byref(c)) == 0
    return c.value


def golden():
    """Every golden case, every rank, filled through the staging ring on the caller's stream
    (the legacy default stream and a stream of its own, in turn), against what vLLM held."""
    failures = []
    streams = [0, new_stream()]
    # The caller's context (torch's current device) is current again after every load.
    assert CU.cuCtxSetCurrent(ctypes.c_void_p(0xC0DE)) == 0
    n = 0
    for case in CASES:
        p = wload.plan(case.fixture, tp=case.tp, **case.kw)
        for rank in range(p.world_size):
            stream = streams[n % 2]
            n += 1
            want = case.vllm_rank(rank)
            computed = case.computed_f32(rank)
            bufs, r, queued = load_on_gpu(p, rank, stream)
            label = f"{case.name} rank {rank} (stream {stream:#x})"
            if r.device != "cuda:0" or not r.staging_bytes or r.device_copy_s is None:
                failures.append(f"{label}: reported {r}")
            # The CUDA figures are attributes and keys too (the report was a dict).
            if list(r) != REPORT_KEYS + CUDA_REPORT_KEYS or r["staging_bytes"] != r.staging_bytes:
                failures.append(f"{label}: the report's keys are {list(r)}")
            if current_context() != 0xC0DE:
                failures.append(f"{label}: the caller's context is no longer current")
            # Every byte went through the caller's stream (garbage in = a copy not queued).
            if queued == 0 and r.bytes > 0:
                failures.append(f"{label}: nothing was queued on the caller's stream")
            for name, (dtype, shape, data, sha) in want.items():
                if name not in bufs:
                    failures.append(f"{label}: '{name}' missing")
                    continue
                if not same_as_vllm(bufs[name].tobytes(), data, sha, computed.get(name)):
                    failures.append(f"{label}: '{name}': bytes differ from vLLM's")
    if n < 30:
        failures.append(f"only {n} ranks loaded")
    return failures


def expect(failures, what, exc, words, f):
    try:
        f()
    except exc as e:
        missing = [w for w in words if w not in str(e)]
        if missing:
            failures.append(f"{what}: message lacks {missing}: {e}")
        return
    except Exception as e:  # noqa: BLE001 - any other exception is the failure reported
        failures.append(f"{what}: raised {type(e).__name__}: {e}")
        return
    failures.append(f"{what}: did not raise")


def refusals():
    """Destinations the driver does not know, another GPU's memory, a GPU not there, a driver
    that fails, a source cut short: each a clear error, nothing read where it says so."""
    failures = []
    p = wload.plan(GQA, tp=2)
    tensors = p.tensors(0)
    bufs = {t.name: np.full(t.nbytes, GARBAGE, np.uint8) for t in tensors}
    dests = {n: b.ctypes.data for n, b in bufs.items()}
    bad = tensors[2].name
    expect(failures, "an address CUDA does not know", ValueError,
           [f"'{bad}'", "0x1000", "not memory CUDA knows", "nothing was read"],
           lambda: p.load(0, {**dests, bad: 0x1000}, device="cuda"))
    os.environ["STUB_PTR_ORDINAL"] = "1"
    expect(failures, "another GPU's memory", ValueError,
           ["memory of cuda:1, not cuda:0", "device_index=1"],
           lambda: p.load(0, dests, device="cuda"))
    del os.environ["STUB_PTR_ORDINAL"]
    if not all((b == GARBAGE).all() for b in bufs.values()):
        failures.append("a refused load wrote to its destinations")
    expect(failures, "a GPU that is not there", wload.WloadError,
           ["cuda:3", "only 1 GPU is visible", "nothing was written"],
           lambda: p.load(0, dests, device="cuda:3"))
    # The same destinations then load: the refusals left nothing behind.
    p.load(0, dests, device="cuda", device_index=0)
    if any((b == GARBAGE).all() for b in bufs.values() if b.size > 16):
        failures.append("the load after the refusals left a tensor untouched")
    # A weight file cut short after planning: the load fails and says so, and its copies are
    # drained before the staging ring is freed (the stub would read freed memory otherwise).
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "gqa")
        shutil.copytree(GQA, src)
        q = wload.plan(src, tp=1)
        part = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))[0]
        with open(os.path.join(src, part), "r+b") as f:
            f.truncate(os.path.getsize(os.path.join(src, part)) // 2)
        qb = {t.name: np.zeros(t.nbytes, np.uint8) for t in q.tensors(0)}
        expect(failures, "a source cut short", wload.WloadError,
               ["loading rank 0 failed", "partial data", part],
               lambda: q.load(0, {n: b.ctypes.data for n, b in qb.items()}, device="cuda"))
    # A driver whose initialisation fails: its own words, as WloadError.
    os.environ["STUB_CU_INIT"] = "100"
    expect(failures, "a failing driver", wload.WloadError,
           ["CUDA_ERROR_NO_DEVICE", "initialising", "nothing was written"],
           lambda: p.load(0, dests, device="cuda"))
    return failures


def interrupt():
    """Ctrl-C during a load stops the engine within a chunk and raises KeyboardInterrupt, instead
    of finishing the rank first (the stub makes each copy take STUB_SLOW_MS)."""
    failures = []
    # Two workers (set before the engine's first run), as on CI's 2 cores: each stops after the
    # copy it is in, and the stub queues copies one at a time, so more threads would only queue
    # more of them ahead of the stop.
    os.environ["RAYON_NUM_THREADS"] = "2"
    p = wload.plan(GQA, tp=1)
    bufs = {t.name: np.zeros(t.nbytes, np.uint8) for t in p.tensors(0)}
    dests = {n: b.ctypes.data for n, b in bufs.items()}
    os.environ["STUB_SLOW_MS"] = "100"
    t = time.perf_counter()
    p.load(0, dests, device="cuda", io="buffered")
    whole = time.perf_counter() - t
    if whole < 1.5:
        failures.append(f"an uninterrupted slow load took {whole:.2f}s: too fast to interrupt")
    threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    t = time.perf_counter()
    try:
        p.load(0, dests, device="cuda", io="buffered")
        failures.append("the interrupted load returned normally")
    except KeyboardInterrupt:
        stopped = time.perf_counter() - t
        if stopped > whole / 2:
            failures.append(f"interrupted at 0.3s, it stopped at {stopped:.2f}s of {whole:.2f}s")
    del os.environ["STUB_SLOW_MS"]
    return failures


if __name__ == "__main__":
    failures = {"golden": golden, "refusals": refusals, "interrupt": interrupt}[sys.argv[1]]()
    for f in failures:
        print(f)
    sys.exit(1 if failures else 0)
