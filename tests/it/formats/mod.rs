//! Formats: fp8 and quantized tensors, pipeline parallel, hub sources, safetensors, file I/O.

mod fp8;
pub(crate) mod hub;
mod io;
mod mxfp4;
mod pp;
mod safetensors_crate;
