//! Every `--json` document the suite parses ([`super::wload_json`], [`super::wload_json_exit`], [`super::json_doc`],
//! [`super::assert_refused`]) is validated against its schema (docs/schemas/, issue 43), so each
//! JSON test checks the schema too: a field the types print but the schema does not describe
//! (a hand-written `Serialize`, a `serialize_with`) fails there.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use jsonschema::Validator;
use serde_json::Value;

use wload::report::schema::{DOCUMENTS, document};

/// The compiled schema of document `name`, made once for the whole suite from the crate's types
/// (the `schemas` test checks the checked-in files against the same): one validator for each of
/// the documents it accepts (inspect's report, refused or not, ...), so that a failure names the
/// closest one's errors rather than only "none of the `anyOf`".
fn validators(name: &str) -> &'static [Variant] {
    static ALL: OnceLock<Vec<(&str, Vec<Variant>)>> = OnceLock::new();
    let all = ALL.get_or_init(|| {
        DOCUMENTS
            .iter()
            .map(|&n| (n, variants(closed(document(n).expect("a schema")))))
            .collect()
    });
    let found = all.iter().find(|(n, _)| *n == name);
    &found.unwrap_or_else(|| panic!("no schema named {name}")).1
}

/// One document a schema accepts: its definition's name and its validator.
type Variant = (String, Validator);

/// `schema`'s documents, each named by its definition and compiled alone.
fn variants(schema: Value) -> Vec<Variant> {
    let refs: Vec<Value> = match schema.get("anyOf") {
        Some(Value::Array(branches)) => branches.iter().map(|b| b["$ref"].clone()).collect(),
        _ => vec![schema["$ref"].clone()],
    };
    refs.into_iter()
        .map(|r| {
            let name = r.as_str().expect("a $ref").trim_start_matches("#/$defs/");
            let mut one = schema.clone();
            let root = one.as_object_mut().unwrap();
            root.remove("anyOf");
            root.insert("$ref".into(), r.clone());
            let v = jsonschema::validator_for(&one)
                .unwrap_or_else(|e| panic!("the {name} schema does not compile: {e}"));
            (name.to_string(), v)
        })
        .collect()
}

/// The subcommand of a command line: its first argument that is no option (the global options
/// take no value).
fn command(args: &[&str]) -> Option<&'static str> {
    let first = args.iter().find(|a| !a.starts_with('-'))?;
    DOCUMENTS[..5].iter().copied().find(|c| c == first)
}

/// What is wrong with `doc` as a document of schema `name`; empty when it validates.
pub(crate) fn schema_errors(name: &str, doc: &Value) -> Vec<String> {
    let mut closest: Option<Vec<String>> = None;
    for (variant, v) in validators(name) {
        let errors: Vec<String> = (v.iter_errors(doc))
            .map(|e| {
                // An error quotes the value it refuses: a whole report, for a missing field.
                let text: String = e.to_string().chars().take(300).collect();
                format!("{variant} at {:?}: {text}", e.instance_path().as_str())
            })
            .collect();
        if errors.is_empty() {
            return errors;
        }
        if closest.as_ref().is_none_or(|c| errors.len() < c.len()) {
            closest = Some(errors);
        }
    }
    closest.unwrap_or_default()
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

/// `schema` closed for the suite: every object that lists its properties gets
/// `"unevaluatedProperties": false`, so that a field printed but missing from the schema fails
/// too. The published files stay open, as docs/json.md promises: new fields may appear.
///
/// An object flattened into another (`#[serde(flatten)]`: a branch of the `anyOf`/`oneOf`/`allOf`
/// of an object with properties of its own, or a definition such a branch refers to, or one
/// referred to beside properties, as an internally tagged variant is) stays open:
/// it sees the other object's fields, which the enclosing object's own keyword accounts for.
fn closed(mut schema: Value) -> Value {
    let defs = schema.get("$defs").cloned().unwrap_or_default();
    let defs = defs.as_object().cloned().unwrap_or_default();
    let mut flattened = BTreeSet::new();
    loop {
        let before = flattened.len();
        flattened_refs(&schema, false, &mut flattened);
        for (name, def) in &defs {
            let open = flattened.contains(name);
            flattened_refs(def, open, &mut flattened);
        }
        if flattened.len() == before {
            break;
        }
    }
    close(&mut schema, false);
    if let Some(Value::Object(defs)) = schema.get_mut("$defs") {
        for (name, def) in defs.iter_mut() {
            close(def, flattened.contains(name));
        }
    }
    schema
}

/// The subschemas of `s` but its definitions, each with whether it is a branch of a combination.
fn children(s: &Value) -> Vec<(&Value, bool)> {
    let mut out = Vec::new();
    for (key, child) in s.as_object().into_iter().flatten() {
        match (key.as_str(), child) {
            ("allOf" | "anyOf" | "oneOf", Value::Array(branches)) => {
                out.extend(branches.iter().map(|b| (b, true)))
            }
            ("properties" | "patternProperties", Value::Object(props)) => {
                out.extend(props.values().map(|p| (p, false)))
            }
            ("prefixItems", Value::Array(items)) => out.extend(items.iter().map(|i| (i, false))),
            ("items" | "additionalProperties" | "not", Value::Object(_)) => {
                out.push((child, false))
            }
            _ => {}
        }
    }
    out
}

/// Adds to `refs` the definitions that `s` (flattened into another object when `open`) uses
/// flattened.
fn flattened_refs(s: &Value, open: bool, refs: &mut BTreeSet<String>) {
    let has_properties = s.get("properties").is_some();
    // A `$ref` beside properties: an internally tagged enum's variant, the tag added to its type.
    if (open || has_properties)
        && let Some(name) = s.get("$ref").and_then(Value::as_str)
        && let Some(name) = name.strip_prefix("#/$defs/")
    {
        refs.insert(name.to_string());
    }
    for (child, branch) in children(s) {
        flattened_refs(child, branch && (open || has_properties), refs);
    }
}

/// Closes `s` and its subschemas, but those flattened into another object ([`closed`]).
fn close(s: &mut Value, open: bool) {
    let has_properties = s.get("properties").is_some();
    let Value::Object(map) = s else { return };
    for (key, child) in map.iter_mut() {
        let branch = matches!(key.as_str(), "allOf" | "anyOf" | "oneOf");
        match child {
            Value::Array(items) if branch || key == "prefixItems" => {
                for c in items {
                    close(c, branch && (open || has_properties));
                }
            }
            Value::Object(props) if key == "properties" || key == "patternProperties" => {
                for p in props.values_mut() {
                    close(p, false);
                }
            }
            Value::Object(_)
                if matches!(key.as_str(), "items" | "additionalProperties" | "not") =>
            {
                close(child, false)
            }
            _ => {}
        }
    }
    if has_properties && !open {
        map.insert("unevaluatedProperties".into(), Value::Bool(false));
    }
}
