//! What every `--json` document shares (docs/json.md): `ok` on each one, so that a pipeline can
//! test success with `jq -e .ok`; a `schema_version` on each one, added here to the reports that
//! have none of their own; and the one document every failure prints.

use serde::Serialize;

use crate::Error;
use crate::plan::PlanError;

/// `wload shard --json`: bumped when a field changes meaning or disappears (docs/shard-json.md).
pub const SHARD_SCHEMA_VERSION: u32 = 1;
/// `wload load --json`: bumped when a field changes meaning or disappears (docs/load-json.md).
pub const LOAD_SCHEMA_VERSION: u32 = 1;
/// The error document: bumped when a field changes meaning or disappears (docs/json.md). It is
/// the same as the plan's refusal document's, which it extends.
pub const ERROR_SCHEMA_VERSION: u32 = crate::plan::SCHEMA_VERSION;

/// A successful command's report with `"ok": true` in front, and `schema_version` for a report
/// that does not carry its own.
#[derive(Serialize)]
pub struct Success<'a, T: Serialize> {
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    schema_version: Option<u32>,
    #[serde(flatten)]
    report: &'a T,
}

/// `report` as its `--json` document; `schema_version` only for a report without the field.
pub fn success<T: Serialize>(report: &T, schema_version: Option<u32>) -> Success<'_, T> {
    Success {
        ok: true,
        schema_version,
        report,
    }
}

/// Any failure under `--json`: what kind it is (the exit status's name), its message, and the
/// problems it lists, each with what it names.
#[derive(Debug, Serialize)]
pub struct Failure {
    pub ok: bool,
    pub schema_version: u32,
    pub wload_version: &'static str,
    /// The process's exit status (128 + the signal's number when interrupted).
    pub exit_status: u8,
    pub error: ErrorInfo,
    /// Kept from the plan's refusal document, where it was the only way to tell the two apart.
    pub problem_count: usize,
    /// Every problem when the error is a list of them (a refused plan, malformed weight files);
    /// empty otherwise.
    pub problems: Vec<ProblemInfo>,
}

#[derive(Debug, Serialize)]
pub struct ErrorInfo {
    /// usage, checkpoint, runtime or interrupted: [`crate::ExitStatus::kind`].
    pub kind: &'static str,
    /// What stderr says, minus the `error: ` prefix; for a list of problems, its headline.
    pub message: String,
}

/// One problem, with the file, tensor, parameter and shapes its message names (each left out
/// when the message names none).
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct ProblemInfo {
    pub message: String,
    /// `null` when there is no likely fix to suggest.
    pub fix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensor: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameter: Option<String>,
    /// The checkpoint tensor's shape, when the problem is about it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<u64>>,
    /// The shape the parameter expects instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_shape: Option<Vec<u64>>,
}

impl ProblemInfo {
    /// The problem, with what its message names read back out of it: the planner's messages
    /// follow a few fixed forms (`FILE: tensor 'T' has shape [..], but 'P' expects [..]`,
    /// `parameter 'P' has nothing …`, `P: …`), and reading them here keeps every producer of a
    /// message as it is.
    pub fn new(message: String, fix: Option<String>) -> ProblemInfo {
        let file = leading_file(&message).map(str::to_string);
        let tensor = quoted_after(&message, "tensor '").map(str::to_string);
        let parameter = parameter_in(&message, file.is_some()).map(str::to_string);
        let shape = shape_after(&message, "has shape ").or_else(|| shape_after(&message, "shape "));
        let expected_shape = shape_after(&message, "expects ");
        ProblemInfo {
            message,
            fix,
            file,
            tensor,
            parameter,
            shape,
            expected_shape,
        }
    }
}

/// The error document for `e`, which makes the process exit with `exit_status`.
pub fn failure(e: &Error, exit_status: u8) -> Failure {
    let (message, problems) = match e {
        Error::Plan(PlanError::Invalid(ps)) => (
            headline(&e.to_string()),
            ps.iter()
                .map(|p| ProblemInfo::new(p.message.clone(), p.fix.clone()))
                .collect(),
        ),
        Error::Headers(hs) => (
            e.to_string().replace("\nerror: ", "\n"),
            hs.iter()
                .map(|h| ProblemInfo::new(h.to_string(), None))
                .collect(),
        ),
        _ => (e.to_string(), Vec::new()),
    };
    document(e.exit_status().kind(), exit_status, message, problems)
}

/// The error document for a command line that clap refused (`wload --json`-style typos
/// included): exit status 2, clap's message without its usage lines.
pub fn usage_failure(clap_message: &str) -> Failure {
    let text = clap_message.trim_start_matches("error: ");
    let end = ["\n\nUsage:", "\n\nFor more information"]
        .iter()
        .filter_map(|tail| text.find(tail))
        .min()
        .unwrap_or(text.len());
    let message = text[..end].trim_end();
    let status = crate::ExitStatus::Usage;
    document(status.kind(), status as u8, message.to_string(), Vec::new())
}

fn document(
    kind: &'static str,
    exit_status: u8,
    message: String,
    problems: Vec<ProblemInfo>,
) -> Failure {
    Failure {
        ok: false,
        schema_version: ERROR_SCHEMA_VERSION,
        wload_version: env!("CARGO_PKG_VERSION"),
        exit_status,
        error: ErrorInfo { kind, message },
        problem_count: problems.len(),
        problems,
    }
}

/// A problem list's first line ("2 problems found; vLLM would refuse …"), without its colon.
fn headline(text: &str) -> String {
    let first = text.lines().next().unwrap_or(text);
    first.trim_end_matches(':').to_string()
}

/// Files a message may start with: weights, configs, indexes, mappings.
const FILE_ENDINGS: [&str; 7] = [
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".json",
    ".yaml",
    ".yml",
];

/// `model-00001-of-00002.safetensors` in `model-00001-of-00002.safetensors: tensor …`.
fn leading_file(message: &str) -> Option<&str> {
    let head = &message[..message.find(": ")?];
    FILE_ENDINGS
        .iter()
        .any(|end| head.ends_with(end))
        .then_some(head)
}

/// `X` in `…{before}X'…`: names hold no quote, so the next one closes it.
fn quoted_after<'m>(message: &'m str, before: &str) -> Option<&'m str> {
    let start = message.find(before)? + before.len();
    let len = message[start..].find('\'')?;
    Some(&message[start..start + len]).filter(|s| !s.is_empty())
}

/// The vLLM parameter a message is about, in the forms the planner writes.
fn parameter_in(message: &str, has_file: bool) -> Option<&str> {
    for before in ["parameter '", "→ '", "but '", " for '"] {
        if let Some(p) = quoted_after(message, before) {
            return Some(p);
        }
    }
    // `'P' is tied …`, `'P' shard q: filled twice …`
    if let Some(rest) = message.strip_prefix('\'') {
        return rest.split('\'').next().filter(|s| !s.is_empty());
    }
    // `model.layers.0.mlp.down_proj.weight: …`: a dotted name, not a file, before the colon.
    if has_file {
        return None;
    }
    let head = &message[..message.find(": ")?];
    (head.contains('.') && !head.contains(char::is_whitespace)).then_some(head)
}

/// The `[a, b, …]` right after `before` (a range such as `rows [2, 3)` does not close with `]`).
fn shape_after(message: &str, before: &str) -> Option<Vec<u64>> {
    let start = message.find(before)? + before.len();
    let rest = message[start..].strip_prefix('[')?;
    let inner = &rest[..rest.find(']')?];
    if inner.trim().is_empty() {
        return Some(Vec::new());
    }
    inner.split(',').map(|d| d.trim().parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(message: &str) -> ProblemInfo {
        ProblemInfo::new(message.to_string(), None)
    }

    #[test]
    fn a_shape_mismatch_names_its_file_tensor_parameter_and_both_shapes() {
        let p = info(
            "model-00001-of-00002.safetensors: tensor 'model.layers.0.self_attn.q_proj.weight' has shape [64, 128], but 'model.layers.0.self_attn.qkv_proj.weight' shard q expects [128, 128]",
        );
        assert_eq!(p.file.as_deref(), Some("model-00001-of-00002.safetensors"));
        assert_eq!(
            p.tensor.as_deref(),
            Some("model.layers.0.self_attn.q_proj.weight")
        );
        assert_eq!(
            p.parameter.as_deref(),
            Some("model.layers.0.self_attn.qkv_proj.weight")
        );
        assert_eq!(p.shape, Some(vec![64, 128]));
        assert_eq!(p.expected_shape, Some(vec![128, 128]));
    }

    #[test]
    fn each_form_of_message_yields_what_it_names() {
        let unmapped = info(
            "model.safetensors: tensor 'model.layers.0.mlp.upp_proj.weight' matches no parameter of LlamaForCausalLM (mapping 'llama')",
        );
        assert_eq!(unmapped.file.as_deref(), Some("model.safetensors"));
        assert_eq!(
            unmapped.tensor.as_deref(),
            Some("model.layers.0.mlp.upp_proj.weight")
        );
        assert_eq!(unmapped.parameter, None);

        let missing = info(
            "parameter 'model.layers.3.mlp.gate_up_proj.weight' has nothing in the checkpoint to fill it (missing shard 1)",
        );
        assert_eq!(
            missing.parameter.as_deref(),
            Some("model.layers.3.mlp.gate_up_proj.weight")
        );
        assert_eq!((missing.file, missing.tensor), (None, None));

        let divisible = info(
            "model.layers.0.self_attn.o_proj.weight_scale_inv: Weight input_size_per_partition = 16 is not divisible by weight quantization block_k = 32.",
        );
        assert_eq!(
            divisible.parameter.as_deref(),
            Some("model.layers.0.self_attn.o_proj.weight_scale_inv")
        );

        let twice = info("'lm_head.weight': filled twice, by 'a' and 'b'");
        assert_eq!(twice.parameter.as_deref(), Some("lm_head.weight"));

        // A header error: the path, the tensor and its shape; no parameter.
        let header = info(
            "/data/my model/x.safetensors: tensor 'w' shape [2, 3] of BF16 needs 12 bytes, but its data_offsets span 10",
        );
        assert_eq!(header.file.as_deref(), Some("/data/my model/x.safetensors"));
        assert_eq!(header.tensor.as_deref(), Some("w"));
        assert_eq!(header.shape, Some(vec![2, 3]));
        assert_eq!(header.parameter, None);

        // A config check names none of them, and a range is no shape.
        let check = info(
            "num_attention_heads (8) is not divisible by tp (3) (vLLM requires `num_attention_heads % tp == 0`)",
        );
        assert_eq!(check, info(&check.message.clone()));
        assert_eq!(
            (check.file, check.tensor, check.parameter, check.shape),
            (None, None, None, None)
        );
        let range = info("x.weight: shard v takes rows [2, 3) of the scale");
        assert_eq!(range.shape, None);
    }

    #[test]
    fn the_kind_follows_the_exit_status() {
        let stopped = Error::from(crate::exec::ExecError::Cancelled);
        let doc = failure(&stopped, 143);
        assert_eq!((doc.error.kind, doc.exit_status), ("interrupted", 143));
        assert_eq!(doc.error.message, "interrupted");
        let closed = Error::Output(std::io::Error::other("disk full"));
        assert_eq!(failure(&closed, 1).error.kind, "runtime");
        let usage = Error::Usage("--rank 9 is out of range".into());
        let doc = failure(&usage, 2);
        assert_eq!((doc.error.kind, doc.problem_count), ("usage", 0));
    }

    #[test]
    fn clap_messages_lose_their_usage_lines() {
        let doc = usage_failure(
            "error: unexpected argument '--jsn' found\n\n  tip: a similar argument exists: '--json'\n\nUsage: wload plan [OPTIONS]\n\nFor more information, try '--help'.\n",
        );
        assert_eq!(
            doc.error.message,
            "unexpected argument '--jsn' found\n\n  tip: a similar argument exists: '--json'"
        );
        assert_eq!(
            (doc.error.kind, doc.exit_status, doc.ok),
            ("usage", 2, false)
        );
        let doc = usage_failure(
            "error: invalid value '0' for '--max-tp <N>': 0 is not in 1..=4096\n\nFor more information, try '--help'.\n",
        );
        assert_eq!(
            doc.error.message,
            "invalid value '0' for '--max-tp <N>': 0 is not in 1..=4096"
        );
    }
}
