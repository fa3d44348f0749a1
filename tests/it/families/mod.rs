//! Model families on small generated checkpoints, config aliases and defaults, bundled mappings.

mod config_aliases;
mod config_defaults;
mod deepseek;
mod deepseek_v4;
mod dsv32_fp8_wk;
mod glm4_moe;
mod glm5;
mod gpt_oss;
mod kimi;
mod llama4;
mod mamba;
mod mappings;
mod minimax_m2;
mod mistral;
mod mistral_large_3;
mod mla;
mod olmo3;
mod qwen2_moe;
mod qwen3_5;
mod qwen3_5_quant;
mod qwen3_vl;
mod replicate_embed;
mod tied;
mod towers;
mod vlm_text;
