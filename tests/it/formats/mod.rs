//! Formats: fp8 and quantized tensors, pipeline parallel, hub sources, safetensors, file I/O.

mod compressed;
mod ct_nvfp4;
mod fp8;
mod gptq;
pub(crate) mod hub;
mod io;
mod multimodal_flags;
mod mxfp4;
mod nvfp4;
mod pp;
mod safetensors_crate;
mod store;
