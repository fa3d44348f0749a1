#!/usr/bin/env python3
"""Reload a sharded_state folder (wload's output) with real vLLM on the CPU and dump what each
rank then holds, before vLLM's own post-processing, for a byte comparison with the state vLLM holds
from the original checkpoint (tests/data/golden/expected/<case>/tp<N>).

    VLLM_TARGET_DEVICE=cpu python tools/vllm_reload.py OUT --tp 2 --dump DUMP [--moe-backend triton]
    python tests/data/golden/tools/compare_shards.py tests/data/golden/expected/CASE/tp2 DUMP --ignore-parts

With `--load-format safetensors`, FOLDER is a HF checkpoint and the dump is the state vLLM's own
loader makes from it: the reference for a format that has no golden case (compare it with the
dump of wload's output reloaded as above).

What it does, per rank in its own process (gloo process group, as the golden oracle ran):
`EngineArgs(OUT, load_format="sharded_state" (or --load-format), tensor_parallel_size=N).create_engine_config()`,
`init_worker_distributed_environment`, `get_model_loader(...).load_model(...)` — vLLM's own
ShardedStateLoader fills a fresh model from the rank files — then writes `model.state_dict()`
(storage-shared aliases dropped as `ShardedStateLoader.save_model` drops them).

Patched, as the golden oracle patched them (its `oracle_meta_rank*.json` lists the same), because
the goal is the state right after the weight loaders, which is what sharded_state files hold:
- `process_weights_after_loading` (model_loader/utils.py, called by BaseModelLoader.load_model):
  a no-op, so that the dump is the loaded state, not the kernel-repacked one;
- kernel selection that has no CPU implementation (NVFP4, WNA16/Marlin linear kernels): a stub
  object, selection only — parameters are created by the schemes themselves;
- the MoE backend: the SM90 (H100/H200) default, TRITON, which decides MXFP4 padding, and
  MARLIN for NVFP4 experts (selection only), which decides their input scales' shape under EP.
Needs vLLM 0.33.0 (`pip install vllm==0.33.0` in a venv).
"""

import argparse
import json
import multiprocessing as mp
import os
import socket
import sys


def patch_vllm(moe_backend):
    import vllm.model_executor.model_loader.base_loader as base_loader

    base_loader.process_weights_after_loading = lambda *a, **k: None

    class StubKernel:
        """Selection only: never applied (no forward pass runs)."""

        def __init__(self, *a, **k):
            pass

        def __getattr__(self, name):
            return lambda *a, **k: None

    stubs = [
        ("vllm.model_executor.layers.quantization.modelopt", "init_nvfp4_linear_kernel"),
        ("vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_w4a4_nvfp4", "init_nvfp4_linear_kernel"),
        ("vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_wNa16", "choose_mp_linear_kernel"),
        ("vllm.model_executor.layers.quantization.auto_gptq", "choose_mp_linear_kernel"),
        ("vllm.model_executor.layers.quantization.auto_gptq", "verify_marlin_supported"),
    ]
    import importlib

    for mod, fn in stubs:
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        if hasattr(m, fn):
            if fn == "verify_marlin_supported":
                setattr(m, fn, lambda *a, **k: None)
            elif fn == "choose_mp_linear_kernel":
                setattr(m, fn, lambda *a, **k: StubKernel)
            else:
                setattr(m, fn, lambda *a, **k: StubKernel())
    # NVFP4 experts: CPUs have no backend; MARLIN is the SM90 (H100/H200) default, whose
    # input scales are the rank's experts' (not FlashInfer's global ones).
    try:
        import vllm.model_executor.layers.fused_moe.oracle.nvfp4 as on

        def select_nvfp4(*a, **k):
            return on.NvFp4MoeBackend.MARLIN, StubKernel

        for mod in [
            "vllm.model_executor.layers.quantization.modelopt",
            "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w4a4_nvfp4",
        ]:
            m = importlib.import_module(mod)
            if hasattr(m, "select_nvfp4_moe_backend"):
                m.select_nvfp4_moe_backend = select_nvfp4
    except (ImportError, AttributeError) as e:
        print(f"warning: NVFP4 MoE backend not patched ({e})", file=sys.stderr)
    # Unquantized experts: TRITON, the SM80/SM90 default, as the golden oracle pinned it (the
    # CPU backend would prepack them; selection only).
    try:
        import vllm.model_executor.layers.fused_moe.oracle.unquantized as ou
        import vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method as um

        def select_unquantized(*a, **k):
            try:
                cls = ou.backend_to_kernel_cls(ou.UnquantizedMoeBackend.TRITON)[0]
            except Exception:  # the kernel class may not import on a CPU build
                cls = None
            return ou.UnquantizedMoeBackend.TRITON, cls

        um.select_unquantized_moe_backend = select_unquantized
    except (ImportError, AttributeError) as e:
        print(f"warning: unquantized MoE backend not patched ({e})", file=sys.stderr)
    if moe_backend == "triton":
        # As the golden oracle pinned it: the SM90 default, TRITON, whose padding is
        # round_up(I/tp, 64); selection only (the import of the kernel class may fail on a CPU
        # build, and no forward pass runs).
        import vllm.model_executor.layers.fused_moe.oracle.mxfp4 as oracle
        import vllm.model_executor.layers.quantization.mxfp4 as q_mxfp4

        def select(*a, **k):
            return oracle.Mxfp4MoeBackend.TRITON, None

        oracle.select_mxfp4_moe_backend = select
        q_mxfp4.select_mxfp4_moe_backend = select


def rank_main(rank, args, port):
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    patch_vllm(args.moe_backend)
    import torch
    from safetensors.torch import save_file
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.v1.worker.gpu_worker import init_worker_distributed_environment

    engine = EngineArgs(
        model=args.folder,
        load_format=args.load_format,
        tensor_parallel_size=args.tp,
        dtype=args.dtype,
        enforce_eager=True,
        distributed_executor_backend="mp",
        enable_expert_parallel=args.enable_expert_parallel,
        pipeline_parallel_size=args.pp,
        language_model_only=args.language_model_only,
        mm_encoder_tp_mode=args.mm_encoder_tp_mode,
        config_format=args.config_format,
        hf_overrides=args.hf_overrides,
    )
    config = engine.create_engine_config()
    with set_current_vllm_config(config):
        init_worker_distributed_environment(
            config, rank, f"tcp://127.0.0.1:{port}", rank, backend="gloo"
        )
        loader = get_model_loader(config.load_config)
        model = loader.load_model(vllm_config=config, model_config=config.model_config)
    # Aliases of one tensor (Qwen3-MoE's router is `mlp.gate` and `mlp.experts.gate`) keep
    # the smallest name, as `ShardedStateLoader._filter_subtensors` keeps it.
    state = {}
    kept = {}
    for k, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if t.numel() and key in kept:
            if k > kept[key]:
                continue
            del state[kept[key]]
        if t.numel():
            kept[key] = k
        state[k] = t.detach().contiguous().cpu()
    os.makedirs(args.dump, exist_ok=True)
    name = (
        f"model-pp-{rank // args.tp}-tp-{rank % args.tp}-part-0.safetensors"
        if args.pp > 1
        else f"model-rank-{rank}-part-0.safetensors"
    )
    save_file(state, os.path.join(args.dump, name))
    print(f"rank {rank}: {len(state)} tensors", flush=True)
    torch.distributed.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder")
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--dump", required=True)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--moe-backend", default=None)
    p.add_argument("--enable-expert-parallel", action="store_true")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (ranks = tp x pp)")
    p.add_argument("--language-model-only", action="store_true")
    p.add_argument("--mm-encoder-tp-mode", default="weights")
    p.add_argument("--config-format", default="auto")
    p.add_argument("--hf-overrides", type=json.loads, default={}, help="JSON object")
    p.add_argument(
        "--load-format",
        default="sharded_state",
        help="sharded_state (a wload output folder) or safetensors (a HF checkpoint: vLLM's own state)",
    )
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, args, port)) for r in range(args.tp * args.pp)]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join()
    bad = [r for r, pr in enumerate(procs) if pr.exitcode != 0]
    if bad:
        sys.exit(f"ranks {bad} failed")


if __name__ == "__main__":
    main()
