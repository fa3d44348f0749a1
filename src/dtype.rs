//! Element types as safetensors spells them.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

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
    pub fn to_safetensors(self) -> safetensors::Dtype {
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
    pub fn as_str(self) -> &'static str {
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

    /// Bits per element; sub-byte types (F4, F6) are packed.
    pub fn bits(self) -> u64 {
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

/// Every dtype name, for error messages that list what is accepted.
pub fn known_names() -> String {
    Dtype::ALL.map(Dtype::as_str).join(", ")
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

    #[test]
    fn packed_sizes_must_be_whole_bytes() {
        assert_eq!(Dtype::F4.byte_size(4), Some(2));
        assert_eq!(Dtype::F4.byte_size(3), None);
        assert_eq!(Dtype::Bf16.byte_size(3), Some(6));
        assert_eq!(Dtype::F64.byte_size(u64::MAX), None);
    }
}
