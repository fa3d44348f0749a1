"""One node reads a local checkpoint from storage once, however its ranks are spread over
processes (issue 41): every rank planned and loaded by its own process, all at once, as the vLLM
plugin does, from a cold page cache; the bytes all of them caused to be read from storage
(/proc/self/io `read_bytes`) must add up to at most 1.05 times the checkpoint's files.

A row-parallel weight (o_proj, down_proj) gives each rank a column slice of every row: read
around the page cache (O_DIRECT), every rank would read the whole tensor from storage (1.27x at
TP 2, 1.81x at TP 4 on this checkpoint before the fix). The harness is bench/plugin_reads.py.
"""

import importlib.util
import os

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_spec = importlib.util.spec_from_file_location(
    "plugin_reads", os.path.join(REPO, "bench", "plugin_reads.py"))
assert _spec is not None and _spec.loader is not None
plugin_reads = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plugin_reads)

# Storage reads of one node over the checkpoint's bytes, all ranks together.
LIMIT = 1.05


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A Llama-shaped random bf16 checkpoint of about 330 MiB, on storage whose reads are
    counted (checked: a tmpfs fails here loudly rather than pass with nothing read)."""
    folder = str(tmp_path_factory.mktemp("node_reads"))
    plugin_reads.generate(folder)
    plugin_reads.check_accounting(plugin_reads.checkpoint_files(folder))
    return folder


@pytest.mark.parametrize("tp", [2, 4])
def test_a_node_reads_each_byte_once(checkpoint, tp):
    s = plugin_reads.summary(checkpoint, tp, plugin_reads.measure(checkpoint, tp))
    per_rank = ", ".join(f"rank {r['rank']}: {r['read_bytes']}" for r in s["ranks"])
    assert s["ratio"] <= LIMIT, (
        f"tp {tp}: the ranks read {s['read_bytes']} bytes from storage for a "
        f"{s['checkpoint_bytes']}-byte checkpoint ({s['ratio']:.3f}x, at most {LIMIT}x): {per_rank}")
    # Every rank loaded its share, cold (so direct), and its report says what it read through
    # the page cache instead.
    for r in s["ranks"]:
        assert r["bytes"] > 0 and r["io"] == "direct", r
        assert "that ranks outside this run read too" in r["io_why"], r
