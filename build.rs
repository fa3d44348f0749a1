//! Lists every family file in `mappings/` for the binary to embed (`mapping::EMBEDDED`), so that
//! adding a family is a new YAML file and no Rust edit. A dozen lines here rather than an
//! `include_dir`-style crate: those cannot tell Cargo to rebuild when a file is *added* to the
//! folder, which `rerun-if-changed` on the folder does.

use std::path::Path;
use std::{env, fs};

fn main() {
    println!("cargo::rerun-if-changed=mappings");
    let dir = Path::new(&env::var("CARGO_MANIFEST_DIR").expect("set by Cargo")).join("mappings");
    let mut files: Vec<String> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("readable mappings/ entry").file_name())
        .filter_map(|name| name.into_string().ok())
        // common.yaml is not a family: it is embedded on its own (`mapping::COMMON`).
        .filter(|name| name.ends_with(".yaml") && name != "common.yaml")
        .collect();
    files.sort();
    let mut out = String::from("&[\n");
    for name in &files {
        let path = dir.join(name);
        let path = path.to_str().expect("a UTF-8 path to mappings/");
        out.push_str(&format!("    ({name:?}, include_str!({path:?})),\n"));
    }
    out.push_str("]\n");
    let dest = Path::new(&env::var("OUT_DIR").expect("set by Cargo")).join("mappings.rs");
    fs::write(&dest, out).unwrap_or_else(|e| panic!("{}: {e}", dest.display()));
}
