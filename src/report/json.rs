//! What every `--json` document shares (docs/json.md): `ok` on each one, so that a pipeline can
//! test success with `jq -e .ok`; a `schema_version` on each one, added here to the reports that
//! have none of their own; and the one document every failure prints.

use serde::Serialize;

use crate::commands::error::Error;
use crate::model::deepseek_v4::DeepseekV4;
use crate::plan::PlanError;
use crate::problem::Problem;

/// A successful command's report with `"ok": true` in front, and `schema_version` for a report
/// that does not carry its own.
#[derive(Serialize, schemars::JsonSchema)]
#[schemars(rename = "{T}Success")]
pub struct Success<'a, T: Serialize> {
    #[schemars(extend("const" = true))]
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

/// A report printed whole although the command fails (`inspect` of a checkpoint that `plan`
/// would refuse: an architecture without a mapping, a folder without config.json): the report's
/// fields with `"ok": false`, the exit status and the error in front, as the error document has
/// them (docs/json.md).
#[derive(Serialize, schemars::JsonSchema)]
#[schemars(rename = "{T}Refused")]
pub struct Refused<'a, T: Serialize> {
    #[schemars(extend("const" = false))]
    ok: bool,
    exit_status: u8,
    error: ErrorInfo,
    #[serde(flatten)]
    report: &'a T,
}

/// `report` as its `--json` document for a command failing with `e` (exit status `exit_status`).
pub fn refused<'a, T: Serialize>(report: &'a T, e: &Error, exit_status: u8) -> Refused<'a, T> {
    Refused {
        ok: false,
        exit_status,
        error: ErrorInfo {
            kind: e.exit_status().kind(),
            message: e.to_string(),
        },
        report,
    }
}

/// Any failure under `--json`: what kind it is (the exit status's name), its message, and the
/// problems it lists, each with what it names.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Failure {
    #[schemars(extend("const" = false))]
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
    pub problems: Vec<Problem>,
    /// For DeepSeek-V4 only: what the model is and why wload writes nothing for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform_specific: Option<DeepseekV4>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ErrorInfo {
    /// usage, checkpoint, runtime or interrupted: [`crate::exit::ExitStatus::kind`].
    pub kind: &'static str,
    /// What stderr says, minus the `error: ` prefix; for a list of problems, its headline.
    pub message: String,
}

/// The error document for `e`, which makes the process exit with `exit_status`.
pub fn failure(e: &Error, exit_status: u8) -> Failure {
    let (message, problems) = match e {
        Error::Plan(PlanError::Invalid(ps)) => (headline(&e.to_string()), ps.clone()),
        Error::Headers(hs) => (
            e.to_string().replace("\nerror: ", "\n"),
            hs.iter().map(Problem::from).collect(),
        ),
        _ => (e.to_string(), Vec::new()),
    };
    let mut doc = document(e.exit_status().kind(), exit_status, message, problems);
    if let Error::PlatformSpecific(p) = e {
        doc.platform_specific = Some((*p.0).clone());
    }
    doc
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
    let status = crate::exit::ExitStatus::Usage;
    document(status.kind(), status as u8, message.to_string(), Vec::new())
}

fn document(
    kind: &'static str,
    exit_status: u8,
    message: String,
    problems: Vec<Problem>,
) -> Failure {
    Failure {
        ok: false,
        schema_version: crate::commands::schema::ERROR,
        wload_version: env!("CARGO_PKG_VERSION"),
        exit_status,
        error: ErrorInfo { kind, message },
        problem_count: problems.len(),
        problems,
        platform_specific: None,
    }
}

/// A problem list's first line ("2 problems found; vLLM would refuse …"), without its colon.
fn headline(text: &str) -> String {
    let first = text.lines().next().unwrap_or(text);
    first.trim_end_matches(':').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_header_names_its_file_tensor_and_shape_and_nothing_else() {
        let e = crate::checkpoint::HeaderError::SizeMismatch {
            path: "/data/my model/x.safetensors".into(),
            tensor: "w".into(),
            dtype: crate::dtype::Dtype::Bf16,
            shape: vec![2, 3],
            expected: "12 bytes".into(),
            found: 10,
        };
        let doc = serde_json::to_value(failure(&Error::Headers(vec![e]), 3)).unwrap();
        let p = &doc["problems"][0];
        assert_eq!(p["file"], "/data/my model/x.safetensors");
        assert_eq!(p["tensor"], "w");
        assert_eq!(p["shape"], serde_json::json!([2, 3]));
        // What the problem is not about is left out, not null; `fix` is always there.
        let keys: Vec<&str> = p.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["message", "fix", "file", "tensor", "shape"]);
        assert!(p["fix"].is_null());
        assert!(
            p["message"]
                .as_str()
                .unwrap()
                .contains("data_offsets span 10"),
            "{doc}"
        );
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
