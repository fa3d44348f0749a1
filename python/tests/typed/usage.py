"""A typed use of wload, checked by `mypy --strict` (python/tests/test_typing.py), never run.

Each `# type: ignore[code]` marks a misuse the stubs must reject: `--strict` warns about an
ignore that nothing needed, so a stub that grew vaguer (an `Any`, a lost attribute) fails too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import wload

if TYPE_CHECKING:
    from wload._wload import LoadReportDict, Problem


def plan_and_load(folder: Path, addresses: dict[str, int]) -> float:
    p: wload.Plan = wload.plan(folder, tp=2, pp=None, dtype=None, pp_partition=[3, 5],
                               hf_overrides={"max_position_embeddings": 4096})
    tp: int = p.tp
    kind: Literal["checkpoint", "pre-sharded"] = p.kind
    note: str | None = p.note
    warnings: list[str] = p.warnings
    for t in p.tensors(0):
        name: str = t.name
        dtype: str = t.dtype
        torch_dtype: str | None = t.torch_dtype
        shape: tuple[int, ...] = t.shape
        nbytes: int = t.nbytes
    report: wload.LoadReport = p.load(0, addresses, device="cuda:0", stream=0, io="direct")
    io: Literal["buffered", "direct", "mmap"] = report.io
    staging: int | None = report.staging_bytes
    gbps: float = report.gbps
    # The mapping it was: each key's value as precise as its attribute.
    n: int = report["bytes"]
    s: float = report["seconds"]
    device: str = report["device"]
    d: LoadReportDict = report.to_dict()
    copy_s: float = d.get("device_copy_s", 0.0)
    text: str = json.dumps(d)
    keys: list[str] = report.keys()
    maybe = report.get("staging_bytes", -1)

    bad_io: int = report.io  # type: ignore[assignment]
    bad_rank: str = report.rank  # type: ignore[assignment]
    report.bytes = 0  # type: ignore[misc]
    p.load("0", addresses)  # type: ignore[arg-type]
    wload.plan(folder, tp="2")  # type: ignore[arg-type]
    wload.plan(folder, tensor_parallel=2)  # type: ignore[call-arg]
    t0: int = p.tensors(0)[0].shape  # type: ignore[assignment]
    return s + gbps + copy_s + n


def refused(folder: str) -> list[str]:
    try:
        wload.plan(folder, tp=3)
    except wload.PlanError as e:
        problems: list[Problem] = e.problems
        fixes = [pr["fix"] or "" for pr in problems]
        shapes = [pr["expected_shape"] for pr in problems if pr["expected_shape"] is not None]
        first: list[int] = shapes[0] if shapes else []
        return fixes + [str(len(first))]
    except wload.WloadError as e:
        return [str(e)]
    return [wload.__version__]
