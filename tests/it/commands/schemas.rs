//! docs/schemas/: one JSON Schema per `--json` document, written from the crate's types
//! (`wload::report::schema`). The files are checked in for people and tools that read no Rust;
//! this test fails when they no longer match the types, and rewrites them when asked to.

use std::path::PathBuf;

use serde_json::json;

use crate::support::{assert_schema, schema_errors};
use wload::report::schema::{DOCUMENTS, document};

/// Set to rewrite the checked-in files from the types instead of comparing.
const BLESS: &str = "WLOAD_BLESS_SCHEMAS";

fn file(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/schemas");
    dir.join(format!("{name}.schema.json"))
}

#[test]
fn the_checked_in_schemas_are_those_of_the_types() {
    let bless = std::env::var_os(BLESS).is_some_and(|v| !v.is_empty());
    let mut stale = Vec::new();
    for name in DOCUMENTS {
        let schema = document(name).expect("every document has a schema");
        let text = serde_json::to_string_pretty(&schema).unwrap() + "\n";
        let path = file(name);
        if bless {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(&text) {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "stale or missing: {stale:?}; the types changed a --json document: rewrite them with \
         `{BLESS}=1 cargo test --test it schemas`, and read the diff (a field removed or changed \
         in meaning bumps the document's schema_version, src/commands/schema.rs)"
    );
}

#[test]
fn a_document_that_does_not_match_is_refused() {
    let doc = serde_json::to_value(wload::report::json::usage_failure(
        "error: unexpected argument '--jsn' found\n",
    ))
    .unwrap();
    assert_eq!(schema_errors("error", &doc), Vec::<String>::new());
    let mut wrong_type = doc.clone();
    wrong_type["exit_status"] = json!("2");
    assert!(!schema_errors("error", &wrong_type).is_empty());
    let mut missing = doc.clone();
    missing.as_object_mut().unwrap().remove("error");
    assert!(!schema_errors("error", &missing).is_empty());
    // A field printed but not in the schema fails in the suite, whose schemas are closed; the
    // published ones stay open (docs/json.md: new fields may appear).
    let mut extra = doc.clone();
    extra["surprise"] = json!(1);
    assert!(!schema_errors("error", &extra).is_empty());
    let published = jsonschema::validator_for(&document("error").unwrap()).unwrap();
    assert!(published.is_valid(&extra));
    // A success is not an error document, nor a plan without its fields a plan.
    let mut success = doc;
    success["ok"] = json!(true);
    assert!(!schema_errors("error", &success).is_empty());
    assert!(!schema_errors("plan", &json!({"ok": true})).is_empty());
}

#[test]
#[should_panic(expected = "does not match its schema")]
fn the_suite_fails_on_a_document_that_does_not_match() {
    assert_schema(
        &["-q", "sizes", "x", "--json"],
        &json!({"ok": true, "tp": "eight"}),
    );
}
