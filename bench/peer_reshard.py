#!/usr/bin/env python3
"""The peer: a Llama-family TP reshard as users write it today, with safetensors + torch on the CPU.

Reads a Hugging Face checkpoint folder (config.json, *.safetensors), slices every tensor for each
tensor-parallel rank the way vLLM lays it out (fused qkv with kv-head replication, fused gate_up,
row-parallel o/down, vocab padded to 64 and split, attention scale buffers), and saves one
`model-rank-{r}-part-0.safetensors` per rank with `safetensors.torch.save_file`, in vLLM's state_dict
order. Each source tensor is loaded once; all ranks' tensors are kept in memory until saved, as a
straightforward script does.

Usage: peer_reshard.py SRC --tp N --out OUT
"""
import argparse
import glob
import json
import os

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def main():
    p = argparse.ArgumentParser()
    p.add_argument("src")
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    cfg = json.load(open(os.path.join(a.src, "config.json")))
    H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or H // nh
    I, V, L = cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    tp = a.tp
    dt = {"float16": torch.float16}.get(cfg.get("torch_dtype") or cfg.get("dtype"), torch.bfloat16)

    where = {}
    for path in sorted(glob.glob(os.path.join(a.src, "*.safetensors"))):
        with safe_open(path, framework="pt") as f:
            for k in f.keys():
                where[k] = path
    handles = {}

    def get(name):
        path = where[name]
        if path not in handles:
            handles[path] = safe_open(path, framework="pt")
        return handles[path].get_tensor(name).to(dt)

    ranks = [dict() for _ in range(tp)]
    Vp = -(-V // 64) * 64
    per = Vp // tp

    def vocab(name, key):
        w = get(name)
        padded = torch.zeros(Vp, H, dtype=dt)
        padded[:V] = w
        for r in range(tp):
            ranks[r][key] = padded[r * per:(r + 1) * per].clone()

    vocab("model.embed_tokens.weight", "model.embed_tokens.weight")
    q_loc = nh // tp * hd
    kv_loc, reps = (1, tp // nkv) if tp >= nkv else (nkv // tp, 1)
    k_loc = kv_loc * hd
    for i in range(L):
        pre = f"model.layers.{i}."
        q, k, v = (get(pre + f"self_attn.{x}_proj.weight") for x in "qkv")
        o = get(pre + "self_attn.o_proj.weight")
        g, u = get(pre + "mlp.gate_proj.weight"), get(pre + "mlp.up_proj.weight")
        d = get(pre + "mlp.down_proj.weight")
        n1, n2 = get(pre + "input_layernorm.weight"), get(pre + "post_attention_layernorm.weight")
        for r in range(tp):
            kr = r // reps
            sd = ranks[r]
            sd[pre + "self_attn.qkv_proj.weight"] = torch.cat([
                q[r * q_loc:(r + 1) * q_loc], k[kr * k_loc:(kr + 1) * k_loc],
                v[kr * k_loc:(kr + 1) * k_loc]]).contiguous()
            sd[pre + "self_attn.o_proj.weight"] = o[:, r * q_loc:(r + 1) * q_loc].contiguous()
            for s in ("_k_scale", "_v_scale", "_q_scale", "_prob_scale"):
                sd[pre + "self_attn.attn." + s] = torch.tensor(1.0, dtype=torch.float32)
            n = I // tp
            sd[pre + "mlp.gate_up_proj.weight"] = torch.cat(
                [g[r * n:(r + 1) * n], u[r * n:(r + 1) * n]]).contiguous()
            sd[pre + "mlp.down_proj.weight"] = d[:, r * n:(r + 1) * n].contiguous()
            sd[pre + "input_layernorm.weight"] = n1.clone()
            sd[pre + "post_attention_layernorm.weight"] = n2.clone()
    norm = get("model.norm.weight")
    for r in range(tp):
        ranks[r]["model.norm.weight"] = norm.clone()
    vocab("lm_head.weight", "lm_head.weight")

    os.makedirs(a.out, exist_ok=True)
    for r in range(tp):
        save_file(ranks[r], os.path.join(a.out, f"model-rank-{r}-part-0.safetensors"))


if __name__ == "__main__":
    main()
