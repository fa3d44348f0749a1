"""The `wload` console script the package installs (`[project.scripts]`, wload/_cli.py): the same
command as cargo's binary, run in the extension. Its version is the package's, its reports and exit
statuses are the binary's, and Ctrl-C during `shard` stops it as it stops the binary (exit 130,
nothing published), which needs Python's own SIGINT handler out of the way.

Runs the script installed next to this interpreter (`sysconfig`'s scripts folder), as `.ci/run`
installs the wheel: `python -m pytest -q python/tests/test_cli_entry.py`.
"""

import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time

import pytest

import wload

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GQA = os.path.join(REPO, "tests", "data", "golden", "fixtures", "llama_gqa")


@pytest.fixture(scope="module")
def script():
    path = os.path.join(sysconfig.get_path("scripts"), "wload")
    assert os.access(path, os.X_OK), (
        f"no console script at {path}: install the package (pip install ./python, or its wheel)")
    return path


def run(script, *args):
    return subprocess.run([script, *args], capture_output=True, text=True, timeout=120)


def test_version_is_the_package_version(script):
    r = run(script, "--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"wload {importlib.metadata.version('wload')}"
    assert r.stdout.strip() == f"wload {wload.__version__}"


def test_inspect_json_parses(script):
    r = run(script, "inspect", GQA, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] is True
    assert doc["wload_version"] == wload.__version__


def test_bad_sources_exit_as_the_binary_does(script, tmp_path):
    # A path that is not there is a usage error (2), with its JSON document under --json.
    r = run(script, "inspect", str(tmp_path / "missing"), "--json")
    assert r.returncode == 2, r.stderr
    assert json.loads(r.stdout)["exit_status"] == 2
    assert "no such folder" in r.stderr
    # A malformed checkpoint is refused (3), naming the file.
    bad = tmp_path / "bad"
    bad.mkdir()
    with open(os.path.join(GQA, "config.json"), "rb") as f:
        (bad / "config.json").write_bytes(f.read())
    (bad / "model.safetensors").write_bytes(b"garbage!")
    r = run(script, "inspect", str(bad))
    assert r.returncode == 3, r.stderr
    assert "model.safetensors" in r.stderr and "header" in r.stderr
    # clap's usage errors go through the same code: exit 2, on stderr.
    r = run(script, "shard", GQA)
    assert r.returncode == 2
    assert "--tp" in r.stderr or "-o" in r.stderr


def big_checkpoint(path):
    """About 380 MB over 4 files (bench/gen_checkpoint.py, as tests/it/commands/shard.rs makes
    its own): the release build writes it in about a second, so a signal sent once the staging
    folder appears lands while it writes."""
    subprocess.run(
        [sys.executable, os.path.join(REPO, "bench", "gen_checkpoint.py"), "--files", "4",
         "--layers", "8", "--real-shapes", "--hidden-size", "1024", "--intermediate-size", "4096",
         "--num-attention-heads", "16", "--num-key-value-heads", "8", "--vocab-size", "32000",
         "--quiet", "--out", str(path)], check=True, timeout=300)


def test_sigint_during_shard_exits_130_and_publishes_nothing(script, tmp_path):
    src, out = tmp_path / "ckpt", tmp_path / "out"
    big_checkpoint(src)
    # The staging folder is `.out.wload-…` beside OUT; it appears once planning is done and the
    # handlers are installed (src/app/interrupt.rs).
    staging = f".{out.name}.wload-"
    child = subprocess.Popen([script, "shard", str(src), "--tp", "2", "-o", str(out), "-q"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        t = time.monotonic()
        while not any(n.startswith(staging) for n in os.listdir(tmp_path)):
            assert child.poll() is None, f"wload ended before writing: {child.stderr.read()}"
            assert time.monotonic() - t < 60, "no staging folder within 60 s"
            time.sleep(0.001)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        # pytest keeps the last runs' folders: not 380 MB each.
        shutil.rmtree(src)
    # Not death by SIGINT (-2) nor Python's KeyboardInterrupt (1, a traceback): wload's own
    # handler stopped the work and the command returned 130 through sys.exit.
    assert child.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.count(f"error: interrupted: nothing was written to {out}") == 1, err
    assert not out.exists()
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)
