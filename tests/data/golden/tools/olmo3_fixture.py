#!/usr/bin/env python3
"""Write the fixture olmo3_synth with transformers (the venv vLLM 0.33 runs in):

    olmo3_fixture.py OUT_DIR

A tiny OLMo 3 (Olmo3ForCausalLM), which vLLM 0.33 builds with its Transformers modeling backend.
Its expected folder was made with real vLLM 0.33 on the CPU: `tools/vllm_reload.py OUT_DIR --tp 2
--load-format safetensors --oracle-meta --dump DIR`, then `digest.py DIR DEST`."""
import sys, torch
from transformers import Olmo3Config, Olmo3ForCausalLM
out = sys.argv[1]
torch.manual_seed(0)
c = Olmo3Config(vocab_size=300, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, sliding_window=64,
    layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=False,
    pad_token_id=1, eos_token_id=2, architectures=["Olmo3ForCausalLM"])
c.dtype = torch.bfloat16
m = Olmo3ForCausalLM(c).to(torch.bfloat16)
with torch.no_grad():
    for n, p in m.named_parameters():
        p.copy_(torch.randn_like(p, dtype=torch.float32).to(p.dtype))
m.save_pretrained(out, max_shard_size="60KB")
print([ (n, tuple(p.shape)) for n, p in m.named_parameters()])
