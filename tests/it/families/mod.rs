//! Model families on small generated checkpoints, config aliases and defaults, bundled mappings.

mod config_aliases;
mod config_defaults;
mod deepseek;
mod glm4_moe;
mod gpt_oss;
mod mappings;
mod mistral;
mod qwen2_moe;
mod qwen3_5;
mod qwen3_vl;
mod tied;
mod vlm_text;
