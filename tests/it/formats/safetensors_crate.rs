//! wload reads headers with the `safetensors` crate and writes part-file headers with its types.
//! These tests pin down why that is right: the crate's writer reproduces vLLM's files byte for
//! byte, the reader maps files without reading their data, and what the crate accepts that the
//! old hand-written reader did not (a null `__metadata__`) or what wload refuses on top of it
//! (a name given twice) is deliberate.

use std::fs;
use std::path::{Path, PathBuf};

use safetensors::SafeTensors;
use serde_json::{Value, json};
use tempfile::TempDir;
use wload::testing::{self as checkpoint, HeaderError};

use crate::support::*;

/// Every part file vLLM wrote for the golden cases.
fn vllm_part_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for case in golden_cases() {
        for rank in 0..case.world_size() {
            files.extend(case.rank_files(rank));
        }
    }
    assert!(files.len() > 20, "golden part files found: {}", files.len());
    files
}

/// vLLM writes its part files with `safetensors.torch.save_file`. Parsing each with the crate and
/// serialising it again gives the file back byte for byte: the Rust crate's order (dtype, wider
/// first, then name), escapes and space padding are those of vLLM's files, which is what lets
/// wload's writer (src/exec/parts.rs) build headers from the crate's types.
#[test]
fn vllm_part_files_are_what_the_crate_serialises() {
    for path in vllm_part_files() {
        let bytes = fs::read(&path).unwrap();
        let st = SafeTensors::deserialize(&bytes)
            .unwrap_or_else(|e| panic!("{}: the crate refuses it: {e}", path.display()));
        let again = safetensors::serialize(st.tensors(), None).unwrap();
        let header_len = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert_eq!(
            String::from_utf8_lossy(&again[8..header_len.min(again.len())]),
            String::from_utf8_lossy(&bytes[8..header_len]),
            "{}: header",
            path.display()
        );
        assert!(again == bytes, "{}: data differs", path.display());
    }
}

/// Minor plus major page faults of the calling thread so far.
fn thread_faults() -> i64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) },
        0
    );
    usage.ru_minflt + usage.ru_majflt
}

/// A safetensors file with one U8 tensor of `data_len` bytes, made sparse with `set_len`.
fn sparse_file(path: &Path, data_len: u64) {
    let mut header =
        json!({"big": {"dtype": "U8", "shape": [data_len], "data_offsets": [0, data_len]}})
            .to_string()
            .into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    fs::write(path, assemble(&header, &[])).unwrap();
    let f = fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(8 + header.len() as u64 + data_len).unwrap();
}

/// The crate wants the whole file as one buffer; wload hands it a map of the file, so reading
/// the header of a 2 GiB file faults in a handful of pages, not the 524,288 of its data.
#[test]
fn header_read_faults_in_only_the_header_pages() {
    let tmp = TempDir::new().unwrap();
    let small = tmp.path().join("small.safetensors");
    let big = tmp.path().join("big.safetensors");
    sparse_file(&small, 16);
    sparse_file(&big, 2 << 30);
    // The first read pages in the reader's code; only the second one is measured.
    checkpoint::read_header(&small, "small.safetensors", 0).unwrap();
    let before = thread_faults();
    let w = checkpoint::read_header(&big, "big.safetensors", 0).unwrap();
    let faults = thread_faults() - before;
    assert_eq!(w.tensors[0].len, 2 << 30);
    assert_eq!(w.size, w.data_start() + (2 << 30));
    assert!(
        faults < 1000,
        "{faults} page faults to read a header: the data was touched"
    );
}

/// A null `__metadata__` is what the crate (and so vLLM's `safe_open`) reads as "no metadata".
/// The hand-written reader wload had before refused it; wload now reads what vLLM reads.
#[test]
fn null_metadata_is_read_as_no_metadata() {
    let tmp = copy_fixture("llama_gqa");
    let shard = tmp.path().join("model-00006-of-00006.safetensors");
    edit_header(&shard, |h| {
        h.insert("__metadata__".into(), Value::Null);
    });
    let w = checkpoint::read_header(&shard, "model-00006-of-00006.safetensors", 0).unwrap();
    assert_eq!(w.metadata, None);
    assert_eq!(w.tensors.len(), 4);
    let out = wload_json(&["inspect", s(tmp.path()), "--json"]);
    assert_eq!(out["files"].as_array().map(Vec::len), Some(6), "{out}");
    assert_eq!(out["totals"]["tensors"], json!(21), "{out}");
}

/// The crate keeps one of two entries with the same name; vLLM would load a single tensor where
/// the file lists two. wload refuses the file and names the tensor, even when both entries are
/// the same and the crate finds nothing else wrong.
#[test]
fn a_name_given_twice_is_refused_by_name() {
    let tmp = copy_fixture("llama_gqa");
    let shard = tmp.path().join("model-00006-of-00006.safetensors");
    let mut raw = RawFile::read(&shard);
    let text = String::from_utf8(raw.header_text.clone()).unwrap();
    let norm = "model.norm.weight";
    let entry = serde_json::to_string(&raw.header()[norm]).unwrap();
    raw.header_text = format!("{{\"{norm}\":{entry},{}", &text[1..]).into_bytes();
    raw.write(&shard);
    let bytes = fs::read(&shard).unwrap();
    let crate_reads = SafeTensors::read_metadata(&bytes).map(|(_, m)| m.tensors().len());
    assert_eq!(
        crate_reads.ok(),
        Some(4),
        "the crate accepts it, keeping one"
    );
    match checkpoint::read_header(&shard, "x", 0) {
        Err(HeaderError::BadJson { message, .. }) => {
            assert!(
                message.contains(&format!("'{norm}' appears twice")),
                "{message}"
            )
        }
        other => panic!("{other:?}"),
    }
}

/// Where the crate only says "invalid offset" or "incomplete metadata", wload says which tensor
/// and what: every refusal the crate makes of these files comes with wload's own words.
#[test]
fn crate_refusals_are_explained_by_tensor() {
    let tmp = copy_fixture("llama_gqa");
    let shard = tmp.path().join("model-00006-of-00006.safetensors");
    let original = fs::read(&shard).unwrap();
    let norm = "model.norm.weight";
    type Edit = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "incomplete metadata",
            Box::new(|p: &Path| {
                let mut b = fs::read(p).unwrap();
                b.extend_from_slice(b"junk");
                write_raw(p, &b);
            }),
            "trailing bytes",
        ),
        (
            "invalid offset",
            Box::new(move |p: &Path| {
                edit_header(p, |h| h[norm]["data_offsets"] = json!([66050, 66306]));
                let mut b = fs::read(p).unwrap();
                b.extend_from_slice(&[0, 0]);
                write_raw(p, &b);
            }),
            "2 unused bytes before tensor 'model.norm.weight'",
        ),
        (
            "invalid shape",
            Box::new(move |p: &Path| edit_header(p, |h| h[norm]["shape"] = json!([129]))),
            "tensor 'model.norm.weight' shape [129] of BF16 needs 258 bytes",
        ),
        (
            "byte boundary",
            Box::new(move |p: &Path| {
                edit_header(p, |h| {
                    h[norm]["dtype"] = json!("F4");
                    h[norm]["shape"] = json!([511]);
                })
            }),
            "shape [511] of F4 needs a fractional number of bytes (511 × 4 bits), but its \
             data_offsets span 256",
        ),
        (
            "invalid JSON",
            Box::new(move |p: &Path| edit_header(p, |h| h[norm]["dtype"] = json!("Q7"))),
            "tensor 'model.norm.weight' has unknown dtype 'Q7'",
        ),
    ];
    for (crate_says, edit, wload_says) in cases {
        write_raw(&shard, &original);
        edit(&shard);
        let bytes = fs::read(&shard).unwrap();
        let e = SafeTensors::read_metadata(&bytes).unwrap_err().to_string();
        assert!(e.contains(crate_says), "the crate says: {e}");
        let err = checkpoint::read_header(&shard, "x", 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains(wload_says), "{err}");
        assert!(err.contains(s(&shard)), "{err}");
    }
}
