#!/usr/bin/env python3
"""Reload a sharded_state folder (wload's output) with real vLLM on the CPU and dump what each
rank then holds, before vLLM's own post-processing, for a byte comparison with the state vLLM holds
from the original checkpoint (tests/data/golden/expected/<case>/tp<N>).

    VLLM_TARGET_DEVICE=cpu python tools/vllm_reload.py OUT --flags-from-folder --dump DUMP
    VLLM_TARGET_DEVICE=cpu python tools/vllm_reload.py OUT --tp 2 --dump DUMP [--moe-backend triton]
    python tests/data/golden/tools/compare_shards.py tests/data/golden/expected/CASE/tp2 DUMP --ignore-parts
    python tools/compare_digest.py tests/data/golden/expected/CASE/tp2 DUMP   (digest-form cases)

`--flags-from-folder` takes the engine flags from the folder itself, so that the reload runs with
exactly the `vllm serve` line a user is told to run: `wload.json`'s `serve.argv` for a wload output;
for a folder real vLLM wrote (a golden expected folder, `oracle_meta_rank0.json`) its `tp`, `pp`,
`enable_expert_parallel`, `dtype_requested` and `engine_options`. Either way `--config-format mistral` is added where the folder has params.json and
no config.json (vLLM reads params.json by itself only next to consolidated*.safetensors, which a
pre-sharded folder never has). Flags given on the command line come after and win.

With `--load-format wload`, FOLDER may be an object-store URL (`s3://bucket/prefix`, with the
`AWS_*` variables), as `vllm serve s3://… --load-format wload` takes it: the plugin's register()
(run here by EngineArgs) fetches the config with wload and each rank reads its bytes by ranged
GETs (tests/vllm/compare.sh with S3=1).

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
  MARLIN for NVFP4 experts (selection only), which decides their input scales' shape under EP
  (`--moe-backend flashinfer_trtllm` and the other FlashInfer names pin that NVFP4 backend
  instead: ModelOpt's input scales for every expert on every rank);
- DSA models (DeepSeek-V3.2, GLM-5.x: `DeepseekV32ForCausalLM`, `GlmMoeDsaForCausalLM`): the
  class of vLLM's CUDA module tree, `vllm/models/deepseek_v32/nvidia/model.py`, which the golden
  case records (what an H100/H200 holds; on CPU vLLM would bind the generic DeepSeek-V3 tree, whose
  keys differ, vllm-spec §11), and a sparse MLA backend, FLASHMLA_SPARSE (an SM90 candidate), where
  the CPU platform refuses sparse attention: the backend only builds the attention impl, it creates
  no parameter. The workspace manager is set up as the GPU worker does before loading
  (gpu_worker.py:558): that impl reserves scratch buffers in its `__init__`
  (flashmla_sparse.py:832), which are in no state_dict.

- Qwen3.5's GDN `in_proj_ba` under AWQ, GPTQ or INC: replicated, CUDA's answer of
  `QwenGatedDeltaNetAttention.maybe_disable_tp` (qwen_gdn_linear_attn.py:853-869, `is_cuda()` and
  the quant config's class), which the golden cases follow (`ORACLE_B4B_GDN_BA=cuda` in their
  meta) and wload records (`module_tree: cuda`); vLLM on CPU would split it.

The state dumped is `ShardedStateLoader._filter_subtensors(model.state_dict())`, the very function
`save_model` applies, so storage-shared aliases are dropped exactly as vLLM drops them. MLA models
(DeepSeek, GLM-4.7-Flash, Mistral Large 3) are dumped before `process_weights_after_loading` like
every other: the golden MLA cases hold that state (vLLM 0.33 cannot save the post-processed one).
Needs vLLM 0.33.0 (`pip install vllm==0.33.0` in a venv).
"""

import argparse
import json
import multiprocessing as mp
import os
import socket
import sys


# Patched selections that vLLM actually called, for `--oracle-meta` (as the golden oracle lists them).
PATCHES_CALLED = []


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
        # Block FP8 (ScaledMM): no CPU kernel implements the layer; selection only.
        ("vllm.model_executor.layers.quantization.fp8", "init_fp8_linear_kernel"),
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
    # input scales are the rank's experts' (not FlashInfer's global ones). `--moe-backend` names
    # another (`flashinfer_trtllm`: the ModelOpt input scales of every expert on every rank under
    # EP), mapped as vLLM maps the flag (`oracle/nvfp4.py` `map_nvfp4_backend`).
    try:
        import vllm.model_executor.layers.fused_moe.oracle.nvfp4 as on

        try:
            nvfp4_choice = on.map_nvfp4_backend(moe_backend) if moe_backend else on.NvFp4MoeBackend.MARLIN
        except ValueError:  # an MXFP4-only name (triton): NVFP4 keeps the SM90 default
            nvfp4_choice = on.NvFp4MoeBackend.MARLIN

        def select_nvfp4(*a, **k):
            note = f"select_nvfp4_moe_backend -> ({nvfp4_choice.name}, StubKernel) (selection only; decides the experts' input scales under EP, use_global_sf)"
            if note not in PATCHES_CALLED:
                PATCHES_CALLED.append(note)
            return nvfp4_choice, StubKernel

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
    # compressed-tensors WNA16 experts (Kimi K2.5's INT4): no CPU backend takes them; as the golden
    # oracle patched it, the real selection first, else MARLIN when vLLM's own Marlin check
    # accepts the layer, else TRITON (selection only: the parameters are the scheme's).
    try:
        import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_wna16 as cw
        from vllm.model_executor.layers.fused_moe.oracle.int_wna16 import WNA16MoEBackend

        real_select = cw.select_wna16_moe_backend

        def select_wna16(config, *a, **k):
            try:
                return real_select(config, *a, **k)
            except NotImplementedError:
                marlin = cw.check_moe_marlin_supports_config(config, k["quant_config"].group_size, allow_tile_padding=True)
                return (WNA16MoEBackend.MARLIN if marlin else WNA16MoEBackend.TRITON), None

        cw.select_wna16_moe_backend = select_wna16
        # AutoGPTQ / AutoAWQ experts (Qwen3.5-MoE GPTQ) select by the same function.
        import vllm.model_executor.layers.quantization.auto_awq as auto_awq
        import vllm.model_executor.layers.quantization.auto_gptq as auto_gptq

        auto_gptq.select_wna16_moe_backend = select_wna16
        auto_awq.select_wna16_moe_backend = select_wna16
    except (ImportError, AttributeError) as e:
        print(f"warning: WNA16 MoE backend not patched ({e})", file=sys.stderr)
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


# Architectures vLLM builds from `vllm/models/deepseek_v32` (registry.py:95, 126).
DSA_ARCHITECTURES = {"DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"}


def patch_dsa_cuda_tree():
    """Make DSA models vLLM's CUDA module tree on the CPU, as the golden oracle did.

    The registry resolves these architectures by `getattr(vllm.models.deepseek_v32, NAME)`, and the
    package `__init__` binds the generic DeepSeek-V3 class unless `current_platform.is_cuda()`;
    rebinding the names to the nvidia classes gives the CUDA keys (`self_attn.q_b_proj`, not
    `self_attn.mla_attn.q_b_proj`). The CPU platform then raises "Sparse Attention is not supported
    on CPU" when the attention picks its backend: answer FLASHMLA_SPARSE instead, one of SM90's
    candidates (platforms/cuda.py:140-155; the golden case is byte-identical with another one)."""
    import vllm.models.deepseek_v32 as dsa
    import vllm.models.deepseek_v32.nvidia.model as nvidia
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    dsa.DeepseekV32ForCausalLM = nvidia.DeepseekV32ForCausalLM
    dsa.GlmMoeDsaForCausalLM = nvidia.DeepseekV32ForCausalLM
    cpu_choice = CpuPlatform.get_attn_backend_cls.__func__

    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):
        if attn_selector_config.use_sparse:
            return AttentionBackendEnum.FLASHMLA_SPARSE.get_path()
        return cpu_choice(cls, selected_backend, attn_selector_config, num_heads)

    CpuPlatform.get_attn_backend_cls = classmethod(get_attn_backend_cls)


def patch_gdn_ba_cuda_rule():
    """`maybe_disable_tp` as CUDA answers it: the platform test dropped, the rest vLLM's."""
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as gdn

    def maybe_disable_tp(self, quant_config):
        marlin = (gdn.AutoAWQConfig, gdn.AutoGPTQConfig, gdn.INCConfig)
        return not self.gqa_interleaved_layout and isinstance(quant_config, marlin)

    gdn.QwenGatedDeltaNetAttention.maybe_disable_tp = maybe_disable_tp


def folder_architectures(folder):
    """config.json's architectures (a Mistral folder has none: params.json only)."""
    try:
        with open(os.path.join(folder, "config.json")) as f:
            return set(json.load(f).get("architectures") or [])
    except OSError:
        return set()


def rank_main(rank, args, port):
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    patch_vllm(args.moe_backend)
    patch_gdn_ba_cuda_rule()
    if folder_architectures(args.folder) & DSA_ARCHITECTURES:
        patch_dsa_cuda_tree()
    import torch
    from safetensors.torch import save_file
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.sharded_state_loader import ShardedStateLoader
    from vllm.v1.worker.gpu_worker import init_worker_distributed_environment
    from vllm.v1.worker.workspace import init_workspace_manager

    if args.load_format == "wload":
        # The wload plugin registers its load format through the `vllm.general_plugins` entry
        # point, which vLLM's workers load at start; this harness makes the workers itself.
        from vllm.plugins import load_general_plugins

        load_general_plugins()
    engine = EngineArgs(
        model=args.folder,
        load_format=args.load_format,
        tensor_parallel_size=args.tp,
        tokenizer_mode=args.tokenizer_mode,
        dtype=args.dtype,
        enforce_eager=True,
        distributed_executor_backend="mp",
        enable_expert_parallel=args.enable_expert_parallel,
        pipeline_parallel_size=args.pp,
        language_model_only=args.language_model_only,
        mm_encoder_tp_mode=args.mm_encoder_tp_mode,
        config_format=args.config_format,
        hf_overrides=args.hf_overrides,
        quantization=args.quantization,
    )
    config = engine.create_engine_config()
    with set_current_vllm_config(config):
        init_worker_distributed_environment(
            config, rank, f"tcp://127.0.0.1:{port}", rank, backend="gloo"
        )
        init_workspace_manager(torch.device("cpu"))
        loader = get_model_loader(config.load_config)
        model = loader.load_model(vllm_config=config, model_config=config.model_config)
    # What `ShardedStateLoader.save_model` would write: aliases of one tensor (Qwen3-MoE's router is
    # `mlp.gate` and `mlp.experts.gate`) and views inside another tensor dropped, the smallest name
    # kept.
    state = {
        k: t.detach().contiguous().cpu()
        for k, t in ShardedStateLoader._filter_subtensors(model.state_dict()).items()
    }
    os.makedirs(args.dump, exist_ok=True)
    name = (
        f"model-pp-{rank // args.tp}-tp-{rank % args.tp}-part-0.safetensors"
        if args.pp > 1
        else f"model-rank-{rank}-part-0.safetensors"
    )
    save_file(state, os.path.join(args.dump, name))
    if args.oracle_meta:
        write_oracle_meta(args, rank, config, model, list(state))
    print(f"rank {rank}: {len(state)} tensors", flush=True)
    torch.distributed.destroy_process_group()


def write_oracle_meta(args, rank, config, model, keys):
    """`oracle_meta_rank<r>.json` as the golden oracle writes it, for a reference made here from a
    checkpoint (`--load-format safetensors`): the layout, the state_dict order (`saved_key_order`,
    which decides part boundaries and the order wload must plan) and the patched selections."""
    import torch
    import vllm

    meta = {
        "rank": rank,
        "tp": args.tp,
        "pp": args.pp,
        "fixture": args.folder,
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "platform": "CpuPlatform",
        "model_class": type(model).__name__,
        "dtype_requested": args.dtype,
        "dtype_resolved": str(config.model_config.dtype),
        "enable_expert_parallel": args.enable_expert_parallel,
        "state": "pre_process_weights_after_loading",
        "made_by": "tools/vllm_reload.py --load-format safetensors --oracle-meta",
        "patches": ["process_weights_after_loading -> no-op (dump the PRE-post-processing state)"]
        + PATCHES_CALLED,
        "saved_key_order": keys,
    }
    with open(os.path.join(args.dump, f"oracle_meta_rank{rank}.json"), "w") as f:
        json.dump(meta, f, indent=1)


def folder_flags(folder):
    """The engine flags the folder asks for (see --flags-from-folder in the module doc)."""
    manifest = os.path.join(folder, "wload.json")
    meta = os.path.join(folder, "oracle_meta_rank0.json")
    flags = []
    if os.path.exists(manifest):
        with open(manifest) as f:
            line = json.load(f).get("serve") or {}
        serve = line.get("argv")
        if not serve or serve[:2] != ["vllm", "serve"]:
            sys.exit(f"{manifest}: no serve.argv `vllm serve FOLDER ...`")
        flags = serve[3:]  # after `vllm serve FOLDER`
        # The environment the line runs with (VLLM_PP_LAYER_PARTITION), for every rank process.
        os.environ.update(line.get("env") or {})
    elif os.path.exists(meta):
        # A folder real vLLM wrote: the golden oracle's parallel sizes, dtype and engine options
        # (EngineArgs fields: `language_model_only`, `mm_encoder_tp_mode`, ...), as CLI flags.
        with open(meta) as f:
            m = json.load(f)
        flags = ["--load-format", "sharded_state", "--tensor-parallel-size", str(m["tp"])]
        if m.get("pp", 1) > 1:
            flags += ["--pipeline-parallel-size", str(m["pp"])]
        if m.get("enable_expert_parallel"):
            flags.append("--enable-expert-parallel")
        if m.get("dtype_requested", "auto") != "auto":
            flags += ["--dtype", m["dtype_requested"]]
        for k, v in (m.get("engine_options") or {}).items():
            flag = "--" + k.replace("_", "-")
            if v is True:
                flags.append(flag)
            elif v is not False:
                flags += [flag, v if isinstance(v, str) else json.dumps(v)]
    else:
        sys.exit(f"{folder}: neither wload.json nor oracle_meta_rank0.json to take flags from")
    has = lambda f: os.path.exists(os.path.join(folder, f))  # noqa: E731
    if has("params.json") and not has("config.json") and "--config-format" not in flags:
        flags += ["--config-format", "mistral"]
    return flags


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder")
    p.add_argument("--tp", "--tensor-parallel-size", "-tp", type=int)
    p.add_argument("--dump", required=True)
    p.add_argument(
        "--flags-from-folder",
        action="store_true",
        help="engine flags from FOLDER/wload.json's serve line (or a golden folder's oracle meta)",
    )
    p.add_argument("--dtype", default="auto")
    p.add_argument(
        "--oracle-meta",
        action="store_true",
        help="also write oracle_meta_rank<r>.json (state_dict order, patches), as a golden expected folder has",
    )
    p.add_argument("--moe-backend", default=None)
    p.add_argument("--enable-expert-parallel", action="store_true")
    p.add_argument(
        "--pp", "--pipeline-parallel-size", type=int, default=1, help="pipeline stages (ranks = tp x pp)"
    )
    p.add_argument("--language-model-only", action="store_true")
    p.add_argument("--mm-encoder-tp-mode", default="weights")
    p.add_argument("--config-format", default="auto")
    p.add_argument("--tokenizer-mode", default="auto")
    # Serve-line flags that change nothing a rank holds: accepted, so that a serve line is taken
    # whole (a flag this script does not know is an error).
    p.add_argument("--skip-tokenizer-init", action="store_true")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--hf-overrides", type=json.loads, default={}, help="JSON object")
    p.add_argument(
        "--quantization", default=None,
        help="vLLM's --quantization (fp8_per_tensor: online quantization, which the wload plugin refuses)",
    )
    p.add_argument(
        "--load-format",
        default="sharded_state",
        help="sharded_state (a wload output folder), safetensors (a HF checkpoint: vLLM's own state) or wload (the checkpoint through the wload plugin: pip install ./python)",
    )
    return p


def main():
    p = parser()
    args = p.parse_args()
    if args.flags_from_folder:
        extra = folder_flags(args.folder)
        print("flags from the folder: " + " ".join(extra), flush=True)
        # The folder's flags first, the command line's after: the later one wins. A flag of the
        # serve line this script does not know is an error, not silently dropped.
        args = p.parse_args(extra + sys.argv[1:])
    if args.tp is None:
        p.error("--tp is required (or --flags-from-folder)")
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
