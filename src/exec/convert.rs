//! Element conversion between the float dtypes, bit-exact with torch's CPU casts (`param.copy_`):
//! round-to-nearest-even, overflow to ±inf, and torch's canonical NaNs.

use half::{bf16, f16};

use crate::dtype::Dtype;

/// Converts `src` (elements of `from`) into `dst` (elements of `to`), appending. Same dtype is a
/// plain copy. Only the float dtypes the planner allows to differ reach the other arms.
pub(crate) fn convert_into(from: Dtype, to: Dtype, src: &[u8], dst: &mut Vec<u8>) {
    if from == to {
        dst.extend_from_slice(src);
        return;
    }
    let n = src.len() / item(from);
    dst.reserve(n * item(to));
    match (from, to) {
        (Dtype::F32, Dtype::Bf16) => {
            for c in src.chunks_exact(4) {
                let x = f32::from_le_bytes(c.try_into().unwrap());
                dst.extend_from_slice(&f32_to_bf16(x).to_le_bytes());
            }
        }
        (Dtype::F32, Dtype::F16) => {
            for c in src.chunks_exact(4) {
                let x = f32::from_le_bytes(c.try_into().unwrap());
                dst.extend_from_slice(&f32_to_f16(x).to_le_bytes());
            }
        }
        _ => {
            for c in src.chunks_exact(item(from)) {
                let x = to_f64(from, c);
                write_f64(to, x, dst);
            }
        }
    }
}

fn item(d: Dtype) -> usize {
    (d.bits() / 8) as usize
}

/// torch's `c10::BFloat16` from float: NaN → 0x7FC0, otherwise round to nearest even.
pub(crate) fn f32_to_bf16(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7FC0;
    }
    let bits = x.to_bits();
    let rounding_bias = 0x7FFF + ((bits >> 16) & 1);
    ((bits + rounding_bias) >> 16) as u16
}

/// torch's vectorized CPU cast of a float tensor to bfloat16 (`cvtfp32_bf16`,
/// ATen/cpu/vec/vec256/vec256_16bit_float.h and vec512_bfloat16.h, every element of a
/// contiguous tensor, its tail too): round to nearest even, as [`f32_to_bf16`], but a NaN of
/// either sign → 0xFFFF (checked against real vLLM 0.33 / torch on an AVX-512 CPU).
pub(crate) fn f32_to_bf16_vectorized(x: f32) -> u16 {
    if x.is_nan() {
        return 0xFFFF;
    }
    f32_to_bf16(x)
}

/// torch's `c10::Half` from float (`fp16_ieee_from_fp32_value`): round to nearest even, NaN →
/// sign | 0x7E00.
pub(crate) fn f32_to_f16(x: f32) -> u16 {
    if x.is_nan() {
        return ((x.to_bits() >> 16) as u16 & 0x8000) | 0x7E00;
    }
    f16::from_f32(x).to_bits()
}

/// torch's `float8_e4m3fn` to float (c10 `fp8e4m3fn_to_fp32_value`): exact; exponent bias 7,
/// subnormals below exponent 1, no infinities, `S.1111.111` NaN.
pub(crate) fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (i32::from((b >> 3) & 0x0F), f32::from(b & 0x07));
    if e == 0x0F && m == 7.0 {
        return f32::NAN;
    }
    let v = if e == 0 {
        m * 2f32.powi(-9)
    } else {
        (8.0 + m) * 2f32.powi(e - 10)
    };
    sign * v
}

/// torch's `float8_e8m0fnu` to float: `2^(x - 127)`, 0xFF NaN (x = 0 is the subnormal
/// 2^-127).
pub(crate) fn e8m0_to_f32(b: u8) -> f32 {
    if b == 0xFF {
        f32::NAN
    } else {
        2f64.powi(i32::from(b) - 127) as f32
    }
}

fn to_f64(d: Dtype, c: &[u8]) -> f64 {
    match d {
        Dtype::Bf16 => bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64(),
        Dtype::F16 => f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64(),
        Dtype::F32 => f32::from_le_bytes(c.try_into().unwrap()) as f64,
        Dtype::F64 => f64::from_le_bytes(c.try_into().unwrap()),
        // compressed-tensors MoE `weight_shape`: int64 copied into a model-dtype parameter.
        Dtype::I64 => i64::from_le_bytes(c.try_into().unwrap()) as f64,
        Dtype::I32 => i32::from_le_bytes(c.try_into().unwrap()) as f64,
        Dtype::F8E4M3 => e4m3_to_f32(c[0]) as f64,
        // A raw U8 scale is read as E8M0, as vLLM views it (deepseek_v2.py:889–891).
        Dtype::F8E8M0 | Dtype::U8 => e8m0_to_f32(c[0]) as f64,
        other => unreachable!("the planner never converts from {other}"),
    }
}

/// torch converts bf16 ↔ f16 and f64 → narrower through f32 on the CPU.
fn write_f64(d: Dtype, x: f64, dst: &mut Vec<u8>) {
    match d {
        Dtype::Bf16 => dst.extend_from_slice(&f32_to_bf16(x as f32).to_le_bytes()),
        Dtype::F16 => dst.extend_from_slice(&f32_to_f16(x as f32).to_le_bytes()),
        Dtype::F32 => dst.extend_from_slice(&(x as f32).to_le_bytes()),
        Dtype::F64 => dst.extend_from_slice(&x.to_le_bytes()),
        // Integer and FP8 parameters are only ever filled with their initial values (zeros of
        // packed weights and padding, NaN of NVFP4 scales): never converted into.
        Dtype::U8 | Dtype::F8E8M0 => dst.push(x as u8),
        Dtype::I8 => dst.push(x as i8 as u8),
        Dtype::I32 => dst.extend_from_slice(&(x as i32).to_le_bytes()),
        Dtype::I64 => dst.extend_from_slice(&(x as i64).to_le_bytes()),
        Dtype::F8E4M3 if x.is_nan() => dst.push(0x7F),
        Dtype::F8E4M3 if x == 0.0 => dst.push(0),
        other => unreachable!("the planner never converts to {other}"),
    }
}

/// `count` elements of `value` in dtype `d`.
pub(crate) fn fill_bytes(d: Dtype, value: f64, count: u64) -> Vec<u8> {
    let mut one = Vec::new();
    write_f64(d, value, &mut one);
    one.repeat(count as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even (1.0).
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3F80);
        // 1 + 3·2^-8 is halfway too, and rounds up to the even neighbour.
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3F82);
        assert_eq!(f32_to_bf16(f32::NAN), 0x7FC0);
        assert_eq!(f32_to_bf16(-0.0), 0x8000);
        assert_eq!(f32_to_bf16(f32::MAX), 0x7F80); // overflows to +inf
    }

    #[test]
    fn f16_overflows_to_infinity() {
        assert_eq!(f32_to_f16(70000.0), 0x7C00);
        assert_eq!(f32_to_f16(1.0), 0x3C00);
        let mut out = Vec::new();
        // bf16 1e5 → f16 goes through f32 and overflows.
        convert_into(
            Dtype::Bf16,
            Dtype::F16,
            &f32_to_bf16(1e5).to_le_bytes(),
            &mut out,
        );
        assert_eq!(out, 0x7C00u16.to_le_bytes());
    }
}
