//! The names of vLLM's sharded_state part files, written and read here only (vLLM 0.33 `model_executor/model_loader/sharded_state_loader.py`).
//!
//! vLLM renders one of two patterns with plain Python ints (no sign, no zero padding):
//! `model-rank-{tp}-part-{part}.safetensors` when pipeline parallelism is off, and
//! `model-pp-{pp}-tp-{tp}-part-{part}.safetensors` when it is on. Its loader then globs the pattern
//! with `part="*"` for its own ranks, so a rank is only ever read under its canonical decimal
//! spelling (`model-rank-01-…` is no file of rank 1), while the part number is whatever the glob
//! matched: leading zeros there are read like any other digits.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

const SUFFIX: &str = ".safetensors";

/// The glob of every part file of a TP-only run, for messages and reports.
pub(crate) const TP_ONLY_GLOB: &str = "model-rank-*-part-*.safetensors";

/// The glob of every part file of a pipeline-parallel run.
pub(crate) const PP_GLOB: &str = "model-pp-*-tp-*-part-*.safetensors";

/// Which part of which rank a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct RankFile {
    /// The pipeline stage; `None` for the TP-only pattern (pipeline parallel size 1).
    pub pp: Option<u64>,
    /// The rank inside the tensor-parallel group.
    pub tp: u64,
    pub part: u64,
}

impl RankFile {
    /// A file of a TP-only run, the pattern `wload shard` writes.
    pub(crate) fn tp_only(tp: u64, part: u64) -> RankFile {
        RankFile { pp: None, tp, part }
    }

    /// The file name, exactly as vLLM renders it.
    pub(crate) fn name(&self) -> String {
        self.to_string()
    }

    /// The file a name is, or `None` when vLLM would never read it as one: anything but ASCII
    /// digits where a number goes, a rank with leading zeros, a number beyond `u64`, any other
    /// prefix or suffix.
    pub(crate) fn parse(name: &str) -> Option<RankFile> {
        let stem = name.strip_suffix(SUFFIX)?;
        if let Some(rest) = stem.strip_prefix("model-rank-") {
            let (tp, part) = rest.split_once("-part-")?;
            return Some(RankFile::tp_only(rank(tp)?, part_number(part)?));
        }
        let rest = stem.strip_prefix("model-pp-")?;
        let (pp, rest) = rest.split_once("-tp-")?;
        let (tp, part) = rest.split_once("-part-")?;
        Some(RankFile {
            pp: Some(rank(pp)?),
            tp: rank(tp)?,
            part: part_number(part)?,
        })
    }
}

impl fmt::Display for RankFile {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self.pp {
            None => write!(f, "model-rank-{}-part-{}{SUFFIX}", self.tp, self.part),
            Some(pp) => write!(f, "model-pp-{pp}-tp-{}-part-{}{SUFFIX}", self.tp, self.part),
        }
    }
}

/// The name of part `part` of TP rank `tp` when pipeline parallelism is off.
pub(crate) fn file_name(tp: u64, part: u64) -> String {
    RankFile::tp_only(tp, part).name()
}

/// What vLLM's loader globs for one TP rank's files (pipeline parallelism off).
pub(crate) fn tp_only_glob(tp: u64) -> String {
    format!("model-rank-{tp}-part-*{SUFFIX}")
}

/// What vLLM's loader globs for the files of TP rank `tp` of stage `pp` (either pattern).
pub(crate) fn rank_glob(pp: Option<u64>, tp: u64) -> String {
    match pp {
        None => tp_only_glob(tp),
        Some(pp) => format!("model-pp-{pp}-tp-{tp}-part-*{SUFFIX}"),
    }
}

/// A rank as vLLM renders it: `0`, or digits without a leading zero.
fn rank(s: &str) -> Option<u64> {
    if s.len() > 1 && s.starts_with('0') {
        return None;
    }
    part_number(s)
}

/// ASCII digits only (`u64::from_str` would also take a leading `+`), within `u64`.
fn part_number(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// (pipeline stage, TP rank) → its part files, as (part, file name), in part order. The stage
/// is `None` for TP-only names.
pub(crate) type RankFiles = BTreeMap<(Option<u64>, u64), Vec<(u64, String)>>;

/// The part files of a folder that `shard` or vLLM wrote, of both patterns.
pub(crate) fn in_folder(root: &Path) -> RankFiles {
    let mut out = RankFiles::new();
    if let Ok(rd) = std::fs::read_dir(root) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(f) = RankFile::parse(&name) {
                out.entry((f.pp, f.tp)).or_default().push((f.part, name));
            }
        }
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

/// Whether `root` is a folder holding rank files.
pub(crate) fn is_pre_sharded(root: &Path) -> bool {
    root.is_dir() && !in_folder(root).is_empty()
}

/// The glob vLLM's sharded_state loader reads `files` with: the pipeline-parallel one only when
/// every rank file has it.
pub(crate) fn pattern(files: &RankFiles) -> &'static str {
    if !files.is_empty() && files.keys().all(|(pp, _)| pp.is_some()) {
        PP_GLOB
    } else {
        TP_ONLY_GLOB
    }
}

/// What TP and PP size a folder's rank files were written for: from its `wload.json` when it has
/// a readable one, else inferred from the file names.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
pub struct WrittenFor {
    pub tp: u64,
    pub pp: u64,
    /// `None` when no manifest says (vLLM's files do not record it).
    pub expert_parallel: Option<bool>,
    /// The model dtype (`BF16`), per the manifest.
    pub dtype: Option<String>,
    pub architecture: Option<String>,
    /// The checkpoint the files were sharded from, per the manifest.
    pub source_checkpoint: Option<String>,
    /// The multimodal flags it was written with, per the manifest, as the flags
    /// (`--language-model-only`, `--mm-encoder-tp-mode data`); empty: vLLM's defaults, or unknown.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub multimodal: Vec<String>,
    /// The platform whose vLLM module tree the keys follow (`cuda`), per the manifest; absent:
    /// the same everywhere, or unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module_tree: Option<String>,
    /// The run records read ("wload.json", or "wload-ranks-0-3.json, wload-ranks-4-7.json"), or
    /// "file names".
    pub from: String,
}

impl WrittenFor {
    /// What the file names of `files` show (no manifest says); `files` must not be empty.
    pub(crate) fn from_names(files: &RankFiles) -> WrittenFor {
        let staged = files.keys().all(|(pp, _)| pp.is_some());
        WrittenFor {
            tp: files
                .keys()
                .map(|k| k.1)
                .max()
                .map_or(1, |m| m.saturating_add(1)),
            pp: if staged {
                files
                    .keys()
                    .filter_map(|k| k.0)
                    .max()
                    .map_or(1, |m| m.saturating_add(1))
            } else {
                1
            },
            multimodal: Vec::new(),
            module_tree: None,
            expert_parallel: None,
            dtype: None,
            architecture: None,
            source_checkpoint: None,
            from: "file names".into(),
        }
    }

    /// The flags that load these files as they were written: `--tp 2 --pp 2 --enable-expert-parallel`.
    pub(crate) fn flags(&self) -> String {
        let mut s = format!("--tp {}", self.tp);
        if self.pp > 1 {
            s += &format!(" --pp {}", self.pp);
        }
        if self.expert_parallel == Some(true) {
            s += " --enable-expert-parallel";
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_patterns_are_named_as_vllm_renders_them() {
        assert_eq!(file_name(3, 0), "model-rank-3-part-0.safetensors");
        let pp = RankFile {
            pp: Some(1),
            tp: 2,
            part: 10,
        };
        assert_eq!(pp.name(), "model-pp-1-tp-2-part-10.safetensors");
        assert_eq!(tp_only_glob(1), "model-rank-1-part-*.safetensors");
    }

    #[test]
    fn names_vllm_would_not_read_are_no_rank_files() {
        for name in [
            "model-rank-a-part-0.safetensors",
            "model-rank-0-part-.safetensors",
            "model-rank--part-0.safetensors",
            "model-rank-+1-part-0.safetensors",
            "model-rank-1-part-+0.safetensors",
            "model-rank-01-part-0.safetensors",
            "model-rank-18446744073709551616-part-0.safetensors",
            "model-rank-0-part-18446744073709551616.safetensors",
            "model-rank-0-part-0.safetensors.index.json",
            "model-rank-0-part-0.safetensorsx",
            "model-rank-0-part-0.SAFETENSORS",
            "model-rank-0-part-0-part-1.safetensors",
            "model-rank-٣-part-0.safetensors",
            "xmodel-rank-0-part-0.safetensors",
            "model-00001-of-00002.safetensors",
            "model-pp-0-rank-0-part-0.safetensors",
            "model-pp-00-tp-0-part-0.safetensors",
            "model-pp-0-tp-0.safetensors",
            "model-pp--tp-0-part-0.safetensors",
            "",
        ] {
            assert_eq!(RankFile::parse(name), None, "{name}");
        }
    }

    #[test]
    fn part_numbers_keep_what_the_glob_matches() {
        assert_eq!(
            RankFile::parse("model-rank-12-part-007.safetensors"),
            Some(RankFile::tp_only(12, 7))
        );
        assert_eq!(
            RankFile::parse("model-rank-18446744073709551615-part-0.safetensors"),
            Some(RankFile::tp_only(u64::MAX, 0))
        );
        assert_eq!(
            RankFile::parse("model-pp-3-tp-0-part-1.safetensors"),
            Some(RankFile {
                pp: Some(3),
                tp: 0,
                part: 1
            })
        );
    }

    /// A name that parsed, with its part number spelled as vLLM would render it.
    fn without_part_zeros(s: &str) -> String {
        let (head, tail) = s.rsplit_once("-part-").expect("parsed names have a part");
        let digits = tail.strip_suffix(SUFFIX).expect("parsed names end so");
        let digits = match digits.trim_start_matches('0') {
            "" => "0",
            d => d,
        };
        format!("{head}-part-{digits}{SUFFIX}")
    }

    /// Every file named by the encoder parses back to itself, and any other string parses or not
    /// without panicking; whatever parses is named back the same way (but for a part's leading zeros).
    #[test]
    fn encoding_round_trips_and_parsing_never_panics() {
        let mut rng = fastrand::Rng::with_seed(0x5A4E_F11E);
        let number = |rng: &mut fastrand::Rng| match rng.u8(..4) {
            0 => rng.u64(..10),
            1 => rng.u64(..),
            2 => u64::MAX - rng.u64(..3),
            _ => rng.u64(..1000),
        };
        for _ in 0..20_000 {
            let f = RankFile {
                pp: rng.bool().then(|| number(&mut rng)),
                tp: number(&mut rng),
                part: number(&mut rng),
            };
            assert_eq!(RankFile::parse(&f.name()), Some(f), "{f}");
        }
        let alphabet: Vec<char> = "model-rankpt0123456789+.safetensors_٣é".chars().collect();
        let seeds = [
            "model-rank-1-part-2.safetensors",
            "model-pp-1-tp-2-part-3.safetensors",
        ];
        let mut parsed = 0;
        for _ in 0..50_000 {
            let mut s: Vec<char> = seeds[rng.usize(..seeds.len())].chars().collect();
            for _ in 0..rng.usize(1..4) {
                let i = rng.usize(..=s.len());
                match rng.u8(..3) {
                    0 => s.insert(i, alphabet[rng.usize(..alphabet.len())]),
                    1 if i < s.len() => drop(s.remove(i)),
                    _ => s.truncate(i),
                }
            }
            let s: String = s.into_iter().collect();
            if let Some(f) = RankFile::parse(&s) {
                parsed += 1;
                assert_eq!(f.name(), without_part_zeros(&s), "{s}");
            }
        }
        assert!(
            parsed > 500,
            "the mutations should keep some names valid: {parsed}"
        );
        for _ in 0..20_000 {
            let s: String = (0..rng.usize(..48))
                .map(|_| alphabet[rng.usize(..alphabet.len())])
                .collect();
            if let Some(f) = RankFile::parse(&s) {
                assert_eq!(f.name(), without_part_zeros(&s), "{s}");
            }
        }
    }
}
