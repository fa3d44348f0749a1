"""wload: plan and load LLM safetensors checkpoints exactly as vLLM 0.33 holds them per rank.

    import wload
    p = wload.plan("/models/Llama-3.1-8B", tp=2)
    for t in p.tensors(0):
        ...  # t.name, t.dtype ("BF16"), t.shape, t.nbytes
    report = p.load(0, {t.name: address_of_buffer(t) for t in p.tensors(0)})
    report.bytes, report.seconds  # a LoadReport

`Plan.load` writes through raw addresses: each must point to writable, contiguous memory of
exactly the tensor's `nbytes`, alive and untouched until `load` returns. See python/README.md;
the types are in `_wload.pyi` (the package ships `py.typed`).
"""

from ._wload import LoadReport, Plan, PlanError, Tensor, WloadError, __version__, fetch, plan

__all__ = [
    "LoadReport", "Plan", "PlanError", "Tensor", "WloadError", "__version__", "fetch", "plan",
]
