#!/usr/bin/env python3
"""Generate a DeepSeek-V3-shaped safetensors checkpoint (Python standard library only).

Shapes are DeepSeek-V3's (hidden 7168, 128 MLA heads, q_lora 1536, kv_lora 512, rope 64, nope 128,
v 128, intermediate 18432, moe_intermediate 2048, vocab 129280, one shared expert), with --layers
decoder layers of which the first --first-dense are dense, --experts routed experts, optionally in
block FP8 as DeepSeek ships it (--fp8-block 128: every decoder projection F8_E4M3 with an F32
`weight_scale_inv` of [ceil(out/128), ceil(in/128)]; router, correction bias, norms, embedding and
lm_head stay BF16/F32). Data is sparse zeros (header-only: files are extended with truncate(), so
a 671 GB logical checkpoint costs nothing) or random bytes with --random.

Examples:
  gen_deepseek.py --out /tmp/dsv3 --fp8-block 128                      # 61 layers, 256 experts
  gen_deepseek.py --out /tmp/dsv3-small --layers 4 --experts 16 --first-dense 1 --fp8-block 128 --random
"""

import argparse
import json
import math
import os
import struct
import sys

BYTES = {"BF16": 2, "F32": 4, "F8_E4M3": 1}


def layer_tensors(i, a):
    """(name, shape, linear) of decoder layer i, in checkpoint name order."""
    H, nh = 7168, 128
    p = f"model.layers.{i}."
    out = [
        (p + "input_layernorm.weight", [H], False),
        (p + "post_attention_layernorm.weight", [H], False),
        (p + "self_attn.q_a_proj.weight", [1536, H], True),
        (p + "self_attn.q_a_layernorm.weight", [1536], False),
        (p + "self_attn.q_b_proj.weight", [nh * 192, 1536], True),
        (p + "self_attn.kv_a_proj_with_mqa.weight", [512 + 64, H], True),
        (p + "self_attn.kv_a_layernorm.weight", [512], False),
        (p + "self_attn.kv_b_proj.weight", [nh * 256, 512], True),
        (p + "self_attn.o_proj.weight", [H, nh * 128], True),
    ]
    if i < a.first_dense:
        out += [
            (p + "mlp.gate_proj.weight", [18432, H], True),
            (p + "mlp.up_proj.weight", [18432, H], True),
            (p + "mlp.down_proj.weight", [H, 18432], True),
        ]
    else:
        out += [
            (p + "mlp.gate.weight", [a.experts, H], False),
            (p + "mlp.gate.e_score_correction_bias", [a.experts], False),
            (p + "mlp.shared_experts.gate_proj.weight", [2048, H], True),
            (p + "mlp.shared_experts.up_proj.weight", [2048, H], True),
            (p + "mlp.shared_experts.down_proj.weight", [H, 2048], True),
        ]
        for e in range(a.experts):
            q = f"{p}mlp.experts.{e}."
            out += [
                (q + "gate_proj.weight", [2048, H], True),
                (q + "up_proj.weight", [2048, H], True),
                (q + "down_proj.weight", [H, 2048], True),
            ]
    return out


def all_tensors(a):
    """(name, dtype, shape) of the whole checkpoint."""
    out = [("model.embed_tokens.weight", "BF16", [a.vocab_size, 7168])]
    for i in range(a.layers):
        for name, shape, linear in layer_tensors(i, a):
            if name.endswith("e_score_correction_bias"):
                out.append((name, "F32", shape))
            elif linear and a.fp8_block:
                b = a.fp8_block
                out.append((name, "F8_E4M3", shape))
                scale = [math.ceil(shape[0] / b), math.ceil(shape[1] / b)]
                out.append((name.replace(".weight", ".weight_scale_inv"), "F32", scale))
            else:
                out.append((name, "BF16", shape))
    out += [("model.norm.weight", "BF16", [7168]), ("lm_head.weight", "BF16", [a.vocab_size, 7168])]
    return out


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
    p.add_argument("--layers", type=int, default=61)
    p.add_argument("--first-dense", type=int, default=3)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--vocab-size", type=int, default=129280)
    p.add_argument("--files", type=int, default=0, help="default: one per layer, plus one")
    p.add_argument("--fp8-block", type=int, default=0, help="block FP8 with this block size (0: bf16)")
    p.add_argument("--random", action="store_true", help="random data instead of sparse zeros")
    a = p.parse_args(argv)
    if a.layers < 1 or a.experts < 1 or a.first_dense < 0 or a.fp8_block < 0 or a.vocab_size < 1:
        p.error("--layers and --experts must be >= 1, --first-dense and --fp8-block >= 0")
    os.makedirs(a.out, exist_ok=True)
    tensors = all_tensors(a)
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
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_hidden_layers": a.layers, "num_attention_heads": 128, "num_key_value_heads": 128,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "n_routed_experts": a.experts, "n_shared_experts": 1,
        "num_experts_per_tok": 8, "first_k_dense_replace": a.first_dense, "moe_layer_freq": 1,
        "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "scoring_func": "sigmoid",
        "routed_scaling_factor": 2.5, "norm_topk_prob": True, "num_nextn_predict_layers": 1,
        "vocab_size": a.vocab_size, "max_position_embeddings": 163840, "rms_norm_eps": 1e-06,
        "rope_theta": 10000, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }
    if a.fp8_block:
        config["quantization_config"] = {
            "quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
            "weight_block_size": [a.fp8_block, a.fp8_block],
        }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"{a.out}: {len(chunks)} files, {len(tensors)} tensors, {total} data bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
