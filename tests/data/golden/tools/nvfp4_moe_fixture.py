#!/usr/bin/env python3
"""Write the fixtures nvfp4_moe_modelopt and nvfp4_moe_ct (Python standard library only):

    nvfp4_moe_fixture.py OUT_DIR mo|ct

the one-layer Qwen3-MoE of tests/it/formats/nvfp4.rs (`nvfp4_moe`: 4 experts, hidden 64, expert
intermediate 64, attention and router unquantized) in ModelOpt NVFP4 (`mo`) or in
compressed-tensors nvfp4-pack-quantized (`ct`, as ct_nvfp4.rs `ct_moe` renames it), byte for byte
the same tensors. Their expected folders were made with real vLLM 0.33 on the CPU:
`tools/vllm_reload.py FIXTURE --tp 2 --enable-expert-parallel --load-format safetensors
--oracle-meta --dump DIR [--moe-backend flashinfer_trtllm]`, then `digest.py DIR DEST`."""
import json, os, struct, sys

def write_st(path, specs):
    header, blobs, off = {}, [], 0
    for name, dt, shape, data in specs:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data); blobs.append(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h))); f.write(h); [f.write(b) for b in blobs]

def main(out, fmt):
    assert fmt in ("mo", "ct"), __doc__
    os.makedirs(out, exist_ok=True)
    h, i, e = 64, 64, 4
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": h, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_experts": e, "num_experts_per_tok": 2, "moe_intermediate_size": i,
        "intermediate_size": 128, "vocab_size": 64, "num_hidden_layers": 1,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "dtype": "bfloat16"}
    specs = [("model.embed_tokens.weight", "BF16", [64, h]), ("model.norm.weight", "BF16", [h]),
             ("lm_head.weight", "BF16", [64, h])]
    l = "model.layers.0"
    for p, n in [("q_proj", 64), ("k_proj", 32), ("v_proj", 32)]:
        specs.append((f"{l}.self_attn.{p}.weight", "BF16", [n, h]))
    specs += [(f"{l}.self_attn.o_proj.weight", "BF16", [h, 64]),
              (f"{l}.self_attn.q_norm.weight", "BF16", [16]),
              (f"{l}.self_attn.k_norm.weight", "BF16", [16]),
              (f"{l}.mlp.gate.weight", "BF16", [e, h]),
              (f"{l}.input_layernorm.weight", "BF16", [h]),
              (f"{l}.post_attention_layernorm.weight", "BF16", [h])]
    for x in range(e):
        p = f"{l}.mlp.experts.{x}"
        for proj, n, k in [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)]:
            specs += [(f"{p}.{proj}.weight", "U8", [n, k // 2]),
                      (f"{p}.{proj}.weight_scale", "F8_E4M3", [n, k // 16]),
                      (f"{p}.{proj}.weight_scale_2", "F32", []),
                      (f"{p}.{proj}.input_scale", "F32", [])]
    full = []
    for k, (name, dt, shape) in enumerate(specs):
        width = {"BF16": 2, "F32": 4}.get(dt, 1)
        n = 1
        for s in shape: n *= s
        n = max(n, 1) * width
        data = bytes(((b * 31 + k * 7) % 251) & 0x77 for b in range(n))
        if fmt == "ct" and ".experts." in name:
            module, last = name.rsplit(".", 1)
            last, shape = {"weight": ("weight_packed", shape), "weight_scale_2": ("weight_global_scale", [1]),
                           "input_scale": ("input_global_scale", [1])}.get(last, (last, shape))
            name = f"{module}.{last}"
        full.append((name, dt, shape, data))
    if fmt == "ct":
        args = lambda d: {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                          "symmetric": True, "dynamic": d}
        cfg["quantization_config"] = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "quantization_status": "compressed",
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*mlp\\.gate$"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": args(False),
                                          "input_activations": args("local")}}}
    else:
        json.dump({"producer": {"name": "modelopt", "version": "0.23.0"},
                   "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                                    "exclude_modules": ["lm_head", "model.layers.0.self_attn*", "model.layers.0.mlp.gate"]}},
                  open(os.path.join(out, "hf_quant_config.json"), "w"), indent=2)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    write_st(os.path.join(out, "model.safetensors"), full)

if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
