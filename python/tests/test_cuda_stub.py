"""`Plan.load(device="cuda")` without a GPU: the stub libcuda (tests/data/stub_libcuda.c, the one
the Rust suite's CUDA tests use) is built with the C compiler and put first on LD_LIBRARY_PATH of
a child process running stub_gpu.py, which fills every golden case's ranks through the staging
ring on the caller's stream and checks the refusals. A missing C compiler fails the test: CI
has one, and without it the CUDA path would go untested.
"""

import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
STUB_C = os.path.join(HERE, "..", "..", "tests", "data", "stub_libcuda.c")


@pytest.fixture(scope="module")
def stub_env(tmp_path_factory):
    cc = shutil.which("cc")
    assert cc, "no C compiler (cc) to build the stub libcuda"
    d = tmp_path_factory.mktemp("stub")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(d / "libcuda.so.1"), STUB_C], check=True)
    os.symlink("libcuda.so.1", d / "libcuda.so")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in [str(d), env.get("LD_LIBRARY_PATH", "")] if p
    )
    # cuInit succeeds, one GPU whose primary context can be made.
    env.update(STUB_CU_INIT="0", STUB_GPUS="1", STUB_CTX="ok")
    return env


@pytest.mark.parametrize("what", ["golden", "refusals", "interrupt"])
def test_cuda_destinations_through_the_stub_driver(stub_env, what):
    r = subprocess.run(
        [sys.executable, os.path.join(HERE, "stub_gpu.py"), what],
        env=stub_env, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
