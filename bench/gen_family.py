#!/usr/bin/env python3
"""Generate header-only checkpoints shaped like 2026's flagships (Python standard library only).

  gen_family.py qwen3_5 --out DIR   # Qwen3.5-397B-A17B: 60 layers (3 Gated-DeltaNet : 1 gated
                                    # attention), 512 experts + shared, vision tower 27 blocks
  gen_family.py minimax_m2 --out DIR  # MiniMax-M2: 62 layers, 256 experts, block FP8 128x128

Names and dtypes are those of the released checkpoints (per-expert tensors as transformers writes
them), shapes from their config.json. Data is sparse zeros: files are extended with truncate(), so
a 790 GB logical checkpoint costs nothing on disk. --layers and --experts shrink it for a quick run.
"""

import argparse
import json
import math
import os
import sys

from gen_deepseek import write_file  # one writer of sparse safetensors files for every generator

QWEN35 = {  # Qwen/Qwen3.5-397B-A17B text_config
    "hidden_size": 4096, "num_hidden_layers": 60, "num_attention_heads": 32,
    "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16,
    "linear_num_value_heads": 64, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "num_experts": 512, "num_experts_per_tok": 10,
    "moe_intermediate_size": 1024, "shared_expert_intermediate_size": 1024, "vocab_size": 248320,
    "full_attention_interval": 4, "attn_output_gate": True, "rms_norm_eps": 1e-06,
    "hidden_act": "silu", "max_position_embeddings": 262144, "mlp_only_layers": [],
    "tie_word_embeddings": False, "model_type": "qwen3_5_moe_text", "attention_bias": False,
    "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10],
                        "partial_rotary_factor": 0.25, "rope_theta": 10000000, "rope_type": "default"},
}
QWEN35_VISION = {
    "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
    "out_hidden_size": 4096, "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
    "in_channels": 3, "num_position_embeddings": 2304, "deepstack_visual_indexes": [],
    "hidden_act": "gelu_pytorch_tanh", "model_type": "qwen3_5_moe_vision",
}
MINIMAX_M2 = {  # MiniMaxAI/MiniMax-M2
    "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2", "hidden_size": 3072,
    "intermediate_size": 1536, "num_hidden_layers": 62, "num_attention_heads": 48,
    "num_key_value_heads": 8, "head_dim": 128, "num_local_experts": 256, "num_experts_per_tok": 8,
    "vocab_size": 200064, "rotary_dim": 64, "rope_theta": 5000000, "max_position_embeddings": 196608,
    "scoring_func": "sigmoid", "use_routing_bias": True, "use_qk_norm": True,
    "qk_norm_type": "per_layer", "rms_norm_eps": 1e-06, "hidden_act": "silu",
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "float8_e4m3fn",
                            "weight_block_size": [128, 128],
                            "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"]},
}


def qwen35_tensors(a):
    c = QWEN35
    H, E, I = c["hidden_size"], a.experts, c["moe_intermediate_size"]
    key = c["linear_num_key_heads"] * c["linear_key_head_dim"]
    value = c["linear_num_value_heads"] * c["linear_value_head_dim"]
    nv, K = c["linear_num_value_heads"], c["linear_conv_kernel_dim"]
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    out = [("model.language_model.embed_tokens.weight", [c["vocab_size"], H])]
    for i in range(a.layers):
        p = f"model.language_model.layers.{i}."
        out += [(p + "input_layernorm.weight", [H]), (p + "post_attention_layernorm.weight", [H])]
        if (i + 1) % c["full_attention_interval"]:
            q = p + "linear_attn."
            out += [
                (q + "A_log", [nv]), (q + "dt_bias", [nv]),
                (q + "conv1d.weight", [2 * key + value, 1, K]),
                (q + "in_proj_qkv.weight", [2 * key + value, H]), (q + "in_proj_z.weight", [value, H]),
                (q + "in_proj_a.weight", [nv, H]), (q + "in_proj_b.weight", [nv, H]),
                (q + "norm.weight", [c["linear_value_head_dim"]]), (q + "out_proj.weight", [H, value]),
            ]
        else:
            q = p + "self_attn."
            out += [
                (q + "q_proj.weight", [2 * nh * hd, H]), (q + "k_proj.weight", [nkv * hd, H]),
                (q + "v_proj.weight", [nkv * hd, H]), (q + "o_proj.weight", [H, nh * hd]),
                (q + "q_norm.weight", [hd]), (q + "k_norm.weight", [hd]),
            ]
        m = p + "mlp."
        S = c["shared_expert_intermediate_size"]
        out += [
            (m + "gate.weight", [E, H]), (m + "shared_expert_gate.weight", [1, H]),
            (m + "shared_expert.gate_proj.weight", [S, H]), (m + "shared_expert.up_proj.weight", [S, H]),
            (m + "shared_expert.down_proj.weight", [H, S]),
        ]
        for e in range(E):
            out += [(f"{m}experts.{e}.gate_proj.weight", [I, H]), (f"{m}experts.{e}.up_proj.weight", [I, H]),
                    (f"{m}experts.{e}.down_proj.weight", [H, I])]
    out += [("model.language_model.norm.weight", [H]), ("lm_head.weight", [c["vocab_size"], H])]
    v = QWEN35_VISION
    vh, vi, P, T = v["hidden_size"], v["intermediate_size"], v["patch_size"], v["temporal_patch_size"]
    out += [("model.visual.patch_embed.proj.weight", [vh, v["in_channels"], T, P, P]),
            ("model.visual.patch_embed.proj.bias", [vh]),
            ("model.visual.pos_embed.weight", [v["num_position_embeddings"], vh])]
    for b in range(v["depth"]):
        p = f"model.visual.blocks.{b}."
        out += [(p + "norm1.weight", [vh]), (p + "norm1.bias", [vh]), (p + "norm2.weight", [vh]),
                (p + "norm2.bias", [vh]), (p + "attn.qkv.weight", [3 * vh, vh]), (p + "attn.qkv.bias", [3 * vh]),
                (p + "attn.proj.weight", [vh, vh]), (p + "attn.proj.bias", [vh]),
                (p + "mlp.linear_fc1.weight", [vi, vh]), (p + "mlp.linear_fc1.bias", [vi]),
                (p + "mlp.linear_fc2.weight", [vh, vi]), (p + "mlp.linear_fc2.bias", [vh])]
    merged = vh * v["spatial_merge_size"] ** 2
    out += [("model.visual.merger.norm.weight", [vh]), ("model.visual.merger.norm.bias", [vh]),
            ("model.visual.merger.linear_fc1.weight", [merged, merged]),
            ("model.visual.merger.linear_fc1.bias", [merged]),
            ("model.visual.merger.linear_fc2.weight", [v["out_hidden_size"], merged]),
            ("model.visual.merger.linear_fc2.bias", [v["out_hidden_size"]])]
    tensors = [(n, "BF16", s) for n, s in out]
    text = dict(QWEN35, num_hidden_layers=a.layers, num_experts=E,
                layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                             for i in range(a.layers)])
    config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
              "text_config": text, "vision_config": QWEN35_VISION, "tie_word_embeddings": False,
              "image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
              "vision_end_token_id": 248054, "dtype": "bfloat16"}
    return tensors, config


def minimax_tensors(a):
    c = MINIMAX_M2
    H, E, I = c["hidden_size"], a.experts, c["intermediate_size"]
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    out = [("model.embed_tokens.weight", "BF16", [c["vocab_size"], H])]

    def fp8(name, shape):
        b = 128
        return [(name, "F8_E4M3", shape),
                (name.replace(".weight", ".weight_scale_inv"), "F32",
                 [math.ceil(shape[0] / b), math.ceil(shape[1] / b)])]
    for i in range(a.layers):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", "BF16", [H]), (p + "post_attention_layernorm.weight", "BF16", [H])]
        out += fp8(p + "self_attn.q_proj.weight", [nh * hd, H]) + fp8(p + "self_attn.k_proj.weight", [nkv * hd, H])
        out += fp8(p + "self_attn.v_proj.weight", [nkv * hd, H]) + fp8(p + "self_attn.o_proj.weight", [H, nh * hd])
        out += [(p + "self_attn.q_norm.weight", "BF16", [nh * hd]), (p + "self_attn.k_norm.weight", "BF16", [nkv * hd])]
        m = p + "block_sparse_moe."
        out += [(m + "gate.weight", "BF16", [E, H]), (m + "e_score_correction_bias", "F32", [E])]
        for e in range(E):
            out += fp8(f"{m}experts.{e}.w1.weight", [I, H]) + fp8(f"{m}experts.{e}.w3.weight", [I, H])
            out += fp8(f"{m}experts.{e}.w2.weight", [H, I])
    out += [("model.norm.weight", "BF16", [H]), ("lm_head.weight", "BF16", [c["vocab_size"], H])]
    config = dict(c, num_hidden_layers=a.layers, num_local_experts=E, attn_type_list=[1] * a.layers)
    return out, config


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("family", choices=["qwen3_5", "minimax_m2"])
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=0, help="default: the model's")
    p.add_argument("--experts", type=int, default=0, help="default: the model's")
    p.add_argument("--files", type=int, default=0, help="default: one per layer, plus one")
    a = p.parse_args(argv)
    base = QWEN35 if a.family == "qwen3_5" else MINIMAX_M2
    a.layers = a.layers or base["num_hidden_layers"]
    a.experts = a.experts or base.get("num_experts") or base["num_local_experts"]
    tensors, config = (qwen35_tensors if a.family == "qwen3_5" else minimax_tensors)(a)
    os.makedirs(a.out, exist_ok=True)
    files = a.files or a.layers + 1
    per = math.ceil(len(tensors) / files)
    chunks = [tensors[k:k + per] for k in range(0, len(tensors), per)]
    weight_map, total = {}, 0
    for k, chunk in enumerate(chunks):
        fname = f"model-{k + 1:05d}-of-{len(chunks):05d}.safetensors"
        total += write_file(os.path.join(a.out, fname), chunk, random_data=False)
        weight_map.update({name: fname for name, _, _ in chunk})
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"{a.out}: {len(chunks)} files, {len(tensors)} tensors, {total} data bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
