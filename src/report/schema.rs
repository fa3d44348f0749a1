//! The JSON Schema of every `--json` document (docs/schemas/*.schema.json), derived from the
//! types serde prints, so that a field added, renamed or skipped in Rust changes the schema with
//! it. The checked-in files are compared with these by the `schemas` integration test, which
//! rewrites them under `WLOAD_BLESS_SCHEMAS=1`; the suite validates every document it parses
//! against them.

use schemars::Schema;
use schemars::generate::{Contract, SchemaGenerator, SchemaSettings};
use serde_json::{Value, json};

use super::json::{Failure, Refused, Success};
use crate::commands::inspect::config_less::ConfigLess;
use crate::commands::inspect::{Inspection, OtherSource};
use crate::commands::load::LoadReport;
use crate::commands::plan::SizesReport;
use crate::commands::shard::ShardReport;
use crate::plan::PlanReport;

/// Every document with a schema: the five commands' and the error document every one of them
/// prints when it fails. `docs/schemas/{name}.schema.json` holds each.
pub const DOCUMENTS: [&str; 6] = ["inspect", "plan", "sizes", "shard", "load", "error"];

/// The schema of document `name` (one of [`DOCUMENTS`]), or `None` for another name.
pub fn document(name: &str) -> Option<Value> {
    let mut g = generator();
    let (title, variants, versioned) = match name {
        // A report printed whole although the command fails (`report::json::refused`): inspect
        // of what plan would refuse, of an incomplete pre-sharded folder, of a folder without
        // config.json.
        "inspect" => (
            "wload inspect --json: a checkpoint's report, one file's or a pre-sharded folder's, or any of them refused with ok false",
            vec![
                g.subschema_for::<Success<'static, Inspection<'static>>>(),
                g.subschema_for::<Success<'static, OtherSource>>(),
                g.subschema_for::<Refused<'static, Inspection<'static>>>(),
                g.subschema_for::<Refused<'static, OtherSource>>(),
                g.subschema_for::<Refused<'static, ConfigLess<'static>>>(),
            ],
            false,
        ),
        "plan" => (
            "wload plan --json",
            vec![g.subschema_for::<Success<'static, PlanReport>>()],
            false,
        ),
        // Refused (exit 3) when no layout plans, with the report whole.
        "sizes" => (
            "wload sizes --json: the report, or the report refused with ok false",
            vec![
                g.subschema_for::<Success<'static, SizesReport>>(),
                g.subschema_for::<Refused<'static, SizesReport>>(),
            ],
            false,
        ),
        // `report::json::success` adds their schema_version: always there.
        "shard" => (
            "wload shard --json",
            vec![g.subschema_for::<Success<'static, ShardReport>>()],
            true,
        ),
        "load" => (
            "wload load --json",
            vec![g.subschema_for::<Success<'static, LoadReport>>()],
            true,
        ),
        "error" => (
            "The error document of every wload command that fails under --json",
            vec![g.subschema_for::<Failure>()],
            false,
        ),
        _ => return None,
    };
    let mut defs = Value::Object(g.take_definitions(true));
    if versioned {
        for v in &variants {
            require(&mut defs, v, "schema_version");
        }
    }
    let variants: Vec<Value> = variants.into_iter().map(Schema::to_value).collect();
    let mut root = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": title,
    });
    match <[Value; 1]>::try_from(variants) {
        Ok([one]) => merge(&mut root, one),
        Err(many) => root["anyOf"] = Value::Array(many),
    }
    root["$defs"] = defs;
    Some(root)
}

/// The generator for the documents as printed: serde's serialising side (fields skipped when
/// empty are optional), draft 2020-12.
fn generator() -> SchemaGenerator {
    let mut settings = SchemaSettings::draft2020_12();
    settings.contract = Contract::Serialize;
    settings.into_generator()
}

/// Marks `field` required in the definition that `reference` (`{"$ref": "#/$defs/Name"}`)
/// points to.
fn require(defs: &mut Value, reference: &Schema, field: &str) {
    let name = reference
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/$defs/"));
    let Some(Value::Object(def)) = name.and_then(|n| defs.get_mut(n)) else {
        return;
    };
    let required = def.entry("required").or_insert_with(|| json!([]));
    if let Value::Array(names) = required
        && !names.iter().any(|n| n == field)
    {
        names.push(field.into());
    }
}

/// `from`'s keys added to `into` (both objects).
fn merge(into: &mut Value, from: Value) {
    if let (Value::Object(into), Value::Object(from)) = (into, from) {
        into.extend(from);
    }
}
