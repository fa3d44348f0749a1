//! What a mapping may ask for. A mapping file is a few kilobytes, but its rules run on every
//! checkpoint name and its parameter lists repeat for every layer, so without bounds a small file
//! can multiply work and memory without end (rules that each double a name: 2^20 times its length
//! after twenty of them). Each bound is far beyond what vLLM's real models need and makes the cost
//! of a mapping proportional to the checkpoint it is applied to.

use std::fmt;

/// Regex and expert rules together. Each runs over every name a cheaper test lets through; the
/// shipped mappings have at most a dozen, with the quantization rules.
pub(crate) const MAX_REGEX_RULES: usize = 256;

/// Substring, stacked, prefix and suffix rules together (the shipped mappings: a few dozen).
pub(crate) const MAX_LITERAL_RULES: usize = 1024;

/// Bytes of one pattern, replacement, `from`, `to`, expert `replace`, scope or Mistral token.
/// It bounds what one application of a rule adds to a name.
pub(crate) const MAX_RULE_TEXT: usize = 1024;

/// How many bytes the rules together may add to a checkpoint name. Real renames add tens of bytes
/// (`.q_proj` → `.qkv_proj`); a rule that lengthens a name on every match grows it without end.
pub(crate) const MAX_NAME_GROWTH: usize = 4096;

/// The compiled size of one regex rule, and of its lazy DFA's cache: a name rule compiles to a few
/// kilobytes (`experts\.(\d+)\.w1\.` to about 10 KB with Unicode classes), and the regex crate's
/// defaults (10 MiB, 2 MiB a thread) times [`MAX_REGEX_RULES`] would be gigabytes.
pub(crate) const REGEX_SIZE: usize = 1 << 20;
pub(crate) const REGEX_DFA_SIZE: usize = 1 << 20;

/// Parameters in one of a mapping's `head`, `layer` or `tail` lists after its blocks are expanded
/// (the shipped ones: under 60 a layer with every quantization scale).
pub(crate) const MAX_PARAMS_PER_LIST: usize = 1024;

/// A name rule made a name longer than the checkpoint's name plus [`MAX_NAME_GROWTH`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameTooLong {
    /// The checkpoint tensor being renamed.
    pub tensor: String,
    /// The rule that crossed the limit, as messages describe rules.
    pub rule: String,
    /// The limit for this name, in bytes.
    pub limit: usize,
}

impl fmt::Display for NameTooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: String = self.tensor.chars().take(120).collect();
        let more = if shown.len() < self.tensor.len() {
            "…"
        } else {
            ""
        };
        write!(
            f,
            "tensor '{shown}{more}': the name rule {} makes its name longer than {} bytes \
             (the name plus {MAX_NAME_GROWTH}, the most the rules may add); a rule that \
             lengthens every name it matches, applied again and again, grows names without end: \
             fix the rule",
            self.rule, self.limit
        )
    }
}
