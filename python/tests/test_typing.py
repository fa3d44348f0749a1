"""The package's types, as typed Python packages ship them (safetensors, pydantic-core): the stubs
of the Rust extension (`wload/_wload.pyi`) and the `py.typed` marker are installed, agree with the
built module (`mypy.stubtest`: every name, parameter, default and kind; docstrings too), and a
typed use of the package passes `mypy --strict` (typed/usage.py, whose `type: ignore`s are the
misuses the stubs must reject).

mypy is installed with the tests (README's test command): nothing here is skipped.

    python -m pytest -q python/tests/test_typing.py   (after `pip install ./python numpy pytest mypy`)
"""

import ast
import inspect
import os
import shutil
import subprocess
import sys

import wload

HERE = os.path.dirname(os.path.abspath(__file__))
# The mypy configuration of the package ([tool.mypy]: strict; vLLM and torch not installed).
CONFIG = os.path.join(HERE, "..", "pyproject.toml")
ALLOWLIST = os.path.join(HERE, "typed", "stubtest-allowlist.txt")
USAGE = os.path.join(HERE, "typed", "usage.py")
INSTALLED = os.path.dirname(wload.__file__)


def run(args, cwd, env=None):
    """`python -m <args>` in `cwd` (not the repository: `wload` must be the installed package,
    whose stubs were in the wheel), with its output for the assertion message."""
    r = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


def stubtest(tmp_path, env=None):
    return run(["mypy.stubtest", "wload", "--strict-type-check-only", "--mypy-config-file", CONFIG,
                "--allowlist", ALLOWLIST], tmp_path, env)


def test_the_stubs_and_marker_are_installed_with_the_package():
    assert os.path.isfile(os.path.join(INSTALLED, "_wload.pyi"))
    assert os.path.isfile(os.path.join(INSTALLED, "py.typed"))


def test_the_stubs_agree_with_the_built_module(tmp_path):
    rc, out = stubtest(tmp_path)
    assert rc == 0, out


def test_stubtest_refuses_a_stub_that_disagrees(tmp_path):
    """The check above is live: a stub naming a parameter differently from the module fails."""
    stubs = tmp_path / "stubs" / "wload"
    shutil.copytree(INSTALLED, stubs, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    text = (stubs / "_wload.pyi").read_text()
    good = "def tensors(self, rank: int) -> list[Tensor]:"
    assert good in text
    (stubs / "_wload.pyi").write_text(text.replace(good, good.replace("rank", "tp_rank")))
    # MYPYPATH comes before site-packages: mypy reads these stubs, Python imports the module.
    rc, out = stubtest(tmp_path, {**os.environ, "MYPYPATH": str(tmp_path / "stubs")})
    assert rc != 0 and "wload._wload.Plan.tensors" in out and "tp_rank" in out, out


def test_a_typed_use_passes_mypy_strict(tmp_path):
    rc, out = run(["mypy", "--config-file", CONFIG, "--cache-dir", str(tmp_path / "cache"),
                   USAGE], tmp_path)
    assert rc == 0, out


def test_the_package_itself_passes_mypy_strict(tmp_path):
    """The vLLM plugin included: py.typed promises every module of the package is typed."""
    rc, out = run(["mypy", "--config-file", CONFIG, "--cache-dir", str(tmp_path / "cache"),
                   "-p", "wload"], tmp_path)
    assert rc == 0, out


def _stub_docs():
    """Each documented thing of the stub, by dotted name: (name, docstring or None), for the
    classes the module has and their methods and properties (overloads and typing-only classes
    left out: they have no one runtime object)."""
    with open(os.path.join(INSTALLED, "_wload.pyi")) as f:
        tree = ast.parse(f.read())

    def decorators(node):
        return {d.id if isinstance(d, ast.Name) else getattr(d, "attr", "") for d in
                node.decorator_list}

    out = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out.append((node.name, ast.get_docstring(node)))
        elif isinstance(node, ast.ClassDef) and "type_check_only" not in decorators(node):
            out.append((node.name, ast.get_docstring(node)))
            for m in node.body:
                if isinstance(m, ast.FunctionDef) and "overload" not in decorators(m):
                    out.append((f"{node.name}.{m.name}", ast.get_docstring(m)))
    return out


def _runtime_doc(dotted):
    obj = wload._wload
    for part in dotted.split("."):
        obj = getattr(obj, part)
    doc = obj.__doc__
    # Python's own slot methods (__len__, ...) carry Python's docstring, not the module's.
    if doc is None or dotted.split(".")[-1].startswith("__"):
        return None
    return inspect.cleandoc(doc)


def test_the_stubs_carry_the_modules_docstrings():
    """A docstring in the stub is the module's own (help() and an editor say the same), and
    every docstring the module has is in the stub."""
    docs = _stub_docs()
    assert len(docs) > 40
    differ = []
    for name, stub in docs:
        if name.split(".")[-1].startswith("__"):
            continue
        want = _runtime_doc(name)
        if " ".join((stub or "").split()) != " ".join((want or "").split()):
            differ.append(f"{name}:\n  stub:    {stub!r}\n  runtime: {want!r}")
    assert not differ, "\n".join(differ)
