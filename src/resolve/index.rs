//! The index file (`model.safetensors.index.json`, `consolidated.safetensors.index.json`): the set
//! of files its `weight_map` names, which is all vLLM reads of it (weight_utils.py:590–616).
//!
//! One pass over the text, borrowing names from it: a 400B model's index has 100k+ entries, and a
//! `serde_json::Value` of them costs several times as long. The result is still what reading the
//! text into a `Value` (with `preserve_order`, as this crate builds serde_json) and walking
//! `weight_map` would give, error for error: a repeated key keeps its first place and its last
//! value, the first bad entry in that order is the one reported, and any syntax error comes first.
//! Only values outside `weight_map` are skimmed rather than read, so a number beyond `f64` or very
//! deep nesting in `metadata` passes, as it does for Python's `json`.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::path::{Component, Path};

use indexmap::IndexMap;
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

use super::ResolveError;

/// The distinct files `path`'s `weight_map` names, refusing any that lie outside the folder.
pub(crate) fn files_named(path: &Path) -> Result<BTreeSet<String>, ResolveError> {
    let bytes = crate::small_file::read(path).map_err(|source| ResolveError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    // An index that is not UTF-8 is a malformed checkpoint (exit 3), not an I/O failure.
    let text = std::str::from_utf8(&bytes).map_err(|e| ResolveError::BadIndex {
        index: path.to_path_buf(),
        message: format!(
            "not valid JSON: invalid UTF-8 at byte {}; re-download or regenerate the index",
            e.valid_up_to()
        ),
    })?;
    files_in(path, text)
}

/// [`files_named`] for the index's text.
fn files_in(path: &Path, text: &str) -> Result<BTreeSet<String>, ResolveError> {
    let bad = |message: String| ResolveError::BadIndex {
        index: path.to_path_buf(),
        message,
    };
    let index: Index =
        serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let entries = index
        .weight_map
        .ok_or_else(|| bad("has no \"weight_map\" object".to_string()))?;
    let entries = last_value_wins(entries);
    let mut files = BTreeSet::new();
    let mut last: Option<&str> = None;
    for (tensor, file) in &entries {
        let file = match file {
            Entry::File(f) => f.as_ref(),
            Entry::Other(v) => {
                return Err(bad(format!(
                    "weight_map entry for '{tensor}' is not a file name: {v}"
                )));
            }
        };
        // Consecutive entries mostly name the same file, which was checked when first seen.
        if last == Some(file) {
            continue;
        }
        if escapes(file) {
            return Err(ResolveError::IndexEscapes {
                index: path.to_path_buf(),
                tensor: tensor.to_string(),
                file: file.to_string(),
            });
        }
        files.insert(file.to_string());
        last = Some(file);
    }
    Ok(files)
}

/// A tensor name and what the index says about it.
type Entries<'a> = Vec<(Cow<'a, str>, Entry<'a>)>;

/// What a `Value` object would hold: each name once, at its first place, with its last value.
/// Checked after the parse, into a set sized once: several times faster than a map that grows
/// while the parser runs, and names are almost never repeated.
fn last_value_wins(entries: Entries<'_>) -> Entries<'_> {
    let distinct: HashSet<&str, foldhash::fast::RandomState> =
        entries.iter().map(|(name, _)| name.as_ref()).collect();
    if distinct.len() == entries.len() {
        return entries;
    }
    let map: IndexMap<Cow<str>, Entry> = entries.into_iter().collect();
    map.into_iter().collect()
}

/// True when an index entry points outside the checkpoint folder.
fn escapes(file: &str) -> bool {
    let p = Path::new(file);
    p.is_absolute()
        || p.components().any(|c| {
            matches!(
                c,
                Component::ParentDir | Component::RootDir | Component::Prefix(_)
            )
        })
}

/// The index reduced to its `weight_map` (the last one, as in a `Value`); `None` when the index
/// is no object, has none, or its `weight_map` is no object.
struct Index<'a> {
    weight_map: Option<Entries<'a>>,
}

/// One `weight_map` value: a file name, or anything else (kept to be shown in the error).
enum Entry<'a> {
    File(Cow<'a, str>),
    Other(Box<Value>),
}

/// For a value that must be an object to count: every other JSON value is read past and
/// answered with `None`.
macro_rules! anything_but_an_object_is_none {
    () => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(None)
        }
    };
}

impl<'de> Deserialize<'de> for Index<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Top;
        impl<'de> Visitor<'de> for Top {
            type Value = Option<Entries<'de>>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            anything_but_an_object_is_none!();
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut weight_map = None;
                while let Some(key) = map.next_key::<Name>()? {
                    if key.0 == "weight_map" {
                        weight_map = map.next_value_seed(WeightMap)?;
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(weight_map)
            }
        }
        Ok(Index {
            weight_map: d.deserialize_any(Top)?,
        })
    }
}

/// `weight_map`'s entries in document order, names and file names borrowed where the text has
/// no escapes.
struct WeightMap;

impl<'de> DeserializeSeed<'de> for WeightMap {
    type Value = Option<Entries<'de>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for WeightMap {
    type Value = Option<Entries<'de>>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    anything_but_an_object_is_none!();
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some((name, entry)) = map.next_entry::<Name, Entry>()? {
            entries.push((name.0, entry));
        }
        Ok(Some(entries))
    }
}

/// A string, borrowed from the text unless it has escapes.
struct Name<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Name<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Name<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Name(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Name(Cow::Owned(s.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> Deserialize<'de> for Entry<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entry<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Entry::File(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Entry::File(Cow::Owned(s.to_string())))
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<Self::Value, E> {
                Ok(other(Value::from(b)))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
                Ok(other(Value::from(n)))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
                Ok(other(Value::from(n)))
            }
            fn visit_f64<E: de::Error>(self, n: f64) -> Result<Self::Value, E> {
                Ok(other(Value::from(n)))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(other(Value::Null))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                Value::deserialize(SeqAccessDeserializer::new(seq)).map(other)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                Value::deserialize(MapAccessDeserializer::new(map)).map(other)
            }
        }
        d.deserialize_any(V)
    }
}

fn other(v: Value) -> Entry<'static> {
    Entry::Other(Box::new(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the parser must answer: the text read into a `Value` and its `weight_map` walked.
    fn oracle(text: &str) -> Result<BTreeSet<String>, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| "has no \"weight_map\" object".to_string())?;
        let mut files = BTreeSet::new();
        for (tensor, file) in map {
            let Some(file) = file.as_str() else {
                return Err(format!(
                    "weight_map entry for '{tensor}' is not a file name: {file}"
                ));
            };
            if escapes(file) {
                return Err(format!("escapes: {tensor} → {file}"));
            }
            files.insert(file.to_string());
        }
        Ok(files)
    }

    fn parse(text: &str) -> Result<BTreeSet<String>, String> {
        files_in(Path::new("i.json"), text).map_err(|e| match e {
            ResolveError::BadIndex { message, .. } => message,
            ResolveError::IndexEscapes { tensor, file, .. } => {
                format!("escapes: {tensor} → {file}")
            }
            e => panic!("unexpected {e}"),
        })
    }

    #[test]
    fn the_parser_answers_as_a_value_would() {
        for text in [
            r#"{"metadata": {"total_size": 8}, "weight_map": {"a": "x.safetensors", "b": "x.safetensors", "c": "y.safetensors"}}"#,
            // A repeated name keeps its last value: "x" is not read.
            r#"{"weight_map": {"a": "x", "a": "y"}}"#,
            r#"{"weight_map": {"a": "x"}, "weight_map": {"a": "y"}}"#,
            r#"{"weight_map": {"a": "x"}, "weight_map": 5}"#,
            r#"{"weight_map": 5, "weight_map": {"a": "x"}}"#,
            // The first bad entry in the object's order, which a repeat does not move.
            r#"{"weight_map": {"a": "x", "b": [1, {"c": null}], "a": 5}}"#,
            r#"{"weight_map": {"b": "../x", "a": 2.5}}"#,
            r#"{"weight_map": {"a": "x", "b": "x", "c": "/x"}}"#,
            r#"{"weight_map": {"a": "../x", "a": "y"}}"#,
            r#"{"weight_map": {"a": 5}} trailing"#,
            r#"{"weight_map": {"a": 5, "b": "x"]"#,
            r#"{"weight_map": {"\u00e9": "x\u00e9", "\u0061": "y"}}"#,
            r#"{"weight\u005fmap": {"a": "x"}}"#,
            r#"{"weight_map": {"a": ""}}"#,
            r#"{"weight_map": {}}"#,
            r#"{"weight_map": []}"#,
            r#"{"weight_map": null}"#,
            r#"{"metadata": {}}"#,
            r#"[{"weight_map": {"a": "x"}}]"#,
            r#""weight_map""#,
            r#"{"weight_map": {"a": true, "b": -3, "c": 18446744073709551615, "d": {}}}"#,
            "",
            "{",
        ] {
            assert_eq!(parse(text), oracle(text), "{text}");
        }
    }

    /// Random indexes built from a few names, files and hostile values (repeats, escapes,
    /// non-strings, paths out of the folder, broken syntax): the parser always agrees with the
    /// `Value` reading.
    #[test]
    fn random_indexes_are_read_as_a_value_would_read_them() {
        let mut rng = fastrand::Rng::with_seed(0x1DE7_5EED);
        let names = ["a", "b", "c", "\\u0061", "weight_map", "é"];
        let values = [
            "\"x.safetensors\"",
            "\"y.safetensors\"",
            "\"x\\u002esafetensors\"",
            "\"../x\"",
            "\"/etc/passwd\"",
            "\"sub/z\"",
            "\"\"",
            "7",
            "-1.5e3",
            "null",
            "false",
            "[\"x\"]",
            "{\"a\": [1, 2]}",
        ];
        let (mut ok, mut refused) = (0, 0);
        for _ in 0..20_000 {
            let entries: Vec<String> = (0..rng.usize(..6))
                .map(|_| {
                    let n = names[rng.usize(..names.len())];
                    let v = values[rng.usize(..values.len())];
                    format!("\"{n}\": {v}")
                })
                .collect();
            let map = match rng.u8(..8) {
                0 => values[rng.usize(..values.len())].to_string(),
                _ => format!("{{{}}}", entries.join(", ")),
            };
            let mut top = vec![format!("\"weight_map\": {map}")];
            if rng.bool() {
                top.insert(
                    rng.usize(..=top.len()),
                    "\"metadata\": {\"total_size\": 1}".into(),
                );
            }
            if rng.u8(..6) == 0 {
                top.push("\"weight_map\": {\"a\": \"w\"}".into());
            }
            let mut text = format!("{{{}}}", top.join(", "));
            if rng.u8(..10) == 0 {
                let keep = rng.usize(..=text.chars().count());
                text = text.chars().take(keep).collect();
            }
            let want = oracle(&text);
            if want.is_ok() {
                ok += 1;
            } else {
                refused += 1;
            }
            assert_eq!(parse(&text), want, "{text}");
        }
        assert!(ok > 1000 && refused > 1000, "{ok} read, {refused} refused");
    }

    /// Outside `weight_map`, values are skimmed, as the `Value` reading does not: what Python's
    /// `json` takes passes here too.
    #[test]
    fn metadata_is_skimmed_not_read() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        for metadata in ["1e400", deep.as_str()] {
            let text = format!(r#"{{"metadata": {metadata}, "weight_map": {{"a": "x"}}}}"#);
            assert!(oracle(&text).is_err(), "{text}");
            assert_eq!(parse(&text), Ok(BTreeSet::from(["x".to_string()])));
        }
    }
}
