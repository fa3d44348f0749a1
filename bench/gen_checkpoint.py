#!/usr/bin/env python3
"""Generate a synthetic Llama-like safetensors checkpoint folder (Python standard library only).

The folder holds config.json, model-XXXXX-of-YYYYY.safetensors and model.safetensors.index.json.
Every file is valid safetensors: an 8-byte little-endian header length, a JSON header (with
"__metadata__": {"format": "pt"}) padded with spaces to a multiple of 8, then the tensor data
packed contiguously in header order. The data is all zeros and is never written: the file is
extended with truncate(), so it is sparse and generation takes well under a second even when the
logical size is large.

Two ways to size it:

  --files N --tensors-per-file M   exactly N*M tensors, M per file (header-parsing benchmarks);
                                   the number of layers follows (the last one may be partial).
  --files N --layers L             L full decoder layers (9 tensors each) plus embed_tokens, norm
                                   and lm_head, spread over N files as evenly as possible.

Shapes: every tensor gets --shape (default 16,16), or with --real-shapes the shapes a
LlamaForCausalLM of the configured dimensions would have (sparse, so still cheap on disk).

FP8: with --fp8-block N, the seven linear weights of every decoder layer (q/k/v/o_proj,
gate/up/down_proj) are F8_E4M3, each followed by its F32 `weight_scale_inv` of shape
[ceil(out/N), ceil(in/N)], and config.json gets a block-wise fp8 quantization_config, the layout
of DeepSeek-V3 and Qwen3-FP8 checkpoints. Embeddings, norms and lm_head stay in --dtype, and
every scale holds 0.01 so that a loader reading them sees positive finite floats.

INT4: with --w4a16 G, the seven linear weights are compressed-tensors pack-quantized W4A16 with
groups of G, as llm-compressor writes them: `weight_packed` I32 [out, in/8] (eight 4-bit values
per word, random), `weight_scale` BF16 [out, in/G] (0.01 each) and `weight_shape` I64 [2]
([out, in]); config.json gets the matching quantization_config (lm_head ignored).

Examples:
  gen_checkpoint.py --files 64 --tensors-per-file 2000 --out /tmp/ckpt
  gen_checkpoint.py --files 4 --layers 32 --real-shapes --out /tmp/llama8b-like
  gen_checkpoint.py --files 2 --layers 4 --real-shapes --random --fp8-block 128 --out /tmp/fp8
  gen_checkpoint.py --files 2 --layers 8 --real-shapes --random --w4a16 32 --out /tmp/int4
"""

import argparse
import json
import math
import os
import struct
import sys

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "F8_E4M3": 1,
               "I32": 4, "I64": 8}
TORCH_DTYPE = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}

# Per decoder layer, in the order HF checkpoints usually list them.
LAYER_TENSORS = [
    "input_layernorm.weight",
    "mlp.down_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "post_attention_layernorm.weight",
    "self_attn.k_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_proj.weight",
    "self_attn.v_proj.weight",
]
LINEAR_WEIGHTS = {s for s in LAYER_TENSORS if s.endswith("_proj.weight")}
SCALE_SUFFIX = "_scale_inv"
FP8_DTYPE = "F8_E4M3"
# Positive and finite, so that a dequantizing reader of the synthetic data stays finite.
SCALE_VALUE = 0.01
# W4A16: each linear `*.weight` becomes these three (in this order, as llm-compressor lists them).
W4A16_PARTS = ["_packed", "_scale", "_shape"]


def layer_tensors(fp8, w4a16=False):
    """Per-layer name suffixes; with fp8, each linear weight is followed by its block scales;
    with w4a16, each linear weight is its packed values, group scales and shape."""
    if not fp8 and not w4a16:
        return list(LAYER_TENSORS)
    out = []
    for s in LAYER_TENSORS:
        if w4a16 and s in LINEAR_WEIGHTS:
            out += [s + p for p in W4A16_PARTS]
            continue
        out.append(s)
        if s in LINEAR_WEIGHTS:
            out.append(s + SCALE_SUFFIX)
    return out


def parse_shape(text):
    try:
        dims = [int(d) for d in text.replace("x", ",").split(",") if d.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}; expected e.g. 16,16")
    if any(d < 0 for d in dims):
        raise argparse.ArgumentTypeError(f"bad shape {text!r}; dimensions must be >= 0")
    return dims


def real_shape(suffix, a):
    """Shape of a LlamaForCausalLM tensor given its name suffix and the config dimensions."""
    h = a.hidden_size
    hd = h // a.num_attention_heads
    kv = a.num_key_value_heads * hd
    i = a.intermediate_size
    return {
        "embed_tokens.weight": [a.vocab_size, h],
        "lm_head.weight": [a.vocab_size, h],
        "norm.weight": [h],
        "input_layernorm.weight": [h],
        "post_attention_layernorm.weight": [h],
        "mlp.down_proj.weight": [h, i],
        "mlp.gate_proj.weight": [i, h],
        "mlp.up_proj.weight": [i, h],
        "self_attn.k_proj.weight": [kv, h],
        "self_attn.v_proj.weight": [kv, h],
        "self_attn.q_proj.weight": [h, h],
        "self_attn.o_proj.weight": [h, h],
    }[suffix]


def tensor_names(layers, total=None, per_layer=LAYER_TENSORS):
    """(name, suffix) in checkpoint order: embed_tokens, layers, norm, lm_head.

    With `total`, the list is cut to exactly `total` entries, keeping norm and lm_head at the end.
    """
    names = [("model.embed_tokens.weight", "embed_tokens.weight")]
    for li in range(layers):
        for s in per_layer:
            names.append((f"model.layers.{li}.{s}", s))
    tail = [("model.norm.weight", "norm.weight"), ("lm_head.weight", "lm_head.weight")]
    if total is not None:
        names = names[: max(total - len(tail), 0)]
        tail = tail[: total - len(names)]
    return names + tail


def split_even(items, parts):
    """Split `items` into `parts` contiguous chunks whose lengths differ by at most one."""
    q, r = divmod(len(items), parts)
    out, at = [], 0
    for p in range(parts):
        n = q + (1 if p < r else 0)
        out.append(items[at : at + n])
        at += n
    return out


def fill_bytes(dtype, fill, count):
    """`count` elements of `fill`: an F32 or BF16 value, or for I64 a list of the values."""
    if dtype == "I64":
        return struct.pack(f"<{len(fill)}q", *fill)
    if dtype == "BF16":
        return struct.pack("<f", fill)[2:] * count
    return struct.pack("<f", fill) * count


def write_safetensors(path, tensors, metadata, random_data=False):
    """tensors: list of (name, shape, dtype, fill); fill is None (random or zero data), an F32 or
    BF16 value written into every element, or an I64 tensor's values. Returns the total data
    bytes."""
    header = {"__metadata__": metadata}
    offset = 0
    for name, shape, dtype, _ in tensors:
        n = math.prod(shape) * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    start = 8 + len(raw)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        if random_data:
            # Real bytes on disk, so copies cannot skip holes (cp --sparse) and reads are real.
            for name, shape, dtype, fill in tensors:
                left = math.prod(shape) * DTYPE_BYTES[dtype]
                if fill is not None:
                    f.write(fill_bytes(dtype, fill, math.prod(shape)))
                    continue
                while left:
                    n = min(left, 64 << 20)
                    f.write(os.urandom(n))
                    left -= n
        else:
            f.truncate(start + offset)  # zero data, sparse
            for name, shape, dtype, fill in tensors:
                if fill is not None:
                    f.seek(start + header[name]["data_offsets"][0])
                    f.write(fill_bytes(dtype, fill, math.prod(shape)))
    return offset


def tensor_spec(name, suffix, a):
    """(name, shape, dtype, fill) of one tensor under the command-line options."""
    for part in W4A16_PARTS if a.w4a16 else []:
        if suffix.endswith(".weight" + part):
            base = suffix[: -len(part)]
            out, inp = real_shape(base, a) if a.real_shapes else list(a.shape)
            return {
                "_packed": (name, [out, inp // 8], "I32", None),
                "_scale": (name, [out, inp // a.w4a16], "BF16", SCALE_VALUE),
                "_shape": (name, [2], "I64", [out, inp]),
            }[part]
    if suffix.endswith(SCALE_SUFFIX):
        out, inp = tensor_spec(name, suffix[: -len(SCALE_SUFFIX)], a)[1]
        block = a.fp8_block
        return name, [-(-out // block), -(-inp // block)], "F32", SCALE_VALUE
    shape = real_shape(suffix, a) if a.real_shapes else list(a.shape)
    if a.fp8_block and suffix in LINEAR_WEIGHTS:
        return name, shape, FP8_DTYPE, None
    return name, shape, a.dtype, None


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    p.add_argument("--files", type=int, required=True, help="number of .safetensors shards")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--tensors-per-file", type=int, help="exactly this many tensors per file")
    size.add_argument("--layers", type=int, help="this many full decoder layers")
    p.add_argument("--out", required=True, help="output folder (created; existing shards replaced)")
    p.add_argument("--shape", type=parse_shape, default=[16, 16],
                   help="shape of every tensor, e.g. 16,16 (default) or 4x4")
    p.add_argument("--real-shapes", action="store_true",
                   help="use Llama shapes from the config dimensions instead of --shape")
    p.add_argument("--dtype", default="BF16", choices=sorted(DTYPE_BYTES), help="default BF16")
    p.add_argument("--hidden-size", type=int, default=4096)
    p.add_argument("--num-attention-heads", type=int, default=32)
    p.add_argument("--num-key-value-heads", type=int, default=8)
    p.add_argument("--intermediate-size", type=int, default=14336)
    p.add_argument("--vocab-size", type=int, default=128256)
    p.add_argument("--random", action="store_true",
                   help="write random data instead of sparse zeros (for copy/IO benchmarks)")
    p.add_argument("--fp8-block", type=int, metavar="N",
                   help="block-wise FP8: linear weights in F8_E4M3 with F32 N x N block scales")
    p.add_argument("--w4a16", type=int, metavar="G",
                   help="compressed-tensors pack-quantized INT4 linear weights, groups of G")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)

    if a.files < 1:
        p.error("--files must be >= 1")
    if a.hidden_size % a.num_attention_heads:
        p.error("--hidden-size must be a multiple of --num-attention-heads")
    if a.fp8_block is not None:
        if a.fp8_block < 1:
            p.error("--fp8-block must be >= 1")
        if not a.real_shapes and len(a.shape) != 2:
            p.error("--fp8-block needs 2-D weights: use a --shape like 16,16 or --real-shapes")
    if a.w4a16 is not None:
        if a.fp8_block is not None:
            p.error("--w4a16 and --fp8-block are two quantizations: pick one")
        if a.w4a16 < 8 or a.w4a16 % 8:
            p.error("--w4a16 must be a multiple of 8 (eight 4-bit values per I32 word)")
        if not a.real_shapes and len(a.shape) != 2:
            p.error("--w4a16 needs 2-D weights: use a --shape like 32,64 or --real-shapes")
        dims = [real_shape(s, a)[1] for s in LINEAR_WEIGHTS] if a.real_shapes else [a.shape[1]]
        if any(d % a.w4a16 for d in dims):
            p.error(f"--w4a16 {a.w4a16}: every linear weight's input size must be a multiple")
    per_layer = layer_tensors(a.fp8_block is not None, a.w4a16 is not None)

    if a.tensors_per_file is not None:
        if a.tensors_per_file < 1:
            p.error("--tensors-per-file must be >= 1")
        total = a.files * a.tensors_per_file
        layers = max(math.ceil((total - 3) / len(per_layer)), 0)
        names = tensor_names(layers, total, per_layer)
        chunks = [names[i * a.tensors_per_file : (i + 1) * a.tensors_per_file]
                  for i in range(a.files)]
    else:
        if a.layers < 0:
            p.error("--layers must be >= 0")
        layers = a.layers
        names = tensor_names(layers, per_layer=per_layer)
        if a.files > len(names):
            p.error(f"--files {a.files} exceeds the {len(names)} tensors of {layers} layers")
        chunks = split_even(names, a.files)

    os.makedirs(a.out, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": a.hidden_size,
        "intermediate_size": a.intermediate_size,
        "num_attention_heads": a.num_attention_heads,
        "num_key_value_heads": a.num_key_value_heads,
        "num_hidden_layers": layers,
        "vocab_size": a.vocab_size,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": TORCH_DTYPE.get(a.dtype, "bfloat16"),
    }
    if a.fp8_block is not None:
        config["quantization_config"] = {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "weight_block_size": [a.fp8_block, a.fp8_block],
        }
    if a.w4a16 is not None:
        config["quantization_config"] = {
            "config_groups": {"group_0": {
                "input_activations": None, "output_activations": None, "targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                            "group_size": a.w4a16, "strategy": "group", "block_structure": None,
                            "dynamic": False, "actorder": None, "observer": "minmax",
                            "observer_kwargs": {}},
            }},
            "format": "pack-quantized",
            "ignore": ["lm_head"],
            "kv_cache_scheme": None,
            "quant_method": "compressed-tensors",
            "quantization_status": "compressed",
        }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")

    weight_map, total_size = {}, 0
    for i, chunk in enumerate(chunks):
        fname = f"model-{i + 1:05d}-of-{a.files:05d}.safetensors"
        tensors = [tensor_spec(name, sfx, a) for name, sfx in chunk]
        total_size += write_safetensors(os.path.join(a.out, fname), tensors,
                                        {"format": "pt"}, random_data=a.random)
        for name, _ in chunk:
            weight_map[name] = fname
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total_size}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")

    if not a.quiet:
        print(f"{a.out}: {a.files} files, {len(names)} tensors, {layers} layers, "
              f"{total_size} data bytes ({a.dtype}"
              f"{f', fp8 block {a.fp8_block}' if a.fp8_block else ''}"
              f"{f', w4a16 group {a.w4a16}' if a.w4a16 else ''})", file=sys.stderr)


if __name__ == "__main__":
    main()
