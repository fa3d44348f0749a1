//! vLLM's sharded_state files: which tensors go into which part file, and each file's header,
//! byte for byte as `safetensors.torch.save_file` writes it (vllm-spec.md §1).

use std::fmt::Write as _;

use crate::plan::RankPlan;
use crate::rank_files::file_name;

/// One output file: its name, header bytes, and where each tensor's data lands.
#[derive(Debug, Clone)]
pub struct PartFile {
    pub rank: u64,
    pub part: u64,
    pub name: String,
    /// The 8-byte length plus the JSON header, padded with spaces to a multiple of 8.
    pub header: Vec<u8>,
    /// (index into the rank's tensors, absolute byte offset of its data in this file).
    pub tensors: Vec<(usize, u64)>,
    pub size: u64,
}

/// Splits a rank's tensors into parts with vLLM's rule (`save_model`): walk in state_dict order;
/// before adding a tensor, if the part's data would exceed `max_size`, the part is closed (even an
/// empty first part). Returns the tensor indices of each part.
pub fn split(rank: &RankPlan, max_size: Option<u64>) -> Vec<Vec<usize>> {
    let mut parts = Vec::new();
    let mut current = Vec::new();
    let mut total = 0u64;
    for (i, t) in rank.tensors.iter().enumerate() {
        if let Some(max) = max_size
            && total + t.bytes > max
        {
            parts.push(std::mem::take(&mut current));
            total = 0;
        }
        current.push(i);
        total += t.bytes;
    }
    if !current.is_empty() {
        parts.push(current);
    }
    parts
}

/// Lays out every part of `rank`: header and data offsets, as safetensors serialises them
/// (tensors sorted by dtype, wider first, then by name; no metadata).
pub fn layout(rank: &RankPlan, max_size: Option<u64>) -> Vec<PartFile> {
    split(rank, max_size)
        .into_iter()
        .enumerate()
        .map(|(p, idx)| {
            let mut order = idx.clone();
            order.sort_by(|&a, &b| {
                let (ta, tb) = (&rank.tensors[a], &rank.tensors[b]);
                tb.dtype.cmp(&ta.dtype).then_with(|| ta.name.cmp(&tb.name))
            });
            let mut json = String::from("{");
            let mut offset = 0u64;
            let mut rel = Vec::with_capacity(order.len());
            for (k, &i) in order.iter().enumerate() {
                let t = &rank.tensors[i];
                if k > 0 {
                    json.push(',');
                }
                json.push_str(&serde_json::to_string(&t.name).expect("strings serialise"));
                let dims: Vec<String> = t.shape.iter().map(u64::to_string).collect();
                write!(
                    json,
                    ":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                    t.dtype,
                    dims.join(","),
                    offset,
                    offset + t.bytes
                )
                .expect("writing to a String");
                rel.push((i, offset));
                offset += t.bytes;
            }
            json.push('}');
            let mut hdr = json.into_bytes();
            hdr.resize(hdr.len().next_multiple_of(8), b' ');
            let mut header = (hdr.len() as u64).to_le_bytes().to_vec();
            header.extend_from_slice(&hdr);
            let base = header.len() as u64;
            PartFile {
                rank: rank.rank,
                part: p as u64,
                name: file_name(rank.rank, p as u64),
                size: base + offset,
                tensors: rel.into_iter().map(|(i, o)| (i, base + o)).collect(),
                header,
            }
        })
        .collect()
}

/// Parses `500MB`, `5GiB`, `40000`: decimal (kB, MB, GB, TB) and binary (KiB, MiB, GiB, TiB) units.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim();
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "m" | "mb" => 1000u64.pow(2),
        "g" | "gb" => 1000u64.pow(3),
        "t" | "tb" => 1000u64.pow(4),
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "unknown unit '{unit}' in '{s}' (use B, kB, MB, GB, KiB, MiB, GiB)"
            ));
        }
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size like 40000, 500MB or 5GiB"))?;
    let bytes = v * mult as f64;
    if bytes < 1.0 || !bytes.is_finite() {
        return Err(format!("'{s}' must be at least one byte"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::Dtype;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("40000"), Ok(40000));
        assert_eq!(parse_size("500MB"), Ok(500_000_000));
        assert_eq!(parse_size("5GiB"), Ok(5 << 30));
        assert_eq!(parse_size("1.5 KiB"), Ok(1536));
        assert!(parse_size("5 parsecs").is_err());
        assert!(parse_size("0").is_err());
    }

    #[test]
    fn dtypes_sort_as_safetensors_declares_them() {
        assert!(Dtype::F32 > Dtype::Bf16);
        assert!(Dtype::Bf16 > Dtype::F16);
        assert!(Dtype::F64 > Dtype::F32);
    }
}
