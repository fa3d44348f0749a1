//! The house rules of `src/`, enforced rather than described (docs/architecture.md, "Layers"):
//! imports point down the layer table, never up, and never through `lib.rs`; inside a folder the
//! files import each other without a circle; no file runs over 600 lines of code and no function
//! over 100 lines. Each failure names the file and line.
//!
//! The source is read as text, as rust-lang's `tidy` reads it: comments, strings and character
//! literals are blanked first, so that neither a doc comment nor a message mentioning
//! `crate::plan` counts as an import.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
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
    &["cli", "app", "lib", "bin"],
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

    // Every kind of path the circle check follows, made absolute from `a::b` (`a/b.rs`).
    let module = ["a".to_string(), "b".to_string()];
    let code = "mod kid;\nuse super::{c::D, e as f};\nuse self::kid::G;\nfn h() { super::super::x::y(); kid::z(); crate::p::Q::<u8>::new(); }\n";
    let paths: Vec<(String, String)> = (module_paths(code, &module).into_iter())
        .map(|(_, p, name)| (p.join("::"), name))
        .collect();
    let want = [
        ("a::c::D", "D"),
        ("a::e", "f"),
        ("a::b::kid::G", "G"),
        ("x::y", "y"),
        ("a::b::kid::z", "z"),
        ("p::Q", "Q"),
    ];
    assert_eq!(paths, want.map(|(p, n)| (p.to_string(), n.to_string())));
    // A circle of three rooms is found, with the way round.
    let arrow = |a: &str, b: &str| {
        (
            (a.to_string(), b.to_string()),
            (a.to_string(), 1, b.to_string()),
        )
    };
    let arrows = BTreeMap::from([
        arrow("x", "y"),
        arrow("y", "z"),
        arrow("z", "x"),
        arrow("x", "w"),
    ]);
    let found = circles(&arrows);
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0].0,
        BTreeSet::from(["x", "y", "z"].map(String::from))
    );
    assert_eq!(found[0].1, ["x", "y", "z", "x"]);
}

/// A file's module under the crate root: `commands/load.rs` and `commands/load/mod.rs` are
/// `commands::load`, `lib.rs` is the root itself.
fn module_of(rel: &str) -> Vec<String> {
    let stem = rel.trim_end_matches(".rs");
    let stem = stem.strip_suffix("/mod").unwrap_or(stem);
    if stem == "lib" {
        return Vec::new();
    }
    stem.split('/').map(str::to_string).collect()
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn skip_ws(text: &str, mut i: usize) -> usize {
    while let Some(c) = text[i..].chars().next().filter(|c| c.is_whitespace()) {
        i += c.len_utf8();
    }
    i
}

/// A path found in a file: where it starts, the path from the crate root, and the name it brings
/// into scope when it is a `use` (`b` for `a::b`, `e` for `c::d as e`, `*` for a glob).
type FoundPath = (usize, Vec<String>, String);

/// The paths of a `use` tree or an expression path, read from just after its root's `::` and
/// pushed onto `prefix`: `a::{b, c::d as e}` gives `…::a::b` and `…::a::c::d`. An expression
/// path (`a::f(…)`, `A::<T>`) ends at its last name. Returns how far it read.
fn path_tree(text: &str, at: usize, prefix: &[String], out: &mut Vec<FoundPath>) -> usize {
    let mut path = prefix.to_vec();
    let mut i = 0;
    loop {
        i = skip_ws(text, i);
        if text[i..].starts_with('{') {
            i += 1;
            loop {
                i = skip_ws(text, i);
                if i >= text.len() || text[i..].starts_with('}') {
                    return i + 1;
                }
                i += path_tree(&text[i..], at, &path, out);
                i = skip_ws(text, i);
                if text[i..].starts_with(',') {
                    i += 1;
                } else if !text[i..].starts_with('}') {
                    return i;
                }
            }
        }
        if text[i..].starts_with('*') {
            path.push("*".into());
            out.push((at, path, "*".into()));
            return i + 1;
        }
        let name: String = text[i..].chars().take_while(|&c| is_ident(c)).collect();
        if name.is_empty() {
            return i;
        }
        i += name.len();
        if name == "self" && path.len() == prefix.len() {
            // `a::{self, b}`: `a` itself.
            let last = path.last().cloned().unwrap_or_default();
            out.push((at, path, last));
            return i;
        }
        path.push(name.clone());
        if text[i..].starts_with("::") && !text[i + 2..].starts_with('<') {
            i += 2;
            continue;
        }
        let mut alias = name;
        let j = skip_ws(text, i);
        if let Some(after) = text[j..].strip_prefix("as ") {
            let k = skip_ws(text, j + 3);
            let _ = after;
            alias = text[k..].chars().take_while(|&c| is_ident(c)).collect();
            i = k + alias.len();
        }
        out.push((at, path, alias));
        return i;
    }
}

/// The child module a line declares: `mod x;`, `pub mod x;`, `pub(crate) mod x;`.
fn declared_child(line: &str) -> Option<&str> {
    let mut l = line.trim();
    if let Some(rest) = l.strip_prefix("pub(") {
        l = rest.split_once(')')?.1.trim_start();
    } else if let Some(rest) = l.strip_prefix("pub ") {
        l = rest.trim_start();
    }
    let name = l.strip_prefix("mod ")?.strip_suffix(';')?.trim();
    name.chars().all(is_ident).then_some(name)
}

/// Every path in a file that may name another file of the crate, from the crate root:
/// `crate::…`, `super::…` (`super::super::…`), `self::…`, and a declared child module's `x::…`.
fn module_paths(code: &str, module: &[String]) -> Vec<FoundPath> {
    let children: BTreeSet<&str> = code.lines().filter_map(declared_child).collect();
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut at = 0;
    while at < code.len() {
        let c = code[at..].chars().next().unwrap();
        let joined = at > 0 && {
            let p = code[..at].chars().next_back().unwrap();
            is_ident(p) || p == ':' || p == '$'
        };
        if !is_ident(c) || joined {
            at += c.len_utf8();
            continue;
        }
        let word: String = code[at..].chars().take_while(|&c| is_ident(c)).collect();
        let mut after = at + word.len();
        if !code[after..].starts_with("::") {
            at = after;
            continue;
        }
        let mut base = module.to_vec();
        match word.as_str() {
            "crate" => base.clear(),
            "self" => {}
            "super" => {
                base.pop();
                while code[after + 2..].starts_with("super::") {
                    base.pop();
                    after += "::super".len();
                }
            }
            w if children.contains(w) => base.push(w.to_string()),
            _ => {
                at = after;
                continue;
            }
        }
        let _ = b;
        at = after + 2 + path_tree(&code[after + 2..], at, &base, &mut out);
    }
    out
}

/// One file of the crate as the circle check sees it.
struct ModFile {
    rel: String,
    module: Vec<String>,
    /// The path of each arrow out, with its line.
    paths: Vec<(usize, Vec<String>)>,
    /// What its `use` items bring into scope: name → path, so that `super::Name` follows a
    /// re-export to the file that defines `Name`.
    uses: BTreeMap<String, Vec<String>>,
}

fn mod_files() -> Vec<ModFile> {
    (sources().into_iter())
        .filter(|s| s.top != "bin" && !is_test_only(&s.rel))
        .map(|s| {
            let module = module_of(&s.rel);
            let code = code_part(&s.blanked).to_string();
            let found = module_paths(&code, &module);
            let mut uses = BTreeMap::new();
            for (at, path, name) in &found {
                let line_start = code[..*at].rfind('\n').map_or(0, |n| n + 1);
                if code[line_start..*at].contains("use ") && name != "*" {
                    uses.insert(name.clone(), path.clone());
                }
            }
            let paths = found
                .into_iter()
                .map(|(at, path, _)| (line_of(&code, at), path))
                .collect();
            ModFile {
                rel: s.rel,
                module,
                paths,
                uses,
            }
        })
        .collect()
}

/// The file a path lands in: the deepest module on it, or, when the next name is one that
/// module imports, the file that name comes from.
fn resolve(
    files: &[ModFile],
    by_module: &BTreeMap<Vec<String>, usize>,
    path: &[String],
    depth: usize,
) -> Option<usize> {
    let k = (0..=path.len())
        .rev()
        .find(|&k| by_module.contains_key(&path[..k]))?;
    let file = by_module[&path[..k]];
    let Some(name) = path.get(k) else {
        return Some(file);
    };
    if depth > 8 || name == "*" {
        return Some(file);
    }
    let f = &files[file];
    if let Some(target) = f.uses.get(name) {
        let mut next = target.clone();
        next.extend_from_slice(&path[k + 1..]);
        return resolve(files, by_module, &next, depth + 1).or(Some(file));
    }
    Some(file)
}

/// Each folder's arrows between its rooms (a room: one file, or one subfolder with its file, as
/// one), with the first file-to-file arrow that draws each: folder → (from, to) → (file, line,
/// file). An arrow between a module and its own children is no arrow inside a folder.
type Arrows = BTreeMap<Vec<String>, BTreeMap<(String, String), (String, usize, String)>>;

fn folder_arrows(files: &[ModFile]) -> Arrows {
    let by_module: BTreeMap<Vec<String>, usize> = (files.iter().enumerate())
        .map(|(i, f)| (f.module.clone(), i))
        .collect();
    let mut arrows = Arrows::new();
    for f in files {
        for (line, path) in &f.paths {
            let Some(to) = resolve(files, &by_module, path, 0) else {
                continue;
            };
            let (a, b) = (&f.module, &files[to].module);
            let k = a.iter().zip(b).take_while(|(x, y)| x == y).count();
            if k == a.len() || k == b.len() {
                continue;
            }
            arrows
                .entry(a[..k].to_vec())
                .or_default()
                .entry((a[k].clone(), b[k].clone()))
                .or_insert_with(|| (f.rel.clone(), *line, files[to].rel.clone()));
        }
    }
    arrows
}

/// The circles of one folder: each set of rooms that reach one another, with one path round it.
fn circles(
    arrows: &BTreeMap<(String, String), (String, usize, String)>,
) -> Vec<(BTreeSet<String>, Vec<String>)> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in arrows.keys() {
        next.entry(a).or_default().push(b);
    }
    let reach = |from: &str| -> BTreeMap<String, String> {
        // Each room reached, with the room it was reached from (breadth first: short paths).
        let mut came: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = VecDeque::from([from.to_string()]);
        while let Some(r) = queue.pop_front() {
            for n in next.get(r.as_str()).into_iter().flatten() {
                if !came.contains_key(*n) {
                    came.insert(n.to_string(), r.clone());
                    queue.push_back(n.to_string());
                }
            }
        }
        came
    };
    let reached: BTreeMap<&str, BTreeMap<String, String>> =
        next.keys().map(|r| (*r, reach(r))).collect();
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (room, came) in &reached {
        if seen.contains(*room) || !came.contains_key(*room) {
            continue;
        }
        let knot: BTreeSet<String> = (came.keys())
            .filter(|r| {
                reached
                    .get(r.as_str())
                    .is_some_and(|c| c.contains_key(*room))
            })
            .cloned()
            .collect();
        // The way round: back from `room` to itself along the breadth-first tree.
        let mut round = vec![room.to_string()];
        let mut at = came[*room].clone();
        while at != *room {
            round.push(at.clone());
            at = came[&at].clone();
        }
        round.push(room.to_string());
        round.reverse();
        seen.extend(knot.iter().cloned());
        out.push((knot, round));
    }
    out
}

#[test]
fn no_circle_of_imports_inside_a_folder() {
    let files = mod_files();
    let arrows = folder_arrows(&files);
    let mut wrong = Vec::new();
    for (folder, arrows) in &arrows {
        let name = folder.join("/");
        for (knot, round) in circles(arrows) {
            let mut text = format!(
                "src/{name}: a circle of imports between {}:",
                knot.iter().cloned().collect::<Vec<_>>().join(", ")
            );
            for pair in round.windows(2) {
                let (from, line, to) = &arrows[&(pair[0].clone(), pair[1].clone())];
                text.push_str(&format!("\n  src/{from}:{line} imports from src/{to}"));
            }
            wrong.push(text);
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
