//! Which files vLLM reads from a listing, and in what order (vLLM 0.33 `model_executor/model_loader/default_loader.py`, `weight_utils.py`).

use std::cmp::Ordering;

use serde::Serialize;

/// `--load-format`, with vLLM's spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LoadFormat {
    /// Mistral when a `consolidated*.safetensors` exists anywhere in the folder, else hf.
    Auto,
    /// `*.safetensors`, else `*.bin`, else `*.pt`.
    Hf,
    /// `*.safetensors` only.
    Safetensors,
    /// `consolidated*.safetensors` with `consolidated.safetensors.index.json`.
    Mistral,
    /// `*.pt` only.
    Pt,
}

impl LoadFormat {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LoadFormat::Auto => "auto",
            LoadFormat::Hf => "hf",
            LoadFormat::Safetensors => "safetensors",
            LoadFormat::Mistral => "mistral",
            LoadFormat::Pt => "pt",
        }
    }

    /// Glob patterns tried in order; the first with a match wins (default_loader.py:185–234).
    pub(crate) fn allow_patterns(self) -> &'static [&'static str] {
        match self {
            // `auto` is resolved before patterns are needed.
            LoadFormat::Auto | LoadFormat::Hf => &["*.safetensors", "*.bin", "*.pt"],
            LoadFormat::Safetensors => &["*.safetensors"],
            LoadFormat::Mistral => &["consolidated*.safetensors"],
            LoadFormat::Pt => &["*.pt"],
        }
    }

    /// The index that de-duplicates safetensors files.
    pub(crate) fn index_file(self) -> &'static str {
        match self {
            LoadFormat::Mistral => "consolidated.safetensors.index.json",
            _ => "model.safetensors.index.json",
        }
    }
}

/// What a weight file's extension says about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WeightKind {
    /// A format vLLM's `hf` load format reads (`.safetensors`, `.bin`, `.pt`): also exactly what
    /// vLLM's save_sharded_state example leaves behind when it copies a model's other files.
    Vllm,
    /// PyTorch weights vLLM never reads (Mistral's `original/consolidated.pth`): worth a line
    /// saying why they are not read.
    Pth,
    /// Another framework's weights (GGUF, TensorFlow, Flax, ONNX, ...): never read, never fetched
    /// as a side file.
    Other,
}

/// Every extension that marks a file as model weights: the one list resolution, hub side files
/// and `shard`'s copying of side files all consult.
const WEIGHT_EXTENSIONS: &[(&str, WeightKind)] = &[
    ("safetensors", WeightKind::Vllm),
    ("bin", WeightKind::Vllm),
    ("pt", WeightKind::Vllm),
    ("pth", WeightKind::Pth),
    ("ckpt", WeightKind::Other),
    ("gguf", WeightKind::Other),
    ("ggml", WeightKind::Other),
    ("h5", WeightKind::Other),
    ("msgpack", WeightKind::Other),
    ("onnx", WeightKind::Other),
    ("onnx_data", WeightKind::Other),
    ("ot", WeightKind::Other),
    ("tflite", WeightKind::Other),
    ("npz", WeightKind::Other),
    ("pkl", WeightKind::Other),
];

/// The kind of weights `name` (a file name or relative path) holds by its extension, compared
/// exactly as Python's `os.path.splitext` result is (case-sensitive); `None` for anything else.
pub(crate) fn weight_kind(name: &str) -> Option<WeightKind> {
    let ext = std::path::Path::new(name).extension()?.to_str()?;
    WEIGHT_EXTENSIONS
        .iter()
        .find(|(e, _)| *e == ext)
        .map(|(_, kind)| *kind)
}

/// Files that training leaves next to `.bin`/`.pt` weights; vLLM skips them (weight_utils.py:619–634).
pub(crate) const NOT_FOR_INFERENCE: &[&str] = &[
    "training_args.bin",
    "optimizer.bin",
    "optimizer.pt",
    "scheduler.pt",
    "scaler.pt",
];

/// Python's `glob` for the patterns vLLM uses: `*` matches any run of characters, and like `glob` a
/// leading `*` does not match names that start with a dot.
pub(crate) fn glob_match(pattern: &str, name: &str) -> bool {
    if pattern.starts_with('*') && name.starts_with('.') {
        return false;
    }
    fnmatch(pattern, name)
}

/// `fnmatch` restricted to `*` and literal characters.
pub(crate) fn fnmatch(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let tail: Vec<&str> = parts.collect();
    let Some((last, middle)) = tail.split_last() else {
        return rest.is_empty();
    };
    for m in middle {
        match rest.find(m) {
            Some(i) => rest = &rest[i + m.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// vLLM's `_natural_sort_key` comparison: the name split into digit runs and text, digit runs compared
/// as integers (`model-2` < `model-10`).
pub(crate) fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (ka, kb) = (natural_key(a), natural_key(b));
    for (x, y) in ka.iter().zip(kb.iter()) {
        let o = match (x, y) {
            (Chunk::Num(x), Chunk::Num(y)) => {
                let (x, y) = (x.trim_start_matches('0'), y.trim_start_matches('0'));
                x.len().cmp(&y.len()).then_with(|| x.cmp(y))
            }
            (Chunk::Text(x), Chunk::Text(y)) => x.cmp(y),
            // Splitting on digit runs alternates text and numbers from the same start, so the kinds
            // line up; if they ever did not, Python would raise. Order text first to stay total.
            (Chunk::Text(_), Chunk::Num(_)) => Ordering::Less,
            (Chunk::Num(_), Chunk::Text(_)) => Ordering::Greater,
        };
        if o != Ordering::Equal {
            return o;
        }
    }
    ka.len().cmp(&kb.len())
}

enum Chunk<'a> {
    Text(&'a str),
    Num(&'a str),
}

fn natural_key(s: &str) -> Vec<Chunk<'_>> {
    // re.split(r"(\d+)") always yields text first (possibly empty), then alternates.
    let mut out = Vec::new();
    let mut start = 0;
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            out.push(Chunk::Text(&s[start..i]));
            let j = i + bytes[i..].iter().take_while(|b| b.is_ascii_digit()).count();
            out.push(Chunk::Num(&s[i..j]));
            start = j;
            i = j;
        } else {
            i += 1;
        }
    }
    out.push(Chunk::Text(&s[start..]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order_compares_numbers_as_integers() {
        let mut v = vec![
            "model-00010-of-00010.safetensors",
            "model-2.safetensors",
            "model-00002-of-00010.safetensors",
            "model-10.safetensors",
            "a.safetensors",
        ];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            v,
            [
                "a.safetensors",
                "model-00002-of-00010.safetensors",
                "model-2.safetensors",
                "model-00010-of-00010.safetensors",
                "model-10.safetensors",
            ]
        );
    }

    #[test]
    fn weight_kinds_follow_the_extension_only() {
        for (name, kind) in [
            ("model.safetensors", Some(WeightKind::Vllm)),
            ("pytorch_model.bin", Some(WeightKind::Vllm)),
            ("sub/optimizer.pt", Some(WeightKind::Vllm)),
            ("original/consolidated.pth", Some(WeightKind::Pth)),
            ("model.gguf", Some(WeightKind::Other)),
            ("model.safetensors.index.json", None),
            ("MODEL.BIN", None),
            (".pt", None),
            ("config.json", None),
            ("safetensors", None),
        ] {
            assert_eq!(weight_kind(name), kind, "{name}");
        }
        // Every allow pattern of every load format reads a kind vLLM reads.
        for f in [LoadFormat::Hf, LoadFormat::Mistral, LoadFormat::Pt] {
            for pat in f.allow_patterns() {
                assert_eq!(weight_kind(pat), Some(WeightKind::Vllm), "{pat}");
            }
        }
    }

    #[test]
    fn globbing_matches_python() {
        assert!(glob_match("*.safetensors", "model.safetensors"));
        assert!(!glob_match("*.safetensors", ".hidden.safetensors"));
        assert!(!glob_match("*.safetensors", "model.safetensors.index.json"));
        assert!(glob_match(
            "consolidated*.safetensors",
            "consolidated.safetensors"
        ));
        assert!(glob_match(
            "consolidated*.safetensors",
            "consolidated-00001-of-00002.safetensors"
        ));
        assert!(!glob_match(
            "consolidated*.safetensors",
            "model.safetensors"
        ));
        assert!(fnmatch("a*b*c", "aXbYc"));
        assert!(!fnmatch("a*bc", "abc_"));
        assert!(fnmatch("*.pt", "x.pt"));
    }
}
