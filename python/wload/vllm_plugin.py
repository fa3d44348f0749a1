"""`vllm serve MODEL --load-format wload`: wload's plan and engine as a vLLM model loader.

Registered through the `vllm.general_plugins` entry point (`register`), which vLLM loads in every
process. vLLM builds the empty model and, after `load_weights`, runs every layer's
`process_weights_after_loading` itself (model_loader/base_loader.py:63-115), so this loader only
has to fill the freshly created parameters exactly as vLLM's weight loaders would: which is what
wload's plan for this worker's rank is, byte for byte (the sharded_state contract,
sharded_state_loader.py:190-252).

For the worker's TP, PP and EP rank (vLLM's parallel state) it plans MODEL — a checkpoint folder, a
hub repo id (vLLM's `--revision` and `--download-dir`), an object-store URL (`s3://`, `gs://`,
`az://`: see `_allow_object_store`), or a pre-sharded wload/vLLM folder — checks
every planned tensor against the model's `state_dict` (key present, same dtype, same shape or a
leading slice of it, as sharded_state narrows) and every parameter against the plan, and reports
every disagreement at once before a byte is read. Then each rank reads only its own bytes into
the parameters: no full checkpoint tensor is materialised.

A checkpoint wload cannot plan is refused once, in the process that builds vLLM's config, before
any worker starts or a model is allocated (`_refuse_early`), in one message without a chained
traceback, naming vLLM's flags and the fix. Online quantization (`--quantization fp8_per_tensor`,
...) is refused by each worker before planning: vLLM then creates weights on the meta device that
only its own weight loaders can fill, which is seen only once the model exists.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._wload import LoadReport, Plan, Problem, Tensor

LOAD_FORMAT = "wload"


def register() -> None:
    """The entry point: adds the `wload` load format to vLLM, and lets it take an object-store
    MODEL (`vllm serve s3://bucket/model --load-format wload`)."""
    from vllm.model_executor.model_loader import register_model_loader

    register_model_loader(LOAD_FORMAT)(_loader_class())
    _allow_object_store()
    _refuse_early()


def _refuse_early() -> None:
    """Plans MODEL once where vLLM builds its config, so that a checkpoint wload cannot plan is
    refused there: before the workers start and allocate the model, once rather than once per
    worker, and without the chained tracebacks of a failure inside `load_weights`.

    EngineArgs.create_engine_config (engine/arg_utils.py:2245) builds the VllmConfig in the
    process that starts the engine (`vllm serve`'s API server, `LLM(...)`); workers receive it
    built. Wrapped for `load_format == "wload"` only: after vLLM's own checks (its refusals
    come first, in its words), the plan of the whole layout (TP, PP, EP; reading the config and
    the headers only). Each worker still plans its own rank and checks it against the model.
    Where vLLM has no such method (another version), nothing is wrapped and the workers refuse.
    """
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:
        return
    create = getattr(EngineArgs, "create_engine_config", None)
    if not callable(create) or getattr(create, "_wload_patched", False):
        return

    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        config = create(self, *args, **kwargs)
        if getattr(getattr(config, "load_config", None), "load_format", None) == LOAD_FORMAT:
            par = config.parallel_config
            _plan(
                config.load_config,
                config.model_config,
                tp=par.tensor_parallel_size,
                pp=par.pipeline_parallel_size,
                ep=bool(par.enable_expert_parallel),
            )
        return config

    create_engine_config._wload_patched = True  # type: ignore[attr-defined]
    create_engine_config.__wrapped__ = create  # type: ignore[attr-defined]
    EngineArgs.create_engine_config = create_engine_config


# vLLM's object-store schemes (transformers_utils/runai_utils.py:16 SUPPORTED_SCHEMES); wload
# reads the same three (and abfs://, abfss://, which vLLM does not take as object storage).
_OBJECT_STORE_SCHEMES = ("s3://", "gs://", "az://", "abfs://", "abfss://")


def _is_object_store(source: str) -> bool:
    return str(source).lower().startswith(_OBJECT_STORE_SCHEMES)


# Why the object-store patches are not installed (vLLM's code is not the shape they were written
# for), said when a `--load-format wload` object-store model needs them; None once installed.
_object_store_unpatched: str | None = "register() has not run"


def _allow_object_store() -> None:
    """`vllm serve s3://bucket/model --load-format wload`: vLLM 0.33 takes an object-store MODEL
    only with the Run:ai streamer, in two places, both before any worker starts:

    1. ModelConfig.__post_init__ (config/model.py:632) calls maybe_pull_model_tokenizer_for_runai
       (config/model.py:1204-1248), which pulls the config and tokenizer files with the
       `runai_model_streamer` package into a cache folder, then sets `model` to that folder and
       `model_weights` to the URL. It returns at once when `model_weights` is already set
       (config/model.py:1214-1215).
    2. VllmConfig.__post_init__ (config/vllm.py:1539) calls try_verify_and_update_config
       (config/vllm.py:2735-2795), which raises unless `load_format` is modelexpress,
       runai_streamer or runai_streamer_sharded when `model_weights` is an object-store URI
       (config/vllm.py:2775-2795).

    Both are built from EngineArgs.create_engine_config (engine/arg_utils.py:2245), which makes
    the ModelConfig through EngineArgs.create_model_config (arg_utils.py:2279, 1982-1996,
    `model_weights=self.model_weights`) and then the VllmConfig. register() runs before that in
    every process that builds a config: EngineArgs.__post_init__ loads the general plugins
    (arg_utils.py:929-931), as `vllm serve`'s argument parser does (arg_utils.py:3256); workers
    receive the built VllmConfig.

    So, for `load_format == "wload"` only:
    1. EngineArgs.create_model_config first fetches the config and side files (tokenizer, ...)
       with wload (`wload.fetch`: the cache folder `wload.plan` reads through; the weights stay
       in the store), then gives vLLM that folder as `model` and the URL as `model_weights`
       (and as the served model name, which vLLM takes from MODEL before its pull,
       config/model.py:600-602): the state vLLM's own pull leaves, so its pull returns at once and the plugin plans the
       URL (`model_weights or model`). The `runai_model_streamer` package is not needed.
    2. VllmConfig.try_verify_and_update_config runs with `model_weights` cleared, then
       restored: the check at config/vllm.py:2775 is the only use of `model_weights` there.
    Every other load format, and a local or hub MODEL, goes through vLLM untouched. When vLLM's
    code is not the shape described (another version), only step 1's hook is installed, and it
    refuses a `--load-format wload` object-store model before anything is fetched, saying what
    changed (where even that hook has nowhere to go, vLLM's own check refuses).
    """
    global _object_store_unpatched
    import dataclasses
    import inspect

    try:
        from vllm.config import ModelConfig, VllmConfig
        from vllm.engine.arg_utils import EngineArgs
    except ImportError as e:
        # Not vLLM 0.33's layout (or a stand-in vLLM, as python/tests/stub_vllm): vLLM's own check
        # (config/vllm.py:2775) then refuses an object-store model with --load-format wload.
        _object_store_unpatched = f"cannot import what the patches wrap ({e})"
        return

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    need = {"model", "model_weights", "tokenizer", "load_format", "revision", "download_dir",
            "config_format", "served_model_name"}
    create = getattr(EngineArgs, "create_model_config", None)
    if not need <= fields or not callable(create):
        # Nowhere to hook even the refusal: vLLM's own check (config/vllm.py:2775) refuses.
        _object_store_unpatched = (
            f"EngineArgs has no {', '.join(sorted(need - fields)) or 'create_model_config'} "
            "(engine/arg_utils.py:497, 1982)"
        )
        return
    if not getattr(create, "_wload_patched", False):

        def create_model_config(self: Any) -> Any:
            # Fetches, or refuses saying why when the rest could not be patched.
            if self.load_format == LOAD_FORMAT and not self.model_weights and _is_object_store(
                self.model
            ):
                _fetch_for_vllm(self)
            return create(self)

        create_model_config._wload_patched = True  # type: ignore[attr-defined]
        create_model_config.__wrapped__ = create  # type: ignore[attr-defined]
        EngineArgs.create_model_config = create_model_config

    problems = []
    pull = getattr(ModelConfig, "maybe_pull_model_tokenizer_for_runai", None)
    try:
        pull_src = inspect.getsource(pull) if pull else ""
    except (OSError, TypeError):
        pull_src = ""
    # config/model.py:1214-1215: the pull is skipped once model_weights is set.
    if "if self.model_weights:\n            return" not in pull_src:
        problems.append(
            "ModelConfig.maybe_pull_model_tokenizer_for_runai no longer returns at once when "
            "model_weights is set (config/model.py:1214)"
        )
    post = VllmConfig.__dict__.get("try_verify_and_update_config")
    if getattr(post, "_wload_patched", False):
        _object_store_unpatched = None
        return
    try:
        post_src = inspect.getsource(post) if post else ""
    except (OSError, TypeError):
        post_src = ""
    # config/vllm.py:2775-2776: `hasattr(self.model_config, "model_weights") and
    # is_runai_obj_uri(self.model_config.model_weights)`, the only two mentions.
    if post_src.count("model_weights") != 2 or "runai_streamer_sharded" not in post_src:
        problems.append(
            "VllmConfig.try_verify_and_update_config no longer reads model_weights only in its "
            "object-storage load-format check (config/vllm.py:2775-2795)"
        )
    if problems:
        _object_store_unpatched = "; ".join(problems)
        return

    def try_verify_and_update_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        mc: Any = getattr(self, "model_config", None)
        lc: Any = getattr(self, "load_config", None)
        url = getattr(mc, "model_weights", "") or ""
        if lc is None or lc.load_format != LOAD_FORMAT or not _is_object_store(url):
            return post(self, *args, **kwargs)
        mc.model_weights = ""
        try:
            return post(self, *args, **kwargs)
        finally:
            mc.model_weights = url

    try_verify_and_update_config._wload_patched = True  # type: ignore[attr-defined]
    try_verify_and_update_config.__wrapped__ = post  # type: ignore[attr-defined]
    VllmConfig.try_verify_and_update_config = try_verify_and_update_config
    _object_store_unpatched = None


def _fetch_for_vllm(args: Any) -> None:
    """EngineArgs `args` of an object-store MODEL with --load-format wload: its config and side
    files fetched into wload's cache folder, which becomes vLLM's `model` (and the tokenizer, when
    it was MODEL), the URL its `model_weights`: what
    ModelConfig.maybe_pull_model_tokenizer_for_runai (config/model.py:1220-1236) leaves."""
    import wload

    url = args.model
    if _object_store_unpatched is not None:
        raise WloadLoadError(
            f"--load-format wload cannot take the object-store model {url} with this vLLM: "
            f"{_object_store_unpatched}. wload's plugin was written against vLLM 0.33; "
            "use `--load-format runai_streamer`, or `wload shard` the checkpoint to a local folder"
        )
    tokenizer = args.tokenizer
    if tokenizer not in (None, url) and _is_object_store(tokenizer):
        raise WloadLoadError(
            f"--load-format wload: a --tokenizer in object storage ({tokenizer}) other than the "
            f"model's is not fetched; leave --tokenizer out (the model's own, {url}, is fetched "
            "with its config) or give a local folder or hub id"
        )
    config_format = str(getattr(args.config_format, "value", args.config_format) or "auto")
    try:
        local = wload.fetch(
            url,
            revision=args.revision,
            download_dir=args.download_dir,
            config_format=config_format if config_format in ("auto", "hf", "mistral") else "auto",
        )
    except wload.PlanError as e:
        raise WloadLoadError(
            f"wload cannot fetch the config of {url}:\n{e}\nuse --load-format runai_streamer to "
            "load it with vLLM's own object-storage loader"
        ) from e
    args.model_weights = url
    args.model = local
    # vLLM names the served model after MODEL as given, before its own pull
    # (config/model.py:600-602): the URL, not the cache folder.
    if not args.served_model_name:
        args.served_model_name = url
    if tokenizer in (None, url):
        args.tokenizer = local


class WloadLoadError(ValueError):
    """The model cannot be filled from the plan: every reason at once, and what to do.
    `problems`: the plan's problems (as wload.PlanError's) when planning refused it."""

    problems: list[Problem] = []


def _loader_class() -> type:
    # Built lazily: importing vLLM (and torch) only where vLLM is loading plugins.
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    # vLLM is not typed for mypy here: its base class is Any.
    class WloadModelLoader(BaseModelLoader):  # type: ignore[misc]
        """Fills vLLM's parameters from wload's plan of the checkpoint for this worker's rank."""

        def download_model(self, model_config: Any) -> None:
            # Planning fetches what the rank reads (headers first for a hub id); nothing else.
            _plan_for_worker(self.load_config, model_config)

        def load_weights(self, model: Any, model_config: Any) -> None:
            import torch

            from vllm.logger import init_logger

            # Under vLLM's logger, whose handler and level the server configures.
            log = init_logger("vllm.wload")
            t0 = time.perf_counter()
            _refuse_online_quantization(model, model_config)
            plan, rank = _plan_for_worker(self.load_config, model_config)
            t_plan = time.perf_counter() - t0
            state = _parameters(model)
            targets = _check(plan, rank, state, model_config.model)
            device = next(iter(state.values())).device if state else torch.device("cpu")
            stats, t_fill = _fill(plan, rank, targets, device)
            log.info(
                "wload: rank %d read %.1f MiB from %s, filling %d tensors (%.1f MiB) in %.3fs "
                "(plan %.3fs, read and copy %.3fs%s)",
                rank,
                stats.bytes_read / 2**20,
                _read_from(plan, model_config, stats),
                len(targets),
                stats.bytes / 2**20,
                time.perf_counter() - t0,
                t_plan,
                t_fill,
                "".join(
                    f", {k} {v:.3f}s"
                    for k, v in sorted(stats.items())
                    if k.endswith("_s") and isinstance(v, float)
                ),
            )

    return WloadModelLoader


def _read_from(plan: Plan, model_config: Any, stats: LoadReport) -> str:
    """Where the rank's bytes came from, for the log: the object-store URL (ranged GETs; the
    cache folder holds only the config and headers), else the local folder and the io mode."""
    source = model_config.model_weights or model_config.model
    if _is_object_store(source):
        return f"{source} (ranged GETs)"
    return f"{plan.root} (io {stats.io})"


def _worker_layout() -> tuple[int, int, int, int, bool]:
    """This worker's TP size and rank, PP size and stage, and whether experts are parallel."""
    from vllm.config import get_current_vllm_config
    from vllm.distributed import parallel_state as ps

    pp_group = ps.get_pp_group()
    parallel = get_current_vllm_config().parallel_config
    return (
        ps.get_tensor_model_parallel_world_size(),
        ps.get_tensor_model_parallel_rank(),
        pp_group.world_size,
        pp_group.rank_in_group,
        bool(parallel.enable_expert_parallel),
    )


def _plan_for_worker(load_config: Any, model_config: Any) -> tuple[Plan, int]:
    """wload's plan of MODEL for this worker's layout, and this worker's global rank in it."""
    tp, tp_rank, pp, pp_rank, ep = _worker_layout()
    return _plan(load_config, model_config, tp=tp, pp=pp, ep=ep), pp_rank * tp + tp_rank


def _plan(load_config: Any, model_config: Any, *, tp: int, pp: int, ep: bool) -> Plan:
    """wload's plan of MODEL for vLLM's layout, or a WloadLoadError in vLLM's flags."""
    import vllm.envs as envs
    import wload

    mm = getattr(model_config, "multimodal_config", None)
    overrides = model_config.hf_overrides
    if callable(overrides):
        raise WloadLoadError(
            "--load-format wload takes --hf-overrides as a JSON object, not a function; "
            "use --load-format auto"
        )
    source = model_config.model_weights or model_config.model
    try:
        return wload.plan(
            source,
            tp=tp,
            pp=pp,
            expert_parallel=ep,
            dtype=str(model_config.dtype).removeprefix("torch."),
            hf_overrides=dict(overrides) or None,
            revision=model_config.revision,
            download_dir=load_config.download_dir,
            language_model_only=bool(mm and mm.language_model_only),
            mm_encoder_tp_mode=(mm.mm_encoder_tp_mode if mm else None) or "weights",
            pp_partition=envs.VLLM_PP_LAYER_PARTITION,
        )
    except wload.PlanError as e:
        layout = f"--tensor-parallel-size {tp} --pipeline-parallel-size {pp}"
        err = WloadLoadError(
            f"wload cannot load {source} with {layout}"
            f"{' --enable-expert-parallel' if ep else ''}:\n{_in_vllm_flags(str(e))}\n"
            "use --load-format auto to load it with vLLM's own loader"
        )
        err.problems = e.problems
    # Outside the except block: the message holds the whole plan error, and a chained traceback
    # would only repeat it under vLLM's frames.
    raise err


# wload.PlanError names the options as `wload.plan`'s keywords (tp=2, expert_parallel=True);
# under `vllm serve` they are vLLM's flags. Only keywords with a value or a flag's own `=True`:
# a bare word such as "dtype" is also plain English, except tp and pp.
_VLLM_FLAGS = {
    "expert_parallel=True": "--enable-expert-parallel",
    "language_model_only=True": "--language-model-only",
    "mm_encoder_tp_mode=": "--mm-encoder-tp-mode ",
    "config_format=": "--config-format ",
    "download_dir=": "--download-dir ",
    "hf_overrides=": "--hf-overrides ",
    "load_format=": "--load-format ",
    "moe_backend=": "--moe-backend ",
    "revision=": "--revision ",
    "dtype=": "--dtype ",
    "tp=": "--tensor-parallel-size ",
    "pp=": "--pipeline-parallel-size ",
    "tp": "--tensor-parallel-size",
    "pp": "--pipeline-parallel-size",
}
_KEYWORD = re.compile(
    r"(?<![\w.=-])(?:("
    + "|".join(re.escape(k) for k in sorted(_VLLM_FLAGS, key=len, reverse=True) if "=" in k)
    + r")|(tp|pp)(?![\w=-]))"
)


# A mapping file is wload's own option, which `vllm serve` has no flag for: it is given to
# `wload shard`, whose output the plugin (or sharded_state) then serves.
_MAPPING = re.compile(r"(?<![\w-])mapping FILE\b")


def _in_vllm_flags(text: str) -> str:
    """A wload.PlanError's text with its keywords named as `vllm serve`'s flags; a rule quoted in
    backticks (`num_attention_heads % tp == 0`) is an expression and stays as it is."""
    text = _MAPPING.sub("`wload shard --mapping FILE` (then serve its output folder)", text)
    pieces = text.split("`")
    for i in range(0, len(pieces), 2):
        pieces[i] = _KEYWORD.sub(lambda m: _VLLM_FLAGS[m.group(1) or m.group(2)], pieces[i])
    return "`".join(pieces)


def _refuse_online_quantization(model: Any, model_config: Any) -> None:
    """Refuses a model whose parameters vLLM means to fill itself, before anything is planned.

    vLLM 0.33's online quantization creates each quantized layer's full-precision weight on the
    meta device (quantization/online/fp8.py:169-183, online/moe_base.py:59-105) and materialises
    and quantizes it inside its own weight loaders, layer by layer, as they receive the
    checkpoint's tensors (model_loader/reload/layerwise.py:120-223). Such a parameter has no
    memory for wload to fill. Left to `_check`, the refusal would be misleading:
    `_filter_subtensors` sees every meta tensor at address 0 and keeps only one, so each layer
    would read "the model has no such parameter".

    Which flags do that depends on the checkpoint as well as the name, so the test is the meta
    device itself, not the flag's spelling:
    - `--quantization fp8_per_tensor`, `fp8_per_block`, `fp8_per_channel`, or `online` with
      `--quantization-config`: always (config/quantization.py:195-234);
    - `mxfp4`, `mxfp8`: only on a checkpoint without quantization metadata; on an MXFP4/MXFP8
      checkpoint they name its own method, which wload plans (quantization.py:236-272);
    - `fp8` (deprecated): online fp8_per_tensor only on a checkpoint without a quantization
      config (model_loader/weight_utils.py:355-363); on an FP8 checkpoint, its own method;
    - `int8_per_channel_weight_only`, `nvfp4_per_token`, `experts_int8`: MoE experts only, so
      nothing on the meta device in a dense model, which vLLM then loads unquantized too;
    - `--quantization-config` on top of a quantized checkpoint: the layers its own method
      leaves unquantized (weight_utils.py:219-229).
    A parameter on the meta device is exactly what wload cannot fill, whichever of these put it
    there (vLLM asks its quant methods the same question, `uses_meta_device`,
    base_loader.py:170-176). The flags only word the reason.
    """
    meta = [k for k, t in model.state_dict().items() if t.device.type == "meta"]
    if not meta:
        return
    how = _online_quantization_flags(model_config)
    names = ", ".join(meta[:3]) + (f" and {len(meta) - 3} more" if len(meta) > 3 else "")
    created = (
        f"vLLM creates {len(meta)} parameter{'s' if len(meta) != 1 else ''} on the meta device "
        f"({names}) and fills them only through its own weight loaders"
    )
    cannot = (
        "wload fills parameters with the checkpoint's bytes as they are, and these have no "
        "memory to fill"
    )
    if how is None:
        # Not a configuration this module knows: say what is seen, claim no cause.
        raise WloadLoadError(
            f"--load-format wload cannot fill {model_config.model}: {created}; {cannot}.\n"
            "use --load-format auto to load it with vLLM's own loader"
        )
    raise WloadLoadError(
        f"--load-format wload cannot fill {model_config.model} with online quantization ({how}): "
        f"{created}, which quantize the checkpoint's full-precision weights layer by layer as "
        f"they read them; {cannot}.\n"
        "use --load-format auto (vLLM's own loader quantizes as it loads), or quantize the "
        "checkpoint offline (for example with llm-compressor) and serve that checkpoint, or "
        "`wload shard`'s output of it, with --load-format wload"
    )


def _online_quantization_flags(model_config: Any) -> str | None:
    """The flags that asked for online quantization, as the user wrote them; None if none did.

    `model_config.quantization_config` is set only from the user's `--quantization` shorthand or
    `--quantization-config` (engine/arg_utils.py:922-926, config/quantization.py:241-286); the
    checkpoint's own method is `hf_config.quantization_config` (or `compression_config`), as
    vLLM's get_quant_config reads it (weight_utils.py:239-247)."""
    hf = getattr(model_config, "hf_config", None)
    own = None
    for holder in (hf, getattr(hf, "text_config", None)):
        cfg = getattr(holder, "quantization_config", None) or getattr(
            holder, "compression_config", None
        )
        if cfg:
            own = cfg.get("quant_method") if isinstance(cfg, dict) else getattr(
                cfg, "quant_method", None
            )
            break
    if own and model_config.quantization_config is not None:
        # The checkpoint's method for its layers, vLLM's online one for the layers it leaves
        # unquantized (weight_utils.py:219-229).
        return f"--quantization-config, on top of the checkpoint's own {own} quantization"
    if model_config.quantization:
        return f"--quantization {model_config.quantization}"
    if model_config.quantization_config is not None:
        return "--quantization-config"
    return None


def _parameters(model: Any) -> dict[str, Any]:
    """The model's tensors by name, aliases and views inside other tensors dropped, as the
    sharded_state loader sees them."""
    from vllm.model_executor.model_loader.sharded_state_loader import ShardedStateLoader

    filtered: dict[str, Any] = ShardedStateLoader._filter_subtensors(model.state_dict())
    return filtered


def _check(
    plan: Plan, rank: int, state: dict[str, Any], model_name: str
) -> list[tuple[Tensor, Any]]:
    """Each planned tensor against its parameter, each parameter against the plan; every
    disagreement at once. Returns [(planned tensor, destination tensor)]."""
    import torch

    problems = []
    targets = []
    planned = plan.tensors(rank)
    seen = set()
    for t in planned:
        seen.add(t.name)
        param = state.get(t.name)
        if param is None:
            problems.append(f"{t.name}: planned for rank {rank}, but the model has no such parameter")
            continue
        # torch's name for wload's dtype comes from wload (Dtype::torch_name); None for a type
        # torch has no one-element type for, and an old torch may lack a newer name.
        want = getattr(torch, t.torch_dtype, None) if t.torch_dtype else None
        if want is None or param.dtype != want:
            problems.append(
                f"{t.name}: wload plans {t.dtype}, the model's parameter is {param.dtype}"
            )
            continue
        shape = tuple(t.shape)
        if len(shape) != param.dim() or any(s > p for s, p in zip(shape, param.shape)):
            problems.append(
                f"{t.name}: wload plans shape {list(shape)}, the model's parameter is "
                f"{list(param.shape)}"
            )
            continue
        dest = param.data
        for dim, size in enumerate(shape):
            if size < dest.shape[dim]:
                dest = dest.narrow(dim, 0, size)
        targets.append((t, dest))
    missing = [k for k in state if k not in seen]
    for k in missing:
        problems.append(f"{k}: the model's parameter is in no tensor wload plans for rank {rank}")
    if problems:
        raise WloadLoadError(
            f"wload's plan of {model_name} does not fit vLLM's model on rank {rank} "
            f"({len(problems)} problem{'s' if len(problems) != 1 else ''}):\n  - "
            + "\n  - ".join(problems)
            + "\nuse --load-format auto to load it with vLLM's own loader"
        )
    return targets


def _fill(
    plan: Plan, rank: int, targets: list[tuple[Tensor, Any]], device: Any
) -> tuple[LoadReport, float]:
    """Reads the rank's bytes into the destinations: contiguous parameters on `device` in place
    (CPU memory directly, GPU memory through wload's pinned staging ring on torch's current
    stream); a narrowed, non-contiguous view, or a parameter elsewhere (--cpu-offload-gb), through
    a contiguous buffer on `device`, then copied. A failed read raises: vLLM then never serves the
    half-filled model."""
    import torch

    import wload

    t0 = time.perf_counter()
    dests = {}
    staged = []
    for t, dest in targets:
        if dest.is_contiguous() and dest.device == device:
            dests[t.name] = dest.data_ptr()
        else:
            buf = torch.empty(tuple(t.shape), dtype=dest.dtype, device=device)
            dests[t.name] = buf.data_ptr()
            staged.append((buf, dest))
    try:
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            stream = torch.cuda.current_stream(index)
            # The copies are queued on `stream` and have landed when load returns.
            stats = plan.load(rank, dests, device="cuda", device_index=index,
                              stream=stream.cuda_stream)
        elif device.type == "cpu":
            stats = plan.load(rank, dests, device="cpu")
        else:
            raise WloadLoadError(
                f"--load-format wload fills CPU or CUDA parameters, not {device.type}; "
                "use --load-format auto"
            )
    except wload.WloadError as e:
        # No driver, a short read, a source that changed, a CUDA error: vLLM must not go on
        # with this model; its own loader may still load the checkpoint.
        raise WloadLoadError(f"{e}\nuse --load-format auto to load it with vLLM's own loader") from e
    for buf, dest in staged:
        dest.copy_(buf)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return stats, time.perf_counter() - t0
