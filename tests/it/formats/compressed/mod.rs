//! compressed-tensors integer and kv-cache schemes, checked by unpacking what wload writes: a
//! generated pack-quantized Llama (W4A16 and W8A16, symmetric and asymmetric) sharded at several
//! TP sizes, every rank's packed words unpacked and the ranks put back together, gives the
//! checkpoint's unpacked values (`wna16.rs`); a DeepSeek-V3-shaped checkpoint with int4 routed
//! experts likewise, under TP and EP (`experts.rs`); per-head kv scales at TP above the kv head
//! count (`kv_head.rs`); W8A8 INT8 static input scales and zero points, the last-loaded shard's
//! (`int8.rs`); and vLLM's refusals, with its words and the fix (`refusals.rs`). The TP 2
//! golden cases (byte-identical to vLLM) run with the other golden cases.

mod experts;
mod ignore;
mod int8;
mod kv_head;
mod refusals;
mod wna16;

use serde_json::{Value, json};

/// A small deterministic generator (xorshift64*), so that failures reproduce.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// `n` values below `2^bits`.
    pub(super) fn values(&mut self, n: usize, bits: u32) -> Vec<u32> {
        (0..n)
            .map(|_| (self.next() >> 20) as u32 & ((1 << bits) - 1))
            .collect()
    }

    /// `n` distinct-looking BF16 bytes.
    pub(super) fn bf16(&mut self, n: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|_| (0x3C00u16 | (self.next() >> 54) as u16).to_le_bytes())
            .collect()
    }
}

/// `vals` (a row-major `[rows, cols]` of `bits`-bit values) packed `32 / bits` per int32 along
/// `dim` (1: the columns, as `weight_packed`; 0: the rows, as `weight_zero_point`), low bits
/// first (compressed-tensors `pack_to_int32`).
pub(super) fn pack(vals: &[u32], rows: usize, cols: usize, bits: u32, dim: usize) -> Vec<u8> {
    let pf = (32 / bits) as usize;
    let (prow, pcol) = if dim == 1 {
        (rows, cols / pf)
    } else {
        (rows / pf, cols)
    };
    let mut out = Vec::with_capacity(prow * pcol * 4);
    for r in 0..prow {
        for c in 0..pcol {
            let mut word = 0u32;
            for j in 0..pf {
                let (vr, vc) = if dim == 1 {
                    (r, c * pf + j)
                } else {
                    (r * pf + j, c)
                };
                word |= vals[vr * cols + vc] << (j as u32 * bits);
            }
            out.extend_from_slice(&word.to_le_bytes());
        }
    }
    out
}

/// [`pack`] undone: `bytes` of a `[prows, pcols]` int32 tensor, unpacked along `dim`.
pub(super) fn unpack(
    bytes: &[u8],
    shape: &[u64],
    bits: u32,
    dim: usize,
) -> (Vec<u32>, usize, usize) {
    let pf = (32 / bits) as usize;
    let (prow, pcol) = (
        shape[shape.len() - 2] as usize,
        shape[shape.len() - 1] as usize,
    );
    let (rows, cols) = if dim == 1 {
        (prow, pcol * pf)
    } else {
        (prow * pf, pcol)
    };
    let words: Vec<u32> = (bytes.chunks_exact(4))
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let mut vals = vec![0u32; rows * cols];
    let mask = if bits == 32 {
        u32::MAX
    } else {
        (1 << bits) - 1
    };
    for r in 0..prow {
        for c in 0..pcol {
            let w = words[r * pcol + c];
            for j in 0..pf {
                let v = (w >> (j as u32 * bits)) & mask;
                let (vr, vc) = if dim == 1 {
                    (r, c * pf + j)
                } else {
                    (r * pf + j, c)
                };
                vals[vr * cols + vc] = v;
            }
        }
    }
    (vals, rows, cols)
}

/// A pack-quantized `quantization_config`.
pub(super) fn wna16_config(bits: u64, group: Option<u64>, symmetric: bool, ignore: Value) -> Value {
    json!({
        "quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ignore,
        "kv_cache_scheme": null, "quantization_status": "compressed",
        "config_groups": {"group_0": {
            "targets": ["Linear"], "input_activations": null, "output_activations": null,
            "weights": {"num_bits": bits, "type": "int", "symmetric": symmetric,
                        "group_size": group, "strategy": if group.is_some() { "group" } else { "channel" },
                        "dynamic": false, "actorder": null}}}
    })
}
