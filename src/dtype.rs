//! Element types as safetensors spells them.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

/// `torch.finfo(torch.float32).min`: vLLM's initial value of linear scales, which its
/// post-processing reads as "not loaded".
pub(crate) const F32_MIN: f64 = f32::MIN as f64;

/// A safetensors element type. The set, the spellings and the declaration order are those of
/// safetensors 0.8: the order matters, because safetensors writes tensors sorted by dtype (this
/// order, descending) then name, and wload's files must be byte-identical to vLLM's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    Bool,
    F4,
    F6E2M3,
    F6E3M2,
    U8,
    I8,
    F8E5M2,
    F8E4M3,
    F8E8M0,
    F8E4M3Fnuz,
    F8E5M2Fnuz,
    I16,
    U16,
    F16,
    Bf16,
    I32,
    U32,
    F32,
    C64,
    F64,
    I64,
    U64,
}

impl Dtype {
    /// wload's dtype as the `safetensors` crate spells it: the same 22 types (dtype.rs follows
    /// safetensors 0.8), so the header writer can use the crate's types and the reader can map back.
    pub(crate) fn to_safetensors(self) -> safetensors::Dtype {
        use safetensors::Dtype as S;
        match self {
            Dtype::Bool => S::BOOL,
            Dtype::F4 => S::F4,
            Dtype::F6E2M3 => S::F6_E2M3,
            Dtype::F6E3M2 => S::F6_E3M2,
            Dtype::U8 => S::U8,
            Dtype::I8 => S::I8,
            Dtype::F8E5M2 => S::F8_E5M2,
            Dtype::F8E4M3 => S::F8_E4M3,
            Dtype::F8E8M0 => S::F8_E8M0,
            Dtype::F8E4M3Fnuz => S::F8_E4M3FNUZ,
            Dtype::F8E5M2Fnuz => S::F8_E5M2FNUZ,
            Dtype::I16 => S::I16,
            Dtype::U16 => S::U16,
            Dtype::F16 => S::F16,
            Dtype::Bf16 => S::BF16,
            Dtype::I32 => S::I32,
            Dtype::U32 => S::U32,
            Dtype::F32 => S::F32,
            Dtype::C64 => S::C64,
            Dtype::F64 => S::F64,
            Dtype::I64 => S::I64,
            Dtype::U64 => S::U64,
        }
    }

    pub const ALL: [Dtype; 22] = [
        Dtype::Bool,
        Dtype::F4,
        Dtype::F6E2M3,
        Dtype::F6E3M2,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8E5M2,
        Dtype::F8E4M3,
        Dtype::F8E8M0,
        Dtype::F8E4M3Fnuz,
        Dtype::F8E5M2Fnuz,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::Bf16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::C64,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
    ];

    /// The name in a safetensors header.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::F4 => "F4",
            Dtype::F6E2M3 => "F6_E2M3",
            Dtype::F6E3M2 => "F6_E3M2",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::F8E8M0 => "F8_E8M0",
            Dtype::F8E4M3Fnuz => "F8_E4M3FNUZ",
            Dtype::F8E5M2Fnuz => "F8_E5M2FNUZ",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::Bf16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::C64 => "C64",
            Dtype::F64 => "F64",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
        }
    }

    /// The `torch` attribute naming this type (`"bfloat16"`, `"float8_e4m3fn"`), as
    /// safetensors' torch loader maps a header's dtype: what the Python package tells its
    /// callers (`Tensor.torch_dtype`), so that the vLLM plugin compares a parameter's dtype
    /// without a table of its own. `None` for the sub-byte types, which torch has no
    /// one-element type for (its `float4_e2m1fn_x2` packs two F4 values per element).
    pub fn torch_name(self) -> Option<&'static str> {
        Some(match self {
            Dtype::Bool => "bool",
            Dtype::F4 | Dtype::F6E2M3 | Dtype::F6E3M2 => return None,
            Dtype::U8 => "uint8",
            Dtype::I8 => "int8",
            Dtype::F8E5M2 => "float8_e5m2",
            Dtype::F8E4M3 => "float8_e4m3fn",
            Dtype::F8E8M0 => "float8_e8m0fnu",
            Dtype::F8E4M3Fnuz => "float8_e4m3fnuz",
            Dtype::F8E5M2Fnuz => "float8_e5m2fnuz",
            Dtype::I16 => "int16",
            Dtype::U16 => "uint16",
            Dtype::F16 => "float16",
            Dtype::Bf16 => "bfloat16",
            Dtype::I32 => "int32",
            Dtype::U32 => "uint32",
            Dtype::F32 => "float32",
            Dtype::C64 => "complex64",
            Dtype::F64 => "float64",
            Dtype::I64 => "int64",
            Dtype::U64 => "uint64",
        })
    }

    /// A 16-, 32- or 64-bit float: what unquantized weights are stored as (FP8 and the packed
    /// integer types are quantized).
    pub(crate) fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::Bf16 | Dtype::F32 | Dtype::F64)
    }

    /// Bits per element; sub-byte types (F4, F6) are packed.
    pub(crate) fn bits(self) -> u64 {
        match self {
            Dtype::F4 => 4,
            Dtype::F6E2M3 | Dtype::F6E3M2 => 6,
            Dtype::Bool | Dtype::U8 | Dtype::I8 => 8,
            Dtype::F8E5M2 | Dtype::F8E4M3 | Dtype::F8E8M0 => 8,
            Dtype::F8E4M3Fnuz | Dtype::F8E5M2Fnuz => 8,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::Bf16 => 16,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 32,
            Dtype::C64 | Dtype::F64 | Dtype::I64 | Dtype::U64 => 64,
        }
    }

    /// Bytes that `numel` elements take, or `None` when that is not a whole number of bytes
    /// (packed types) or overflows.
    pub fn byte_size(self, numel: u64) -> Option<u64> {
        let bits = numel.checked_mul(self.bits())?;
        (bits % 8 == 0).then_some(bits / 8)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Dtype {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        Dtype::ALL.into_iter().find(|d| d.as_str() == s).ok_or(())
    }
}

impl Serialize for Dtype {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// As [`Serialize`] writes it: one of the names in [`Dtype::ALL`].
impl schemars::JsonSchema for Dtype {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Dtype".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let names: Vec<&str> = Dtype::ALL.iter().map(|d| d.as_str()).collect();
        schemars::json_schema!({ "type": "string", "enum": names })
    }
}

/// The dtype every one of `dtypes` casts to without loss, as vLLM picks a model's dtype when its
/// config states none (`common_broadcastable_dtype`, vllm/utils/torch_utils.py:389: the dtype
/// most of the others cast to losslessly). `None` when there is none to pick from. Where two tie
/// (bfloat16 and float16 without float32) vLLM's pick follows Python's set order; wload takes
/// the one later in [`Dtype::ALL`] (bfloat16 before float16).
pub(crate) fn common_lossless(dtypes: impl IntoIterator<Item = Dtype>) -> Option<Dtype> {
    let mut set: Vec<Dtype> = dtypes.into_iter().filter(|d| range(*d).is_some()).collect();
    set.sort_unstable_by_key(|d| std::cmp::Reverse(*d as u8));
    set.dedup();
    let score = |to: Dtype| set.iter().filter(|&&from| lossless(from, to)).count();
    // max_by_key keeps the last of equal maxima; the first is wanted.
    set.iter().copied().rev().max_by_key(|&d| score(d))
}

/// torch's `is_lossless_cast` (torch_utils.py:358): a lower kind (bool < integer < float <
/// complex) always casts up, never down; within a kind the target's range must hold the source's,
/// and a float's resolution must be as fine.
fn lossless(from: Dtype, to: Dtype) -> bool {
    let (Some(a), Some(b)) = (range(from), range(to)) else {
        return false;
    };
    if from == to || a.kind < b.kind {
        return true;
    }
    a.kind == b.kind && a.min >= b.min && a.max <= b.max && a.resolution >= b.resolution
}

/// torch's `iinfo` / `finfo` of a dtype safetensors' torch loader knows; `None` for the types it
/// has no torch dtype for (4- and 6-bit floats).
struct Range {
    /// 0 bool, 1 integer, 2 float, 3 complex (torch_utils.py:353).
    kind: u8,
    min: f64,
    max: f64,
    /// finfo's resolution (10^-precision); 0 for integers.
    resolution: f64,
}

fn range(d: Dtype) -> Option<Range> {
    let int = |min: f64, max: f64| Range {
        kind: 1,
        min,
        max,
        resolution: 0.0,
    };
    let float = |max: f64, resolution: f64| Range {
        kind: 2,
        min: -max,
        max,
        resolution,
    };
    Some(match d {
        Dtype::Bool => Range {
            kind: 0,
            min: 0.0,
            max: 1.0,
            resolution: 0.0,
        },
        Dtype::U8 => int(0.0, 255.0),
        Dtype::I8 => int(-128.0, 127.0),
        Dtype::U16 => int(0.0, 65535.0),
        Dtype::I16 => int(-32768.0, 32767.0),
        Dtype::U32 => int(0.0, 4294967295.0),
        Dtype::I32 => int(-2147483648.0, 2147483647.0),
        Dtype::U64 => int(0.0, 18446744073709551615.0),
        Dtype::I64 => int(-9223372036854775808.0, 9223372036854775807.0),
        Dtype::F8E4M3 => float(448.0, 1.0),
        Dtype::F8E4M3Fnuz => float(240.0, 1.0),
        Dtype::F8E5M2 | Dtype::F8E5M2Fnuz => float(57344.0, 1.0),
        Dtype::F8E8M0 => Range {
            kind: 2,
            min: 5.877471754111438e-39,
            max: 1.7014118346046923e38,
            resolution: 1.0,
        },
        Dtype::F16 => float(65504.0, 1e-3),
        Dtype::Bf16 => float(3.3895313892515355e38, 1e-2),
        Dtype::F32 => float(3.4028234663852886e38, 1e-6),
        Dtype::F64 => float(f64::MAX, 1e-15),
        Dtype::C64 => Range {
            kind: 3,
            ..float(3.4028234663852886e38, 1e-6)
        },
        Dtype::F4 | Dtype::F6E2M3 | Dtype::F6E3M2 => return None,
    })
}

/// Every dtype name, for error messages that list what is accepted.
pub(crate) fn known_names() -> String {
    Dtype::ALL.map(Dtype::as_str).join(", ")
}

/// `--dtype`, as vLLM spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DtypeChoice {
    /// The config's dtype; float32 becomes bfloat16 (as vLLM on GPUs that support it).
    Auto,
    Bfloat16,
    Float16,
    Float32,
}

impl DtypeChoice {
    /// vLLM's spelling (`bfloat16`), as `--dtype` takes it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DtypeChoice::Auto => "auto",
            DtypeChoice::Bfloat16 => "bfloat16",
            DtypeChoice::Float16 => "float16",
            DtypeChoice::Float32 => "float32",
        }
    }

    /// The `--dtype` that produces files of the safetensors dtype `name` (`BF16`), as a manifest
    /// records it; `None` for one no `--dtype` gives.
    pub(crate) fn recorded(name: &str) -> Option<DtypeChoice> {
        match name.parse().ok()? {
            Dtype::Bf16 => Some(DtypeChoice::Bfloat16),
            Dtype::F16 => Some(DtypeChoice::Float16),
            Dtype::F32 => Some(DtypeChoice::Float32),
            _ => None,
        }
    }
}

/// vLLM's dtype for `--dtype` and the config's dtype field (config/model.py:2423–2465). A config that states
/// none takes the dtype all of `tensors` (the checkpoint's) cast to without loss, as vLLM reads
/// it from the safetensors headers (model_arch_config_convertor.py:221–234): an all-float16
/// checkpoint without `torch_dtype` loads as float16.
pub(crate) fn resolve_dtype(
    choice: DtypeChoice,
    config_dtype: Option<&str>,
    tensors: impl IntoIterator<Item = Dtype>,
) -> Dtype {
    match choice {
        DtypeChoice::Bfloat16 => Dtype::Bf16,
        DtypeChoice::Float16 => Dtype::F16,
        DtypeChoice::Float32 => Dtype::F32,
        DtypeChoice::Auto => {
            let half = match config_dtype {
                Some(d) => matches!(d, "float16" | "half" | "torch.float16"),
                None => common_lossless(tensors) == Some(Dtype::F16),
            };
            // bfloat16 stays; float32 (the default when nothing says) and any other dtype
            // become the platform's preferred bfloat16.
            if half { Dtype::F16 } else { Dtype::Bf16 }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in Dtype::ALL {
            assert_eq!(d.as_str().parse::<Dtype>(), Ok(d));
        }
        assert!("bf16".parse::<Dtype>().is_err());
    }

    /// torch names a type by its element, so every whole-byte type has a name of its own and
    /// its width is torch's `itemsize`.
    #[test]
    fn torch_names_are_distinct_and_whole_byte() {
        let named: Vec<(Dtype, &str)> = (Dtype::ALL.into_iter())
            .filter_map(|d| d.torch_name().map(|n| (d, n)))
            .collect();
        assert_eq!(named.len(), 19);
        for (d, n) in &named {
            assert_eq!(d.bits() % 8, 0, "{d} is named {n}");
            assert_eq!(named.iter().filter(|(_, m)| m == n).count(), 1, "{n} twice");
        }
        assert_eq!(Dtype::Bf16.torch_name(), Some("bfloat16"));
        assert_eq!(Dtype::F8E4M3.torch_name(), Some("float8_e4m3fn"));
        assert_eq!(Dtype::F4.torch_name(), None);
    }

    /// vLLM's pick for a config without a dtype, on the mixes checkpoints ship.
    #[test]
    fn the_common_lossless_dtype_is_vllms() {
        use Dtype::*;
        let pick = |v: &[Dtype]| common_lossless(v.iter().copied());
        assert_eq!(pick(&[F16]), Some(F16));
        assert_eq!(pick(&[Bf16, Bf16]), Some(Bf16));
        assert_eq!(pick(&[F16, I64, Bool]), Some(F16));
        assert_eq!(pick(&[Bf16, F32]), Some(F32));
        assert_eq!(pick(&[F16, F32]), Some(F32));
        assert_eq!(pick(&[F8E4M3, F16]), Some(F16));
        assert_eq!(pick(&[F8E4M3, Bf16, F32]), Some(F32));
        assert_eq!(pick(&[F16, Bf16]), Some(Bf16), "a tie: the wider type");
        assert_eq!(pick(&[F4]), None);
        assert_eq!(pick(&[]), None);
        assert!(lossless(I64, F16) && !lossless(F16, I64));
        assert!(lossless(F16, F32) && !lossless(F32, F16) && !lossless(Bf16, F16));
    }

    #[test]
    fn packed_sizes_must_be_whole_bytes() {
        assert_eq!(Dtype::F4.byte_size(4), Some(2));
        assert_eq!(Dtype::F4.byte_size(3), None);
        assert_eq!(Dtype::Bf16.byte_size(3), Some(6));
        assert_eq!(Dtype::F64.byte_size(u64::MAX), None);
    }
}
