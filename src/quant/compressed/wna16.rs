//! The weight-only integer group of `format: pack-quantized` (vLLM's `CompressedTensorsWNA16`
//! for linears, `CompressedTensorsWNA16MoEMethod` for experts): 4- or 8-bit integers packed
//! into int32 words, scaled per group of input columns or per output channel, with packed zero
//! points when asymmetric.

use serde_json::Value;

use super::super::{QuantError, USE_UNQUANTIZED, field, refuse};

/// Packed integer weights (W4A16 / W8A16).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wna16 {
    /// 4 or 8: `32 / bits` values per int32 word.
    pub bits: u64,
    /// The input columns one scale covers; `None` for the channel strategy (one scale per row).
    pub group: Option<u64>,
    /// No zero points when symmetric.
    pub symmetric: bool,
}

impl Wna16 {
    /// Values per packed int32 word.
    pub fn pack_factor(&self) -> u64 {
        32 / self.bits
    }

    pub(super) fn parse(group: &Value, at: &dyn Fn(&str) -> String) -> Result<Self, QuantError> {
        let w = super::weights_of(group, at)?;
        if group.get("input_activations").is_some_and(|a| !a.is_null()) {
            return Err(refuse(
                format!(
                    "compressed-tensors pack-quantized with {} set is not supported: wload writes weight-only (W4A16 / W8A16) integer schemes",
                    at("input_activations")
                ),
                USE_UNQUANTIZED,
            ));
        }
        if field(w, "type") != "int" {
            return Err(refuse(
                format!(
                    "compressed-tensors pack-quantized weights of type {} are not supported (nvfp4-pack-quantized is its own format); wload writes int weights here",
                    field(w, "type")
                ),
                USE_UNQUANTIZED,
            ));
        }
        let bits = match field(w, "num_bits").as_u64() {
            Some(b @ (4 | 8)) => b,
            Some(b @ 2..=7) => {
                return Err(refuse(
                    format!(
                        "compressed-tensors pack-quantized with num_bits = {b} is not supported by wload ({}): vLLM packs it, but wload writes 4- and 8-bit packed weights only",
                        at("weights.num_bits")
                    ),
                    USE_UNQUANTIZED,
                ));
            }
            b => {
                return Err(refuse(
                    format!(
                        "Unsupported num_bits = {}. Supported num_bits = [2, 3, 4, 5, 6, 7, 8] ({})",
                        b.map_or("none".to_string(), |b| b.to_string()),
                        at("weights.num_bits")
                    ),
                    "quantization_config is malformed: pack-quantized weights have 2 to 8 bits",
                ));
            }
        };
        if field(w, "dynamic") == true {
            return Err(refuse(
                format!(
                    "compressed-tensors pack-quantized weights must be static ({} is dynamic): vLLM's WNA16 scheme takes static group or channel weights",
                    at("weights")
                ),
                USE_UNQUANTIZED,
            ));
        }
        let group = match (
            field(w, "strategy").as_str(),
            field(w, "group_size").as_u64(),
        ) {
            (Some("group"), Some(g)) if g > 0 => Some(g),
            (Some("channel"), _) => None,
            (s, _) => {
                return Err(refuse(
                    format!(
                        "Pack-quantized format requires group quantization or channelwise quantization, but found no group size and strategy is not channelwise ({}: strategy {s:?}, group_size {})",
                        at("weights"),
                        field(w, "group_size")
                    ),
                    "quantization_config is malformed: give strategy \"group\" with a group_size, or \"channel\"",
                ));
            }
        };
        Ok(Wna16 {
            bits,
            group,
            symmetric: field(w, "symmetric") != false,
        })
    }

    /// `int4 group 32 symmetric (W4A16)`, for reports.
    pub fn describe(&self) -> String {
        let scales = match self.group {
            Some(g) => format!("group {g}"),
            None => "per-channel".to_string(),
        };
        let sym = if self.symmetric {
            "symmetric"
        } else {
            "asymmetric (zero points)"
        };
        format!("int{} {scales} {sym} (W{}A16)", self.bits, self.bits)
    }
}
