"""The Python package against real vLLM 0.33: every golden case of tests/data/golden (the same
enumeration as tests/it/support/golden.rs) is planned from its fixture with the case's flags, every
rank is loaded into numpy buffers full of garbage through `Plan.load`, and each tensor must be,
byte for byte, what vLLM held: the rank files' bytes, or for cases kept as digests (tensors.json)
their SHA-256. Also: vLLM's own folders load as pre-sharded sources, and bad destinations, bad
options and a failed load raise what the API promises.

    python -m pytest -q python/tests        (after `pip install ./python numpy pytest mypy`)
"""

import hashlib
import json
import os
import re
import shutil
import struct

import numpy as np
import pytest

import wload

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GOLDEN = os.path.join(REPO, "tests", "data", "golden")
EXPECTED = os.path.join(GOLDEN, "expected")
FIXTURES = os.path.join(GOLDEN, "fixtures")
# Not a byte any plan writes everywhere: a byte the load forgets stays visible.
GARBAGE = 0xA5


class Case:
    """One golden case, `expected/<case>/tp<N>`: its fixture and the flags vLLM ran with."""

    def __init__(self, cname, tp_dir):
        self.name = f"{cname}/{tp_dir}"
        self.dir = os.path.join(EXPECTED, cname, tp_dir)
        self.tp = int(tp_dir[2:])
        parts = cname.split("__")
        fixture = parts.pop(0)
        # `llama_gqa__fp8_block` was made from the fixture `llama_gqa_fp8_block` (golden README).
        if parts and parts[0].startswith("fp8_"):
            fixture += "_" + parts.pop(0)
        self.fixture = os.path.join(FIXTURES, fixture)
        self.kw = {}
        self.pp = 1
        for p in parts:
            if p.startswith("dtype_"):
                self.kw["dtype"] = p[len("dtype_"):]
            elif p == "ep":
                self.kw["expert_parallel"] = True
            elif re.fullmatch(r"pp\d+", p):
                self.pp = int(p[2:])
                self.kw["pp"] = self.pp
            elif p == "lmonly":
                self.kw["language_model_only"] = True
            elif p == "mmdata":
                self.kw["mm_encoder_tp_mode"] = "data"
            elif p.startswith("moe_"):
                self.kw["moe_backend"] = p[len("moe_"):]
            elif p.startswith("maxsize_"):
                pass  # a part size limit: what vLLM wrote, not what a rank holds
            else:
                raise AssertionError(f"unknown golden case suffix {p} in {cname}")
        # A Mistral-native fixture: read as `vllm serve --config-format mistral` reads it.
        if os.path.isfile(os.path.join(self.fixture, "params.json")) and not os.path.exists(
            os.path.join(self.fixture, "config.json")
        ):
            self.kw["config_format"] = "mistral"
        backend = self.kw.get("moe_backend") or oracle_moe_backend(self.dir)
        if backend:
            self.kw["moe_backend"] = backend
        self.digests = os.path.isfile(os.path.join(self.dir, "tensors.json"))

    def rank_prefix(self, rank):
        if self.pp > 1:
            return f"model-pp-{rank // self.tp}-tp-{rank % self.tp}-part-"
        return f"model-rank-{rank}-part-"

    def vllm_rank(self, rank):
        """{name: (dtype, shape, bytes or None, sha256 or None)} of what vLLM held on `rank`."""
        prefix = self.rank_prefix(rank)
        held = {}
        if self.digests:
            with open(os.path.join(self.dir, "tensors.json")) as f:
                files = json.load(f)["files"]
            for fname in sorted(files):
                if is_part(fname, prefix):
                    for t in files[fname]["tensors"]:
                        held[t["name"]] = (t["dtype"], tuple(t["shape"]), None, t["sha256"])
        else:
            for fname in sorted(os.listdir(self.dir)):
                if is_part(fname, prefix):
                    for name, t in read_safetensors(os.path.join(self.dir, fname)).items():
                        held[name] = (t[0], t[1], t[2], None)
        assert held, f"{self.name}: no files for rank {rank}"
        return held


    def computed_f32(self, rank):
        """{name: [u32 bits]} of the F32 tensors vLLM computed on its device (Mamba2's `A` =
        -exp(A_log)), which a digest keeps as values: compared within 1 ulp (vllm-spec §13.4)."""
        if not self.digests:
            return {}
        with open(os.path.join(self.dir, "tensors.json")) as f:
            files = json.load(f)["files"]
        return {
            t["name"]: [int(b, 16) for b in t["f32_bits"]]
            for fname in files if is_part(fname, self.rank_prefix(rank))
            for t in files[fname]["tensors"] if "f32_bits" in t
        }


def same_as_vllm(got, data, sha, computed_bits=None):
    """Whether a loaded tensor's bytes `got` are what vLLM held: its bytes `data`, or their
    SHA-256 `sha`, or for a computed F32 (`Case.computed_f32`) its values within 1 ulp."""
    if computed_bits is not None:
        return within_one_ulp(got, computed_bits)
    return got == data if sha is None else hashlib.sha256(got).hexdigest() == sha


def within_one_ulp(got, want_bits):
    """F32 bytes `got` against vLLM's values as bits: each element at most 1 ulp away."""
    def ordered(u):
        return u if u < 1 << 31 else (1 << 31) - u
    got_bits = struct.unpack(f"<{len(got) // 4}I", got)
    return len(got_bits) == len(want_bits) and all(
        abs(ordered(g) - ordered(w)) <= 1 for g, w in zip(got_bits, want_bits))


def is_part(fname, prefix):
    return re.fullmatch(re.escape(prefix) + r"\d+\.safetensors", fname) is not None


def oracle_moe_backend(case_dir):
    """The MXFP4 or NVFP4 MoE backend the oracle pinned (its `patches`), as golden.rs reads it."""
    try:
        with open(os.path.join(case_dir, "oracle_meta_rank0.json")) as f:
            patches = json.load(f).get("patches") or []
    except FileNotFoundError:
        return None
    for p in patches:
        if not isinstance(p, str):
            continue
        marks = [m for m in ("select_mxfp4_moe_backend ->", "select_nvfp4_moe_backend ->") if m in p]
        if not marks:
            continue
        rest = p.split(marks[0], 1)[1]
        for group in rest.split("(")[1:]:
            if "," not in group:
                continue
            name = group.split(",", 1)[0]
            if name and all(c.isupper() or c == "_" for c in name):
                return name.lower()
    return None


def read_safetensors(path):
    """{name: (dtype, shape, bytes)} of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], tuple(t["shape"]), data[base + a:base + b])
    return out


def golden_cases():
    cases = []
    for cname in sorted(os.listdir(EXPECTED)):
        for tp_dir in sorted(os.listdir(os.path.join(EXPECTED, cname))):
            cases.append(Case(cname, tp_dir))
    return cases


CASES = golden_cases()


# vLLM's rank files' dtypes as torch names them (safetensors' torch loader): the witness for
# `Tensor.torch_dtype`, which wload computes (Dtype::torch_name) and the vLLM plugin relies on.
TORCH_NAMES = {
    "BF16": "bfloat16",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "I8": "int8",
    "U8": "uint8",
    "I16": "int16",
    "I32": "int32",
    "I64": "int64",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
}


def load_rank(p, rank):
    """Rank `rank` of plan `p` loaded into fresh numpy buffers full of garbage."""
    bufs = {t.name: np.full(t.nbytes, GARBAGE, dtype=np.uint8) for t in p.tensors(rank)}
    report = p.load(rank, {n: b.ctypes.data for n, b in bufs.items()})
    assert report.bytes == sum(b.nbytes for b in bufs.values())
    assert report.seconds >= 0
    return bufs


def compare(case, p, label):
    """Every rank of `p`, loaded, against what vLLM held; the differences, one line each."""
    failures = []
    assert p.world_size == case.tp * case.pp, f"{label}: world size {p.world_size}"
    for rank in range(p.world_size):
        want = case.vllm_rank(rank)
        tensors = {t.name: t for t in p.tensors(rank)}
        for n in sorted(set(want) - set(tensors)):
            failures.append(f"{label}: rank {rank}: '{n}' missing (vLLM has it)")
        for n in sorted(set(tensors) - set(want)):
            failures.append(f"{label}: rank {rank}: '{n}' unexpected (vLLM has no such tensor)")
        bufs = load_rank(p, rank)
        computed = case.computed_f32(rank)
        for name, (dtype, shape, data, sha) in want.items():
            t = tensors.get(name)
            if t is None:
                continue
            if (t.dtype, tuple(t.shape)) != (dtype, shape):
                failures.append(
                    f"{label}: rank {rank}: '{name}': {t.dtype} {t.shape}, vLLM {dtype} {shape}"
                )
                continue
            if t.torch_dtype != TORCH_NAMES[dtype]:
                failures.append(f"{label}: rank {rank}: '{name}': torch_dtype {t.torch_dtype}")
            got = bufs[name].tobytes()
            if not same_as_vllm(got, data, sha, computed.get(name)):
                failures.append(f"{label}: rank {rank}: '{name}': bytes differ from vLLM's")
    return failures


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fixture_loads_exactly_what_vllm_held(case):
    p = wload.plan(case.fixture, tp=case.tp, **case.kw)
    assert p.kind == "checkpoint"
    failures = compare(case, p, case.name)
    assert not failures, "\n".join(failures)


# vLLM's own rank files, where the case keeps them (a digest case has only their SHA-256: the
# Rust suite rebuilds those folders from wload's output, tests/it/support/digests.rs).
FOLDER_CASES = [c for c in CASES if not c.digests]


@pytest.mark.parametrize("case", FOLDER_CASES, ids=[c.name for c in FOLDER_CASES])
def test_vllm_folder_loads_as_pre_sharded(case):
    p = wload.plan(case.dir, tp=case.tp, **case.kw)
    assert p.kind == "pre-sharded"
    assert p.warnings == []
    failures = compare(case, p, case.name + " (vLLM's folder)")
    assert not failures, "\n".join(failures)


def test_every_golden_case_is_enumerated():
    """The case list is every folder (as the Rust suite's `every_golden_folder_has_an_entry`)."""
    folders = {
        f"{c}/{t}" for c in os.listdir(EXPECTED) for t in os.listdir(os.path.join(EXPECTED, c))
    }
    assert {c.name for c in CASES} == folders
    assert len(CASES) >= 30
    assert any(c.digests for c in CASES) and FOLDER_CASES


GQA = os.path.join(FIXTURES, "llama_gqa")


def test_plan_properties():
    p = wload.plan(GQA, tp=2)
    assert (p.tp, p.pp, p.world_size) == (2, 1, 2)
    assert p.dtype == "BF16" and p.architecture == "LlamaForCausalLM"
    assert p.root == os.path.realpath(GQA) or p.root == GQA
    t = p.tensors(1)[0]
    assert isinstance(t.shape, tuple) and all(isinstance(d, int) for d in t.shape)
    assert t.nbytes == int(np.prod(t.shape)) * 2


# `Plan.load`'s report: its attributes, which are also its keys (it was a dict of them), in order;
# the CUDA figures only for a load onto a GPU (stub_gpu.py checks those).
REPORT_KEYS = [
    "rank", "device", "tensors", "bytes", "seconds", "gbps", "io", "io_why", "cache_s",
    "transfer_s", "sync_s", "read_s", "convert_s", "copy_s", "bytes_read", "direct_read_bytes",
    "direct_read_s", "host_copy_bytes", "host_copy_s",
]
CUDA_REPORT_KEYS = ["device_copy_s", "staging_wait_s", "staging_bytes"]


def test_the_load_report_is_typed_and_reads_as_the_dict_it_was():
    p = wload.plan(GQA, tp=2)
    bufs = {t.name: np.full(t.nbytes, GARBAGE, np.uint8) for t in p.tensors(1)}
    r = p.load(1, {n: b.ctypes.data for n, b in bufs.items()}, io="buffered")
    assert isinstance(r, wload.LoadReport)
    assert (r.rank, r.device, r.io, r.tensors) == (1, "cpu", "buffered", len(bufs))
    assert r.bytes == sum(b.nbytes for b in bufs.values()) and r.bytes_read > 0
    floats = [k for k in REPORT_KEYS if k.endswith("_s")] + ["seconds", "gbps"]
    for k in REPORT_KEYS:
        want = str if k in ("device", "io", "io_why") else float if k in floats else int
        assert type(getattr(r, k)) is want, k
    assert all(getattr(r, k) is None for k in CUDA_REPORT_KEYS)
    # The mapping: the same names and values, the CUDA figures absent as keys on the CPU.
    assert list(r) == r.keys() == REPORT_KEYS and len(r) == len(REPORT_KEYS)
    assert r.values() == [getattr(r, k) for k in REPORT_KEYS]
    assert r.items() == list(zip(REPORT_KEYS, r.values()))
    assert r.to_dict() == dict(r) == dict(r.items())
    assert json.loads(json.dumps(r.to_dict())) == r.to_dict()
    assert all(r[k] == getattr(r, k) and k in r for k in REPORT_KEYS)
    assert "device_copy_s" not in r and 3 not in r
    with pytest.raises(KeyError, match="staging_bytes"):
        r["staging_bytes"]
    assert r.get("bytes") == r.bytes and r.get("staging_bytes") is None
    assert r.get("staging_bytes", 0) == 0
    # Frozen, as Plan and Tensor are.
    with pytest.raises(AttributeError):
        r.bytes = 0
    assert repr(r).startswith("LoadReport(rank=1, device='cpu', tensors=")


def test_a_refused_plan_raises_plan_error_with_every_problem():
    with pytest.raises(wload.PlanError) as e:
        wload.plan(GQA, tp=3)
    assert isinstance(e.value, ValueError)
    msg = str(e.value)
    assert "num_attention_heads (8) is not divisible by tp (3)" in msg
    assert "fix:" in msg
    problems = e.value.problems
    assert len(problems) >= 2
    for prob in problems:
        assert set(prob) >= {"message", "fix", "file", "tensor", "parameter", "shape",
                             "expected_shape"}
        assert prob["message"] in msg
    # The fixes name the keywords the caller passed, not the command line's flags.
    assert "--tp" not in msg, msg
    assert "choose a tp that divides 8" in msg, msg
    assert all("--tp" not in (p["fix"] or "") for p in problems), problems


def test_plan_error_flags_read_as_keywords():
    with pytest.raises(wload.PlanError) as e:
        wload.plan(GQA, tp=2, pp=3)
    msg = str(e.value)
    assert "--pp" not in msg and "--tp" not in msg, msg


def test_a_missing_source_is_a_plan_error_naming_it(tmp_path):
    with pytest.raises(wload.PlanError, match="nope"):
        wload.plan(str(tmp_path / "nope"), tp=1)


def test_bad_options_are_refused():
    with pytest.raises(wload.PlanError, match="dtype"):
        wload.plan(GQA, tp=2, dtype="float8")
    with pytest.raises(ValueError, match="rank 2 is not in the plan"):
        wload.plan(GQA, tp=2).tensors(2)


def test_destinations_must_match_the_rank_exactly():
    p = wload.plan(GQA, tp=2)
    names = [t.name for t in p.tensors(0)]
    bufs = {t.name: np.full(t.nbytes, GARBAGE, np.uint8) for t in p.tensors(0)}
    dests = {n: b.ctypes.data for n, b in bufs.items()}
    missing = dict(dests)
    del missing[names[3]]
    with pytest.raises(ValueError, match=re.escape(f"'{names[3]}'")):
        p.load(0, missing)
    with pytest.raises(ValueError, match="'no.such.tensor'"):
        p.load(0, {**dests, "no.such.tensor": dests[names[0]]})
    with pytest.raises(ValueError, match="expected \"cpu\", \"cuda\" or \"cuda:N\""):
        p.load(0, dests, device="gpu")
    with pytest.raises(ValueError, match="disagree"):
        p.load(0, dests, device="cuda:1", device_index=0)
    with pytest.raises(ValueError, match="for device=\"cuda\""):
        p.load(0, dests, stream=7)
    # Nothing was written by the refused calls.
    assert all((b == GARBAGE).all() for b in bufs.values())
    p.load(0, dests)
    assert not all((b == GARBAGE).all() for b in bufs.values())


def test_a_failed_load_raises_wload_error(tmp_path):
    src = tmp_path / "gqa"
    shutil.copytree(GQA, src)
    p = wload.plan(str(src), tp=1)
    # A weight file cut short after planning: the load must fail, and say so.
    part = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))[0]
    with open(src / part, "r+b") as f:
        f.truncate(os.path.getsize(src / part) // 2)
    bufs = {t.name: np.zeros(t.nbytes, np.uint8) for t in p.tensors(0)}
    with pytest.raises(wload.WloadError) as e:
        p.load(0, {n: b.ctypes.data for n, b in bufs.items()})
    assert isinstance(e.value, RuntimeError)
    assert "loading rank 0 failed" in str(e.value) and part in str(e.value)


def test_a_source_gone_before_the_load_writes_nothing(tmp_path):
    src = tmp_path / "gqa"
    shutil.copytree(GQA, src)
    p = wload.plan(str(src), tp=1)
    part = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))[0]
    os.remove(src / part)
    bufs = {t.name: np.full(t.nbytes, GARBAGE, np.uint8) for t in p.tensors(0)}
    with pytest.raises(wload.WloadError) as e:
        p.load(0, {n: b.ctypes.data for n, b in bufs.items()}, io="buffered")
    assert part in str(e.value) and "nothing was written" in str(e.value)
    assert all((b == GARBAGE).all() for b in bufs.values())


def test_io_modes_give_the_same_bytes():
    p = wload.plan(GQA, tp=2)
    got = []
    for io in ["buffered", "direct", "mmap"]:
        bufs = {t.name: np.full(t.nbytes, GARBAGE, np.uint8) for t in p.tensors(1)}
        r = p.load(1, {n: b.ctypes.data for n, b in bufs.items()}, io=io)
        assert r.io == io
        got.append({n: b.tobytes() for n, b in bufs.items()})
    assert got[0] == got[1] == got[2]


def test_options_reach_the_planner():
    # VLLM_PP_LAYER_PARTITION, as a list or vLLM's string.
    p = wload.plan(GQA, tp=1, pp=2, pp_partition=[1, 1])
    assert (p.pp, p.world_size) == (2, 2)
    with pytest.raises(wload.PlanError, match=r"sum\(partitions\)=8 does not match"):
        wload.plan(GQA, tp=1, pp=2, pp_partition="3,5")
    # --hf-overrides, as a dict: the shapes no longer fit, and every tensor says so.
    with pytest.raises(wload.PlanError) as e:
        wload.plan(GQA, tp=2, hf_overrides={"num_attention_heads": 6})
    assert any(pr["expected_shape"] and pr["tensor"] for pr in e.value.problems)
    with pytest.raises(wload.PlanError, match="expected a JSON object"):
        wload.plan(GQA, tp=2, hf_overrides="[1]")


def test_a_pre_sharded_folder_gives_its_own_layout():
    folder = os.path.join(EXPECTED, "llama_gqa", "tp2")
    p = wload.plan(folder, tp=None, pp=None, dtype=None)
    assert (p.kind, p.tp, p.pp) == ("pre-sharded", 2, 1)
    assert "--tp 2" in p.note
    with pytest.raises(wload.PlanError):
        wload.plan(folder, tp=4)
