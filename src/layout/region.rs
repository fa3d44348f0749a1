//! Which part of a source tensor a piece reads: the unit of a layout's answer, kept below the
//! plan so that a layout kind can say it without reaching up into the plan's data.

use serde::Serialize;

/// Which part of a source tensor a copy reads, for people: `all`, `rows [a, b)`, `cols [a, b)`,
/// optionally of `experts [a, b)`, with `, rotary permuted` (Mistral-native q/k rows) or
/// `, transposed` (gpt-oss experts). Kept as numbers (a plan can hold millions of pieces) and
/// written as text only when shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Region {
    /// Rows (0) or columns (1), and the range; `None`: whole.
    pub range: Option<(usize, u64, u64)>,
    /// Of these experts of a fused expert tensor.
    pub experts: Option<(u64, u64)>,
    pub rotary: bool,
    pub transposed: bool,
    /// Not a copy but a reduction: each destination element is the maximum of this many
    /// consecutive source elements (a block's `row` counts destination elements, its source
    /// row spans `row * max_of`); 0 or 1 for a copy. The `attn_head` KV cache's q scales.
    pub max_of: u64,
    /// Not a copy but a dequantization: the FP8 E4M3 source times its scale, this source (index
    /// into [`Plan::sources`]), rounded to BF16 and then converted to the destination dtype
    /// (DeepSeek-V3.2's FP8 `indexer.wk`, vLLM's `scaled_dequantize` at load).
    pub dequant: Option<usize>,
    /// Not a copy but `-exp(x)` of each source element, correctly rounded to F32, then converted
    /// to the destination dtype (Mamba2's `A` from `A_log`, the mapping's `compute: neg_exp`).
    pub neg_exp: bool,
}

impl Region {
    pub const ALL: Region = Region {
        range: None,
        experts: None,
        rotary: false,
        transposed: false,
        max_of: 0,
        dequant: None,
        neg_exp: false,
    };

    /// Whether the piece computes its elements (a maximum, a dequantization, `-exp`) rather than
    /// copying them: an engine reduction.
    pub(crate) fn reduces(&self) -> bool {
        self.max_of > 1 || self.dequant.is_some() || self.neg_exp
    }
}

impl std::fmt::Display for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some((a, b)) = self.experts {
            write!(f, "experts [{a}, {b}) ")?;
        }
        match self.range {
            None => f.write_str("all")?,
            Some((dim, from, to)) => {
                let what = if dim == 0 { "rows" } else { "cols" };
                write!(f, "{what} [{from}, {to})")?;
            }
        }
        if self.rotary {
            f.write_str(", rotary permuted")?;
        }
        if self.transposed {
            f.write_str(", transposed")?;
        }
        if self.max_of > 1 {
            write!(f, ", max of each {}", self.max_of)?;
        }
        if self.dequant.is_some() {
            f.write_str(", dequantized")?;
        }
        if self.neg_exp {
            f.write_str(", -exp")?;
        }
        Ok(())
    }
}

impl Serialize for Region {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// As [`Serialize`] writes it: its `Display` text.
impl schemars::JsonSchema for Region {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Region".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string" })
    }
}
