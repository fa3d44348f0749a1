"""No Rust panic reaches Python from any argument: every public function, method and property of
wload is called with hostile Python objects in every argument position, and may only raise what
python/README.md documents (PlanError and ValueError for bad values, TypeError for a value of the
wrong type, WloadError) or the caller's own exception, raised by its own object. pyo3's
PanicException derives from BaseException, so everything is caught and checked.

The surface is introspected: a new public function, method or property fails
`test_every_public_callable_is_covered` until a battery covers it here.
"""

import math
import os

import numpy as np
import pytest

import wload

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GQA = os.path.join(REPO, "tests", "data", "golden", "fixtures", "llama_gqa")


class Hostile(Exception):
    """Raised by the hostile objects themselves: the caller's own exception may go through."""


ALLOWED = (wload.PlanError, wload.WloadError, ValueError, TypeError, Hostile)


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    # A hostile string may look like a hub repo id: nothing may be fetched from the network.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


def _raise(*_args, **_kw):
    raise Hostile("hostile")


class RaisesEverywhere:
    """Every conversion protocol raises."""

    __index__ = __int__ = __float__ = __str__ = __repr__ = __len__ = __iter__ = _raise
    __fspath__ = __bool__ = __getitem__ = __hash__ = keys = _raise


class Mutates:
    """Converting it (`__index__`, `__int__`, `__str__`, `__fspath__`, `__len__`, `__iter__`)
    changes the dict it was found in, as a hostile destination or option can."""

    def __init__(self, d=None):
        self.d = d if d is not None else {}

    def _mutate(self):
        self.d.clear()
        for i in range(64):
            self.d[f"added.{i}"] = i

    def __index__(self):
        self._mutate()
        # Not an address wload may write to: 0 is refused for a tensor with bytes.
        return 0

    __int__ = __index__

    def __str__(self):
        self._mutate()
        return "mutated"

    def __fspath__(self):
        self._mutate()
        return "/nonexistent/mutated"

    def __len__(self):
        self._mutate()
        return 3

    def __iter__(self):
        self._mutate()
        return iter([1, 2])


class LyingDict(dict):
    """A dict subclass whose Python-level views lie about what it holds."""

    def __len__(self):
        return 10**9

    def keys(self):
        return ["no.such.tensor"]

    def items(self):
        raise Hostile("items")

    def __iter__(self):
        raise Hostile("iter")


class NegativeLen:
    def __len__(self):
        return -1

    def __iter__(self):
        return iter([])


class HugeIndex:
    def __index__(self):
        return 2**200


class StrSub(str):
    def __str__(self):
        raise Hostile("str")


def battery():
    """Hostile values, each a fresh object per call (some mutate state)."""
    return [
        None, True, False, -1, 2**64, 2**70, -(2**70), math.nan, math.inf, -math.inf, 0.5,
        "", "x" * 100_000, "a\0b", "\udcff", "cuda:" + "9" * 30, "cuda:-1", b"bytes",
        bytearray(b"ba"), [], [-1, 3], [True, False], [2**70], (1.5,), {}, {"a": math.nan},
        {1: 2}, set(), object(), RaisesEverywhere(), Mutates(), LyingDict(a=1), NegativeLen(),
        HugeIndex(), StrSub("llama"), np.int64(-1), np.uint64(2**64 - 1), np.bool_(True),
        np.float64("nan"), np.array([1, 2]),
    ]


def r(v):
    """A short label for `v`, whose own repr may raise."""
    try:
        return repr(v)[:60]
    except Hostile:
        return f"<{type(v).__name__}>"


def check(call, label, allowed=ALLOWED):
    """`call()` may succeed or raise an allowed exception; anything else (a PanicException, an
    OverflowError, a SystemError) fails naming the call."""
    try:
        call()
    except allowed:
        pass
    except BaseException as e:  # noqa: BLE001 - PanicException is a BaseException
        pytest.fail(f"{label} raised {type(e).__module__}.{type(e).__name__}: {e!r}"[:2000])


@pytest.fixture(scope="module")
def plan():
    return wload.plan(GQA, tp=2)


def dests_for(p, rank=0):
    """Valid destinations for `rank`, with the buffers kept alive by the caller."""
    bufs = {t.name: np.zeros(t.nbytes, np.uint8) for t in p.tensors(rank)}
    return bufs, {n: b.ctypes.data for n, b in bufs.items()}


PLAN_ARGS = [
    "source", "tp", "pp", "expert_parallel", "dtype", "hf_overrides", "revision", "download_dir",
    "language_model_only", "mm_encoder_tp_mode", "pp_partition", "config_format", "moe_backend",
    "load_format", "mapping",
]
FETCH_ARGS = ["source", "revision", "download_dir", "config_format", "load_format"]
LOAD_ARGS = ["rank", "dests", "device", "device_index", "stream", "io"]
PLAN_PROPS = ["tp", "pp", "world_size", "expert_parallel", "dtype", "architecture", "root", "kind",
              "warnings", "note"]
TENSOR_PROPS = ["name", "dtype", "torch_dtype", "shape", "nbytes"]
REPORT_PROPS = [
    "rank", "device", "tensors", "bytes", "seconds", "gbps", "io", "io_why", "cache_s",
    "transfer_s", "sync_s", "read_s", "convert_s", "copy_s", "bytes_read", "direct_read_bytes",
    "direct_read_s", "host_copy_bytes", "host_copy_s", "device_copy_s", "staging_wait_s",
    "staging_bytes",
]
REPORT_METHODS = ["keys", "values", "items", "get", "to_dict"]

COVERED = (
    {"plan", "fetch", "Plan", "Tensor", "LoadReport", "Plan.tensors", "Plan.load", "Plan.__repr__",
     "Tensor.__repr__", "LoadReport.__repr__"}
    | {f"Plan.{a}" for a in PLAN_PROPS}
    | {f"Tensor.{a}" for a in TENSOR_PROPS}
    | {f"LoadReport.{a}" for a in REPORT_PROPS + REPORT_METHODS}
    | {"main"}
)


def public_surface():
    """Every public callable of the module and every public method or property of its classes
    (the exceptions excepted: they are Python's own classes)."""
    names = set()
    for n in dir(wload._wload):
        obj = getattr(wload._wload, n)
        if n.startswith("_") or (isinstance(obj, type) and issubclass(obj, BaseException)):
            continue
        if callable(obj):
            names.add(n)
        if isinstance(obj, type):
            for a, v in vars(obj).items():
                if not a.startswith("_") or (a == "__repr__" and callable(v)):
                    names.add(f"{n}.{a}")
    return names


def test_every_public_callable_is_covered():
    assert public_surface() == COVERED
    assert set(wload.__all__) - {"__version__", "WloadError", "PlanError"} <= COVERED


def test_main_with_a_hostile_argument(capfd):
    """`_wload.main`, the console script's body, with a hostile argv and a hostile argument in
    one: a TypeError, or the command's usage error (exit 2, on stderr); no value here is a command
    line that runs a command."""
    for v in battery():
        check(lambda: wload._wload.main(v), f"main({r(v)})")
        check(lambda: wload._wload.main(["wload", v]), f"main(['wload', {r(v)}])")
    assert wload._wload.main(["wload", "no-such-command"]) == 2
    assert "no-such-command" in capfd.readouterr().err


@pytest.mark.parametrize("arg", PLAN_ARGS)
def test_plan_with_a_hostile_argument(arg):
    for v in battery():
        check(lambda: wload.plan(**{"source": GQA, "tp": 2, arg: v}), f"plan({arg}={r(v)})")
    # Positionally, as the signature orders them.
    i = PLAN_ARGS.index(arg)
    for v in battery():
        args = [GQA, 2, 1, False, "auto", None, None, None, False, "weights", None, "auto", None,
                "auto", None]
        args[i] = v
        check(lambda: wload.plan(*args), f"plan(<{arg} positional>={r(v)})")


@pytest.mark.parametrize("arg", FETCH_ARGS)
def test_fetch_with_a_hostile_argument(arg):
    for v in battery():
        check(lambda: wload.fetch(**{"source": GQA, arg: v}), f"fetch({arg}={r(v)})")
    i = FETCH_ARGS.index(arg)
    for v in battery():
        args = [GQA, None, None, "auto", "auto"]
        args[i] = v
        check(lambda: wload.fetch(*args), f"fetch(<{arg} positional>={r(v)})")


def test_fetch_gives_a_local_folder_as_it_is():
    assert wload.fetch(GQA) == str(GQA)


@pytest.mark.parametrize("arg", LOAD_ARGS)
def test_load_with_a_hostile_argument(plan, arg):
    for v in battery():
        bufs, dests = dests_for(plan)
        kw = {"rank": 0, "dests": dests, arg: v}
        check(lambda: plan.load(**kw), f"Plan.load({arg}={r(v)})")
        del bufs


def test_load_with_hostile_destinations(plan):
    names = [t.name for t in plan.tensors(0)]
    for v in battery():
        # As the address of one tensor, and as one more key.
        bufs, dests = dests_for(plan)
        dests[names[0]] = v
        check(lambda: plan.load(0, dests), f"Plan.load(dests[name]={r(v)})")
        bufs, dests = dests_for(plan)
        try:
            dests[v] = dests[names[0]]
        except (TypeError, Hostile):
            continue  # not a key Python allows
        check(lambda: plan.load(0, dests), f"Plan.load(dests[{r(v)}]=addr)")
        del bufs
    # An address whose conversion mutates the very dict being read.
    bufs, dests = dests_for(plan)
    dests[names[1]] = Mutates(dests)
    check(lambda: plan.load(0, dests), "Plan.load(a destination that mutates the dict)")
    # A dict subclass whose own views lie.
    bufs, dests = dests_for(plan)
    check(lambda: plan.load(0, LyingDict(dests)), "Plan.load(LyingDict)")


def test_a_bool_is_not_an_address(plan):
    bufs, dests = dests_for(plan)
    names = [t.name for t in plan.tensors(0)]
    dests[names[0]] = True
    with pytest.raises(TypeError, match="bool"):
        plan.load(0, dests)
    assert all((b == 0).all() for b in bufs.values())


def test_a_destination_that_mutates_the_dict_is_refused_not_a_panic(plan):
    bufs, dests = dests_for(plan)
    names = [t.name for t in plan.tensors(0)]
    dests[names[0]] = Mutates(dests)
    with pytest.raises(ValueError):
        plan.load(0, dests)


def test_out_of_range_options_are_plan_errors():
    for kw in [{"pp_partition": [-1, 3]}, {"pp_partition": [True, 1]}, {"tp": -1},
               {"pp": 2**70}]:
        with pytest.raises(wload.PlanError):
            wload.plan(GQA, **kw)


def test_out_of_range_ranks_are_value_errors(plan):
    with pytest.raises(ValueError, match="rank -1 is not in the plan"):
        plan.tensors(-1)
    with pytest.raises(TypeError):
        plan.tensors(True)


def test_tensors_and_properties_with_hostile_values(plan):
    for v in battery():
        check(lambda: plan.tensors(v), f"Plan.tensors({r(v)})")
        check(lambda: plan.tensors(rank=v), f"Plan.tensors(rank={r(v)})")
        check(lambda: plan.tensors(0, v), f"Plan.tensors(0, {r(v)})")
    for a in PLAN_PROPS:
        check(lambda: getattr(plan, a), f"Plan.{a}")
        # Read-only: Python's AttributeError, as for any read-only attribute.
        check(lambda: setattr(plan, a, RaisesEverywhere()), f"Plan.{a} = hostile",
              (AttributeError,))
    check(lambda: repr(plan), "repr(Plan)")
    t = plan.tensors(0)[0]
    for a in TENSOR_PROPS:
        check(lambda: getattr(t, a), f"Tensor.{a}")
        check(lambda: setattr(t, a, RaisesEverywhere()), f"Tensor.{a} = hostile",
              (AttributeError,))
    check(lambda: repr(t), "repr(Tensor)")
    for v in battery():
        check(lambda: wload.Plan(v), f"Plan({r(v)})")
        check(lambda: wload.Tensor(v), f"Tensor({r(v)})")
        check(lambda: wload.LoadReport(v), f"LoadReport({r(v)})")


def test_the_load_report_with_hostile_keys(plan):
    bufs, dests = dests_for(plan)
    report = plan.load(0, dests)
    # A missing key is a KeyError, as a dict's; a key that is no str is a TypeError (or not in it).
    allowed = (KeyError, TypeError, Hostile)
    for v in battery():
        check(lambda: report[v], f"LoadReport[{r(v)}]", allowed)
        check(lambda: v in report, f"{r(v)} in LoadReport", allowed)
        check(lambda: report.get(v), f"LoadReport.get({r(v)})", allowed)
        check(lambda: report.get("bytes", v), f"LoadReport.get('bytes', {r(v)})", allowed)
        check(lambda: report.get(v, v), f"LoadReport.get({r(v)}, {r(v)})", allowed)
        for m in REPORT_METHODS:
            check(lambda: getattr(report, m)(v), f"LoadReport.{m}({r(v)})", allowed)
    for a in REPORT_PROPS:
        check(lambda: getattr(report, a), f"LoadReport.{a}")
        check(lambda: setattr(report, a, RaisesEverywhere()), f"LoadReport.{a} = hostile",
              (AttributeError,))
    for call in [len, list, iter, repr, dict]:
        check(lambda: call(report), f"{call.__name__}(LoadReport)")
    del bufs
