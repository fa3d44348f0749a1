#!/usr/bin/env python3
"""Generate a gpt-oss-120b-shaped MXFP4 safetensors checkpoint (Python standard library only).

Shapes are gpt-oss-120b's (hidden 2880, intermediate 2880, 64 heads of 64, 8 kv heads, vocab
201088) with --layers decoder layers of --experts experts each, shipped as openai/gpt-oss-* ship
them: `mlp.experts.gate_up_proj_blocks` U8 [E, 2I, H/32, 16], `gate_up_proj_scales` U8
[E, 2I, H/32], `down_proj_blocks` U8 [E, H, I/32, 16], `down_proj_scales` U8 [E, H, I/32], BF16
expert biases, BF16 attention, router, norms, embedding and lm_head; config.json with
`quantization_config: {quant_method: mxfp4, modules_to_not_convert: [...]}`. Data is sparse zeros
(header-only: files are extended with truncate()) or random bytes with --random.

Examples:
  gen_gpt_oss.py --out /tmp/gpt-oss-120b-like                              # 36 layers, 128 experts
  gen_gpt_oss.py --out /tmp/gpt-oss-small --layers 2 --vocab-size 32000 --random
"""

import argparse
import json
import math
import os
import struct
import sys

BYTES = {"BF16": 2, "U8": 1}
H, I, HEADS, KV, HD = 2880, 2880, 64, 8, 64


def layer_tensors(i, e):
    """(name, dtype, shape) of decoder layer i, in checkpoint name order."""
    p = f"model.layers.{i}."
    x = p + "mlp.experts."
    return [
        (p + "input_layernorm.weight", "BF16", [H]),
        (x + "down_proj_bias", "BF16", [e, H]),
        (x + "down_proj_blocks", "U8", [e, H, I // 32, 16]),
        (x + "down_proj_scales", "U8", [e, H, I // 32]),
        (x + "gate_up_proj_bias", "BF16", [e, 2 * I]),
        (x + "gate_up_proj_blocks", "U8", [e, 2 * I, H // 32, 16]),
        (x + "gate_up_proj_scales", "U8", [e, 2 * I, H // 32]),
        (p + "mlp.router.bias", "BF16", [e]),
        (p + "mlp.router.weight", "BF16", [e, H]),
        (p + "post_attention_layernorm.weight", "BF16", [H]),
        (p + "self_attn.k_proj.bias", "BF16", [KV * HD]),
        (p + "self_attn.k_proj.weight", "BF16", [KV * HD, H]),
        (p + "self_attn.o_proj.bias", "BF16", [H]),
        (p + "self_attn.o_proj.weight", "BF16", [H, HEADS * HD]),
        (p + "self_attn.q_proj.bias", "BF16", [HEADS * HD]),
        (p + "self_attn.q_proj.weight", "BF16", [HEADS * HD, H]),
        (p + "self_attn.sinks", "BF16", [HEADS]),
        (p + "self_attn.v_proj.bias", "BF16", [KV * HD]),
        (p + "self_attn.v_proj.weight", "BF16", [KV * HD, H]),
    ]


def write_file(path, tensors, random_data):
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape in tensors:
        n = math.prod(shape) * BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj)
        if random_data:
            left = off
            while left:
                k = min(left, 64 << 20)
                f.write(os.urandom(k))
                left -= k
        else:
            f.truncate(8 + len(hj) + off)
    return off


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=201088)
    p.add_argument("--files", type=int, default=0, help="default: one per layer, plus one")
    p.add_argument("--random", action="store_true", help="random data instead of sparse zeros")
    a = p.parse_args(argv)
    if a.layers < 1 or a.experts < 1 or a.vocab_size < 1:
        p.error("--layers, --experts and --vocab-size must be >= 1")
    os.makedirs(a.out, exist_ok=True)
    tensors = [("model.embed_tokens.weight", "BF16", [a.vocab_size, H])]
    for i in range(a.layers):
        tensors += layer_tensors(i, a.experts)
    tensors += [("model.norm.weight", "BF16", [H]), ("lm_head.weight", "BF16", [a.vocab_size, H])]
    files = a.files or a.layers + 1
    per = math.ceil(len(tensors) / files)
    weight_map, total = {}, 0
    chunks = [tensors[k:k + per] for k in range(0, len(tensors), per)]
    for k, chunk in enumerate(chunks):
        fname = f"model-{k + 1:05d}-of-{len(chunks):05d}.safetensors"
        total += write_file(os.path.join(a.out, fname), chunk, a.random)
        weight_map.update({name: fname for name, _, _ in chunk})
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    config = {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
        "hidden_size": H, "intermediate_size": I, "num_hidden_layers": a.layers,
        "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HD,
        "num_local_experts": a.experts, "num_experts_per_tok": 4, "vocab_size": a.vocab_size,
        "attention_bias": True, "hidden_act": "silu", "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-05, "sliding_window": 128, "swiglu_limit": 7.0,
        "layer_types": ["sliding_attention", "full_attention"] * (a.layers // 2)
        + ["sliding_attention"] * (a.layers % 2),
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "quantization_config": {
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                       "model.embed_tokens", "lm_head"],
            "quant_method": "mxfp4",
        },
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"{a.out}: {len(chunks)} files, {len(tensors)} tensors, {total} data bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
