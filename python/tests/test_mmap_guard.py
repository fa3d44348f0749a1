"""`io="mmap"` keeps its guard against source files cut short under the map when the host
process sets its own SIGBUS handler after wload's first load (`faulthandler.enable()`, as vLLM's
watchdog and torch elastic call it): the load raises WloadError, the interpreter does not die of
"Fatal Python error: Bus error" (exit 135).

The files must shrink while the load reads them, after they are mapped: the load goes through the
stub libcuda of test_cuda_stub.py, whose copies take STUB_SLOW_MS each, and a SIGALRM handler
(run by the load's signal polling) cuts every source file to half while it is under way."""

import os
import subprocess
import sys
import textwrap

from test_cuda_stub import stub_env  # noqa: F401 - the fixture: the stub built, its environment

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GQA = os.path.join(REPO, "tests", "data", "golden", "fixtures", "llama_gqa")

SCRIPT = textwrap.dedent(
    """
    import faulthandler, os, shutil, signal, sys
    import numpy as np
    import wload

    os.environ["RAYON_NUM_THREADS"] = "2"
    src = os.path.join(sys.argv[2], "gqa")
    shutil.copytree(sys.argv[1], src)
    p = wload.plan(src, tp=1)
    bufs = {t.name: np.zeros(t.nbytes, np.uint8) for t in p.tensors(0)}
    dests = {n: b.ctypes.data for n, b in bufs.items()}
    # A first mmap load installs wload's handler; faulthandler then sets its own over it.
    p.load(0, dests, device="cuda", io="mmap")
    faulthandler.enable()
    parts = [os.path.join(src, f) for f in os.listdir(src) if f.endswith(".safetensors")]

    def cut(*_):
        for f in parts:
            os.truncate(f, os.path.getsize(f) // 2)
        print("cut", flush=True)

    os.environ["STUB_SLOW_MS"] = "100"
    signal.signal(signal.SIGALRM, cut)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        p.load(0, dests, device="cuda", io="mmap")
    except wload.WloadError as e:
        print("WloadError", e)
        sys.exit(0)
    print("loaded files cut short without an error")
    sys.exit(1)
    """
)


def test_files_cut_during_an_mmap_load_after_faulthandler_enable_are_an_error(stub_env, tmp_path):  # noqa: F811
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, GQA, str(tmp_path)],
        env=stub_env, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0 and "cut" in r.stdout and "WloadError" in r.stdout, (
        f"exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr[-3000:]}"
    )
