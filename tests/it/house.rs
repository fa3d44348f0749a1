//! The house rules of `src/`, enforced rather than described (docs/architecture.md, "Layers"):
//! imports point down the layer table, never up, and never through `lib.rs`; no file runs over
//! 600 lines of code and no function over 100 lines. Each failure names the file and line.
//!
//! The source is read as text, as rust-lang's `tidy` reads it: comments, strings and character
//! literals are blanked first, so that neither a doc comment nor a message mentioning
//! `crate::plan` counts as an import.

use std::fs;
use std::path::{Path, PathBuf};

use crate::support::manifest_dir;

/// The layers, bottom first. A module may import from its own layer and the ones below.
const LAYERS: &[&[&str]] = &[
    // 0 vocabulary
    &[
        "exit",
        "units",
        "progress",
        "small_file",
        "checksum",
        "dtype",
        "ranks",
        "problem",
        "file_stamp",
        "escape",
        "multimodal",
    ],
    // 1 file formats
    &["config", "checkpoint", "sharded"],
    // 2 find and open
    &["resolve", "open"],
    // 3 the family's view of the model
    &["mapping", "layout", "quant", "model"],
    // 4 map
    &["map"],
    // 5 plan
    &["plan"],
    // 6 execute
    &["exec"],
    // 7 subcommands
    &["commands"],
    // 8 people
    &["report"],
    // 9 the crate's face
    &["cli", "lib", "bin"],
];

/// Files allowed over 600 code lines: each holds one concept (issue 25).
const LONG_FILES: &[&str] = &["mapping/rules.rs", "mapping/expr.rs"];
const MAX_FILE_LINES: usize = 600;
const MAX_FN_LINES: usize = 100;

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|row| row.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The source with comments, string and character literals replaced by spaces; newlines kept,
/// so offsets still give line numbers.
fn blank(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    let clear = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let end = src[i..].find('\n').map_or(b.len(), |n| i + n);
                clear(&mut out, i, end);
                i = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let end = src[i + 2..].find("*/").map_or(b.len(), |n| i + 2 + n + 2);
                clear(&mut out, i, end);
                i = end;
            }
            b'r' if matches!(b.get(i + 1), Some(b'"') | Some(b'#'))
                && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')) =>
            {
                let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
                if b.get(i + 1 + hashes) != Some(&b'"') {
                    i += 1;
                    continue;
                }
                let close = format!("\"{}", "#".repeat(hashes));
                let start = i + 2 + hashes;
                let end = src[start..]
                    .find(&close)
                    .map_or(b.len(), |n| start + n + close.len());
                clear(&mut out, i, end);
                i = end;
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                clear(&mut out, i, j + 1);
                i = j + 1;
            }
            b'\'' => {
                // A character literal ('x', '\n', '\u{..}'), not a lifetime ('a).
                let end = if b.get(i + 1) == Some(&b'\\') {
                    src[i + 2..].find('\'').map(|n| i + 2 + n + 1)
                } else {
                    let c = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                    (b.get(i + 1 + c) == Some(&b'\'')).then_some(i + 2 + c)
                };
                match end {
                    Some(end) => {
                        clear(&mut out, i, end);
                        i = end;
                    }
                    None => i += 1,
                }
            }
            _ => i += 1,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The code before the file's inline `#[cfg(test)] mod tests { … }`, if it has one.
fn code_part(blanked: &str) -> &str {
    let tail = (blanked.match_indices("\n#[cfg(test)]\nmod ")).find(|&(i, m)| {
        let line = blanked[i + m.len()..].lines().next().unwrap_or("");
        line.trim_end().ends_with('{')
    });
    match tail {
        Some((i, _)) => &blanked[..i],
        None => blanked,
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset].matches('\n').count() + 1
}

/// The first names of every path that starts with `crate::`: `crate::a::b` gives `a`,
/// `crate::{a, b::c}` gives `a` and `b`. With the offset of each.
fn crate_paths(code: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        if at > 0 && {
            let c = code.as_bytes()[at - 1];
            c.is_ascii_alphanumeric() || c == b'_' || c == b'$'
        } {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            let mut first = true;
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        if !item.is_empty() {
                            found.push((at, std::mem::take(&mut item)));
                        }
                        first = true;
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 && first {
                    if c.is_alphanumeric() || c == '_' {
                        item.push(c);
                    } else if !item.is_empty() {
                        found.push((at, std::mem::take(&mut item)));
                        first = false;
                    }
                }
            }
            if !item.is_empty() {
                found.push((at, item));
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            found.push((at, name));
        }
    }
    found
}

/// `(name, first line, lines)` of every function with a body.
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    for (at, _) in code.match_indices("fn ") {
        if at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_') {
            continue;
        }
        let name: String = code[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        // The body's `{`, unless the declaration ends first (a trait method without a body).
        let mut paren = 0i32;
        let mut open = None;
        for (j, &c) in b.iter().enumerate().skip(at) {
            match c {
                b'(' | b'[' => paren += 1,
                b')' | b']' => paren -= 1,
                b';' if paren == 0 => break,
                b'{' if paren == 0 => {
                    open = Some(j);
                    break;
                }
                _ => {}
            }
        }
        let Some(open) = open else { continue };
        let mut depth = 0;
        for (j, &c) in b.iter().enumerate().skip(open) {
            match c {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        let first = line_of(code, at);
                        out.push((name.clone(), first, line_of(code, j) - first + 1));
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    out
}

struct Source {
    /// Relative to `src/`, with `/`.
    rel: String,
    /// The layer of its top-level module.
    top: String,
    blanked: String,
}

fn sources() -> Vec<Source> {
    let src = manifest_dir().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let top = rel
                .split('/')
                .next()
                .unwrap()
                .trim_end_matches(".rs")
                .to_string();
            let text = fs::read_to_string(&p).unwrap();
            Source {
                rel,
                top,
                blanked: blank(&text),
            }
        })
        .collect()
}

#[test]
fn every_top_level_module_has_a_layer() {
    let unknown: Vec<String> = (sources().into_iter())
        .filter(|s| layer_of(&s.top).is_none())
        .map(|s| {
            format!(
                "src/{}: module `{}` is in no layer of tests/it/house.rs",
                s.rel, s.top
            )
        })
        .collect();
    assert!(unknown.is_empty(), "{}", unknown.join("\n"));
}

#[test]
fn imports_point_down_the_layers_and_never_through_lib_rs() {
    let mut wrong = Vec::new();
    for s in sources() {
        let Some(own) = layer_of(&s.top) else {
            continue;
        };
        if s.top == "lib" || s.top == "bin" {
            continue;
        }
        let code = code_part(&s.blanked);
        for (at, name) in crate_paths(code) {
            let line = line_of(code, at);
            match layer_of(&name) {
                Some(to) if to > own => wrong.push(format!(
                    "src/{}:{line}: `{}` (layer {own}) imports `crate::{name}` (layer {to}): imports point down",
                    s.rel, s.top
                )),
                Some(_) => {}
                None => wrong.push(format!(
                    "src/{}:{line}: `crate::{name}` goes through lib.rs: import it from the file that defines it",
                    s.rel
                )),
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn no_file_runs_over_600_lines_of_code() {
    let long: Vec<String> = (sources().into_iter())
        .filter(|s| !LONG_FILES.contains(&s.rel.as_str()) && !is_test_only(&s.rel))
        .filter_map(|s| {
            let n = code_part(&s.blanked).lines().count();
            (n > MAX_FILE_LINES).then(|| {
                format!(
                    "src/{}: {n} lines of code (at most {MAX_FILE_LINES})",
                    s.rel
                )
            })
        })
        .collect();
    assert!(long.is_empty(), "{}", long.join("\n"));
}

#[test]
fn no_function_runs_over_100_lines() {
    let mut long = Vec::new();
    for s in sources() {
        for (name, line, n) in functions(&s.blanked) {
            if n > MAX_FN_LINES {
                long.push(format!(
                    "src/{}:{line}: fn {name} is {n} lines (at most {MAX_FN_LINES})",
                    s.rel
                ));
            }
        }
    }
    assert!(long.is_empty(), "{}", long.join("\n"));
}

/// Unit-test files that `#[cfg(test)] mod …;` brings in: tests, not code.
fn is_test_only(rel: &str) -> bool {
    rel.ends_with("/tests.rs") || rel.ends_with("_tests.rs")
}

#[test]
fn the_checks_see_what_they_check() {
    // Guards against a scanner that silently finds nothing.
    let code = blank(
        "use crate::{a, b::{c, d}};\nfn f() {\n    let s = \"crate::x\"; // crate::y\n    crate::z::w();\n}\n",
    );
    let names: Vec<String> = crate_paths(&code).into_iter().map(|(_, n)| n).collect();
    assert_eq!(names, ["a", "b", "z"]);
    assert_eq!(functions(&code), [("f".to_string(), 2, 4)]);
    assert_eq!(
        blank("let c = '{'; fn g<'a>(x: &'a str) {}"),
        "let c =    ; fn g<'a>(x: &'a str) {}"
    );
}
