//! Every `--json` document the suite parses ([`super::wload_json`], [`super::wload_json_exit`],
//! [`super::assert_refused`]) is validated against its schema (docs/schemas/, issue 43), so each
//! JSON test checks the schema too: a field the types print but the schema does not describe
//! (a hand-written `Serialize`, a `serialize_with`) fails there.

use std::sync::OnceLock;

use jsonschema::Validator;
use serde_json::Value;

use wload::report::schema::{DOCUMENTS, document};

/// The compiled schema of document `name`, made once for the whole suite from the crate's types
/// (the `schemas` test checks the checked-in files against the same).
fn validator(name: &str) -> &'static Validator {
    static ALL: OnceLock<Vec<(&str, Validator)>> = OnceLock::new();
    let all = ALL.get_or_init(|| {
        DOCUMENTS
            .iter()
            .map(|&n| {
                let schema = document(n).expect("a document with a schema");
                let v = jsonschema::validator_for(&schema)
                    .unwrap_or_else(|e| panic!("the {n} schema does not compile: {e}"));
                (n, v)
            })
            .collect()
    });
    let found = all.iter().find(|(n, _)| *n == name);
    &found.unwrap_or_else(|| panic!("no schema named {name}")).1
}

/// The subcommand of a command line: its first argument that is no option (the global options
/// take no value).
fn command(args: &[&str]) -> Option<&'static str> {
    let first = args.iter().find(|a| !a.starts_with('-'))?;
    DOCUMENTS[..5].iter().copied().find(|c| c == first)
}

/// What is wrong with `doc` as a document of schema `name`; empty when it validates.
pub(crate) fn schema_errors(name: &str, doc: &Value) -> Vec<String> {
    validator(name)
        .iter_errors(doc)
        .map(|e| format!("at {:?}: {e}", e.instance_path().as_str()))
        .collect()
}

/// Fails unless `doc`, what `wload ARGS…` printed, validates: a success against its command's
/// schema, a failure against the error document's or (a report printed whole although the
/// command fails) its command's.
pub(crate) fn assert_schema(args: &[&str], doc: &Value) {
    let cmd = command(args);
    let names: Vec<&str> = match (doc["ok"].as_bool(), cmd) {
        (Some(true), Some(c)) => vec![c],
        (Some(true), None) => panic!("wload {args:?}: a success document of no command: {doc:#}"),
        // A refusal checked without its command line: any report printed whole.
        (_, None) => DOCUMENTS.iter().copied().rev().collect(),
        (_, Some(c)) => vec!["error", c],
    };
    let mut why = String::new();
    for name in names {
        let errors = schema_errors(name, doc);
        if errors.is_empty() {
            return;
        }
        let shown = errors.iter().take(10).map(|e| format!("\n  {e}"));
        why += &format!("\nnot a {name} document:{}", shown.collect::<String>());
    }
    panic!(
        "wload {args:?}: stdout does not match its schema, which src/report/schema.rs derives from the \
         types: a hand-written Serialize or a serialize_with needs a JsonSchema that says the same \
         (see Dtype's, or #[schemars(with = ...)]):{why}\n{doc:#}"
    );
}
