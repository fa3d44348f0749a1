"""Folders gathered from `wload shard --ranks` runs, their run records kept, dropped, cut short,
turned into folders, edited to another wload version, or replaced (with their rank files) by runs
of another source, TP or dtype: `wload.plan(folder)` must accept exactly the folders `wload
inspect` calls complete, and otherwise raise `wload.PlanError` naming an offending record (or, for
a dropped one, the rank files it listed); complete are exactly the folders that are one output
(`one_output`). The vLLM plugin refuses exactly when `wload.plan` raises PlanError. The same cases as the Rust property test
tests/it/safety/fuzz/runs.rs, with Python's seeded `random`.

Needs the `wload` binary: $WLOAD_BIN, else target/release/wload or target/debug/wload, else the
package's own `wload` console script (the same code, run in the extension).

    python -m pytest -q python/tests/test_runs.py
"""

import json
import os
import random
import shutil
import subprocess
import sysconfig

import pytest

import wload

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GQA = os.path.join(REPO, "tests", "data", "golden", "fixtures", "llama_gqa")
SEED = 0x382E3A
CASES = 24
RUNS = [("0-1", "wload-ranks-0-1.json"), ("2", "wload-ranks-2.json"), ("3", "wload-ranks-3.json")]
FATES = ["missing", "truncated", "folder", "other-version", "fine-tune", "tp8", "float16"]


def binary():
    for p in [os.environ.get("WLOAD_BIN"),
              os.path.join(REPO, "target", "release", "wload"),
              os.path.join(REPO, "target", "debug", "wload"),
              os.path.join(sysconfig.get_path("scripts"), "wload")]:
        if p and os.access(p, os.X_OK):
            return p
    pytest.skip("no wload binary: build it with `cargo build` or set WLOAD_BIN")


def fine_tune(src, dst):
    """A copy of `src` with every tensor byte changed and the headers kept."""
    shutil.copytree(src, dst)
    for name in os.listdir(dst):
        if name.endswith(".safetensors"):
            path = os.path.join(dst, name)
            with open(path, "rb") as f:
                raw = bytearray(f.read())
            start = 8 + int.from_bytes(raw[:8], "little")
            for i in range(start, len(raw)):
                raw[i] ^= 1
            os.chmod(path, 0o644)
            with open(path, "wb") as f:
                f.write(raw)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run a case copies: `<root>/<kind>/<ranks>/`."""
    exe = binary()
    root = tmp_path_factory.mktemp("runs")
    tuned = str(root / "tuned-source")
    fine_tune(GQA, tuned)
    kinds = {"base": (GQA, 4, []), "fine-tune": (tuned, 4, []), "tp8": (GQA, 8, []),
             "float16": (GQA, 4, ["--dtype", "float16"])}
    for kind, (source, tp, extra) in kinds.items():
        os.makedirs(root / kind)
        for ranks, _ in RUNS:
            out = str(root / kind / ranks)
            subprocess.run([exe, "shard", source, "--tp", str(tp), "-o", out, "--ranks", ranks]
                           + extra, check=True, capture_output=True)
    return exe, root


def gather(root, fates, folder):
    os.makedirs(folder)
    for (ranks, record), fate in zip(RUNS, fates):
        kind = fate if fate in ("fine-tune", "tp8", "float16") else "base"
        src = root / kind / ranks
        for name in os.listdir(src):
            shutil.copy(src / name, folder / name)
        path = folder / record
        if fate == "missing":
            path.unlink()
        elif fate == "truncated":
            text = path.read_bytes()
            path.write_bytes(text[: len(text) // 2])
        elif fate == "folder":
            path.unlink()
            path.mkdir()
        elif fate == "other-version":
            m = json.loads(path.read_text())
            m["wload_version"] = "0.0.9"
            path.write_text(json.dumps(m))


def offenders(fates):
    names = []
    for (ranks, record), fate in zip(RUNS, fates):
        if fate == "missing":
            a, _, b = ranks.partition("-")
            names += [f"model-rank-{r}-part-0.safetensors" for r in range(int(a), int(b or a) + 1)]
        elif fate != "kept":
            names.append(record)
    return names


# First, folders that are one output (every run kept; every record dropped, so a folder of rank
# files as vLLM writes them; every run of the fine-tune, of float16, or of another wload version),
# which random picks seldom make, and a checkpoint's runs with its fine-tune's, which must not merge.
FIXED = [("kept",) * 3, ("missing",) * 3, ("fine-tune",) * 3, ("float16",) * 3,
         ("other-version",) * 3, ("kept", "kept", "fine-tune")]


def one_output(fates):
    """Whether the gathered folder is one complete output: every run of one plan, source and
    version with its record readable, or every record dropped. Truncated and folder records are
    unreadable; the TP 8 runs cover ranks 0-3 of 8."""
    return len(set(fates)) == 1 and fates[0] not in ("truncated", "folder", "tp8")


def cases():
    rng = random.Random(SEED)
    out = list(FIXED)
    while len(out) < CASES:
        out.append(tuple("kept" if rng.random() < 0.5 else rng.choice(FATES) for _ in RUNS))
    return out


@pytest.mark.parametrize("number", range(CASES))
def test_plan_accepts_exactly_what_inspect_calls_complete(runs, tmp_path, number):
    exe, root = runs
    fates = cases()[number]
    folder = tmp_path / "gathered"
    gather(root, fates, folder)
    i = subprocess.run([exe, "inspect", str(folder), "--json"], capture_output=True, text=True)
    complete = i.returncode == 0 and json.loads(i.stdout)["complete"] is True
    try:
        wload.plan(str(folder), tp=None, pp=None, dtype=None)
        refusal = None
    except wload.PlanError as e:
        refusal = str(e)
    assert complete == (refusal is None), (fates, i.stdout, refusal)
    assert complete == one_output(fates), (fates, i.stdout)
    if refusal is not None:
        names = offenders(fates)
        assert any(n in refusal for n in names), (fates, names, refusal)
        assert any(n in i.stdout for n in names), (fates, names, i.stdout)
