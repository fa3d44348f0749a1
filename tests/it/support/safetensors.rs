//! A minimal safetensors writer and reader that does not use the crate's own code, so that the
//! tests check wload against an independent reading of the format.

use std::fs;
use std::path::Path;

use serde_json::{Map, Value, json};

/// One tensor for [`write_safetensors`]: name, dtype as safetensors spells it, shape, data bytes.
pub(crate) type Tensor<'a> = (&'a str, &'a str, &'a [u64], &'a [u8]);

/// The bytes of a valid safetensors file holding `tensors`, packed in the given order, with a
/// `__metadata__` entry and the header padded with spaces to a multiple of 8 (as the Python library
/// does).
pub(crate) fn safetensors_bytes(tensors: &[Tensor]) -> Vec<u8> {
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let start = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            (*name).to_string(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut text = serde_json::to_vec(&Value::Object(header)).expect("serialisable header");
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    assemble(&text, &data)
}

/// Writes a valid safetensors file (see [`safetensors_bytes`]).
pub(crate) fn write_safetensors(path: &Path, tensors: &[Tensor]) {
    write_raw(path, &safetensors_bytes(tensors));
}

/// `len(header) as u64 LE` + header + data: a safetensors file whatever the header says.
pub(crate) fn assemble(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + header.len() + data.len());
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header);
    out.extend_from_slice(data);
    out
}

/// Writes `bytes` as they are (for corrupted files).
pub(crate) fn write_raw(path: &Path, bytes: &[u8]) {
    fs::write(path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// A safetensors file read without the crate: the header's JSON text and the data region.
pub(crate) struct RawFile {
    pub header_text: Vec<u8>,
    pub data: Vec<u8>,
}

impl RawFile {
    pub(crate) fn read(path: &Path) -> RawFile {
        let bytes = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(bytes.len() >= 8, "{}: shorter than 8 bytes", path.display());
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert!(
            8 + n <= bytes.len(),
            "{}: header past the end",
            path.display()
        );
        RawFile {
            header_text: bytes[8..8 + n].to_vec(),
            data: bytes[8 + n..].to_vec(),
        }
    }

    /// The header as a JSON object (order preserved), `__metadata__` included.
    pub(crate) fn header(&self) -> Map<String, Value> {
        match serde_json::from_slice(&self.header_text).expect("header is JSON") {
            Value::Object(m) => m,
            other => panic!("header is not an object: {other}"),
        }
    }

    pub(crate) fn write(&self, path: &Path) {
        write_raw(path, &assemble(&self.header_text, &self.data));
    }
}

/// Rewrites the header of the safetensors file at `path` with `edit`, keeping the data region.
pub(crate) fn edit_header(path: &Path, edit: impl FnOnce(&mut Map<String, Value>)) {
    let mut raw = RawFile::read(path);
    let mut header = raw.header();
    edit(&mut header);
    raw.header_text = serde_json::to_vec(&Value::Object(header)).unwrap();
    raw.write(path);
}

/// Appends tensor `name` to the safetensors file at `path`, after its data region.
pub(crate) fn append_tensor(path: &Path, name: &str, dtype: &str, shape: &[u64], data: &[u8]) {
    let mut raw = RawFile::read(path);
    let mut header = raw.header();
    let end = raw.data.len();
    let entry = serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [end, end + data.len()]});
    assert!(
        header.insert(name.to_string(), entry).is_none(),
        "{name} is new"
    );
    raw.data.extend_from_slice(data);
    raw.header_text = serde_json::to_vec(&Value::Object(header)).unwrap();
    raw.write(path);
}

/// One tensor entry of a header, as the test reads it independently of the crate.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct HeaderTensor {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub start: u64,
    pub end: u64,
}

/// The tensors of a safetensors file's header, `__metadata__` skipped, in header order.
pub(crate) fn header_tensors(path: &Path) -> Vec<HeaderTensor> {
    RawFile::read(path)
        .header()
        .into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .map(|(name, v)| {
            let shape = v["shape"]
                .as_array()
                .unwrap_or_else(|| panic!("{}: {name}: no shape", path.display()))
                .iter()
                .map(|d| d.as_u64().expect("shape dims are integers"))
                .collect();
            let offs = v["data_offsets"].as_array().expect("data_offsets");
            HeaderTensor {
                dtype: v["dtype"].as_str().expect("dtype string").to_string(),
                shape,
                start: offs[0].as_u64().unwrap(),
                end: offs[1].as_u64().unwrap(),
                name,
            }
        })
        .collect()
}

/// (name, dtype, shape) of one tensor entry in wload's JSON output (inspect rows, plan tensors).
pub(crate) fn json_tensor(t: &Value) -> (String, String, Vec<u64>) {
    (
        t["name"].as_str().expect("name").to_string(),
        t["dtype"].as_str().expect("dtype").to_string(),
        t["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .map(|d| d.as_u64().expect("shape dims are integers"))
            .collect(),
    )
}
