//! vLLM's sharded_state files: which tensors go into which part file, and each file's header,
//! byte for byte as `safetensors.torch.save_file` writes it (vLLM 0.33 `model_executor/model_loader/sharded_state_loader.py`, `save_model`).

use crate::plan::RankPlan;
use crate::sharded::names::{RankFile, file_name};

/// One output file: its name, header bytes, and where each tensor's data lands.
#[derive(Debug, Clone)]
pub(crate) struct PartFile {
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
pub(crate) fn split(rank: &RankPlan, max_size: Option<u64>) -> Vec<Vec<usize>> {
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
/// (tensors sorted by dtype, wider first, then by name; no metadata). With `pipeline` (PP > 1)
/// the files are named `model-pp-{p}-tp-{t}-part-{k}`, as vLLM names them then.
pub(crate) fn layout(rank: &RankPlan, max_size: Option<u64>, pipeline: bool) -> Vec<PartFile> {
    split(rank, max_size)
        .into_iter()
        .enumerate()
        .map(|(p, mut order)| {
            // The order of `safetensors::serialize` (`prepare`): dtype descending in the crate's
            // declaration order, which `Dtype` keeps, then name.
            order.sort_by(|&a, &b| {
                let (ta, tb) = (&rank.tensors[a], &rank.tensors[b]);
                tb.dtype.cmp(&ta.dtype).then_with(|| ta.name.cmp(&tb.name))
            });
            let (header, rel, data_len) = header(rank, &order);
            let base = header.len() as u64;
            PartFile {
                rank: rank.rank,
                part: p as u64,
                name: if pipeline {
                    RankFile {
                        pp: Some(rank.pp_rank),
                        tp: rank.tp_rank,
                        part: p as u64,
                    }
                    .name()
                } else {
                    file_name(rank.rank, p as u64)
                },
                size: base + data_len,
                tensors: rel.into_iter().map(|(i, o)| (i, base + o)).collect(),
                header,
            }
        })
        .collect()
}

/// The header of one part: the 8-byte length and the JSON, padded with spaces to a multiple of 8,
/// with the tensors packed in `order`. Returns it with each tensor's data offset relative to the
/// end of the header, and the data length.
///
/// The entries are the crate's own `safetensors::tensor::TensorInfo`, serialised in a JSON map
/// the way the crate's `Metadata` serialises itself, so the bytes are those of
/// `safetensors.torch.save_file` (which vLLM calls, and which runs this crate). It is not
/// `Metadata::new(..)` + `serde_json`, which would give the same bytes, because `Metadata::new`
/// also validates sizes and so can fail, and a layout cannot; nor `safetensors::serialize`,
/// which wants every tensor's data in memory. The unit test `headers_match_the_crate_serialiser`
/// compares the bytes with `serialize` on random tensor sets.
fn header(rank: &RankPlan, order: &[usize]) -> (Vec<u8>, Vec<(usize, u64)>, u64) {
    struct Entries<'a>(Vec<(&'a str, safetensors::tensor::TensorInfo)>);
    impl serde::Serialize for Entries<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_map(self.0.iter().map(|(name, info)| (name, info)))
        }
    }
    let mut offset = 0u64;
    let mut rel = Vec::with_capacity(order.len());
    let mut entries = Vec::with_capacity(order.len());
    for &i in order {
        let t = &rank.tensors[i];
        entries.push((
            t.name.as_str(),
            safetensors::tensor::TensorInfo {
                dtype: t.dtype.to_safetensors(),
                shape: t.shape.iter().map(|&d| d as usize).collect(),
                data_offsets: (offset as usize, (offset + t.bytes) as usize),
            },
        ));
        rel.push((i, offset));
        offset += t.bytes;
    }
    let mut json = serde_json::to_vec(&Entries(entries)).expect("names and numbers serialise");
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut header = (json.len() as u64).to_le_bytes().to_vec();
    header.extend_from_slice(&json);
    (header, rel, offset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::Dtype;
    use crate::plan::OutTensor;

    /// A tensor as `safetensors::serialize` takes it: zeros of the right length.
    struct Zeros {
        dtype: safetensors::Dtype,
        shape: Vec<usize>,
        data: Vec<u8>,
    }

    impl safetensors::View for &Zeros {
        fn dtype(&self) -> safetensors::Dtype {
            self.dtype
        }
        fn shape(&self) -> &[usize] {
            &self.shape
        }
        fn data(&self) -> std::borrow::Cow<'_, [u8]> {
            (&self.data).into()
        }
        fn data_len(&self) -> usize {
            self.data.len()
        }
    }

    /// Names that JSON must escape, sort oddly or are not ASCII.
    const NAME_PARTS: [&str; 9] = [
        "model.layers.0.mlp",
        "a",
        "A",
        "quote\"d",
        "back\\slash",
        "tab\t",
        "\u{1}ctl",
        "é",
        "名",
    ];

    fn random_rank(rng: &mut fastrand::Rng) -> RankPlan {
        let mut tensors: Vec<OutTensor> = Vec::new();
        for k in 0..rng.usize(0..40) {
            let dtype = Dtype::ALL[rng.usize(..Dtype::ALL.len())];
            let mut shape: Vec<u64> = (0..rng.usize(0..4)).map(|_| rng.u64(0..7)).collect();
            // Packed types need a whole number of bytes: an even element count.
            if !dtype.bits().is_multiple_of(8) {
                shape.push(8);
            }
            let numel = shape.iter().product();
            let name = format!("{}.{k}", NAME_PARTS[rng.usize(..NAME_PARTS.len())]);
            tensors.push(OutTensor {
                name,
                dtype,
                bytes: dtype.byte_size(numel).unwrap(),
                shape,
                pieces: Default::default(),
            });
        }
        RankPlan {
            rank: 0,
            pp_rank: 0,
            tp_rank: 0,
            bytes: tensors.iter().map(|t| t.bytes).sum(),
            tensors,
        }
    }

    /// The part-file header is the one `safetensors::serialize` (the code behind vLLM's
    /// `save_file`) writes for the same tensors: order, escapes, padding, byte for byte.
    #[test]
    fn headers_match_the_crate_serialiser() {
        let mut rng = fastrand::Rng::with_seed(0x5AFE);
        for case in 0..300 {
            let rank = random_rank(&mut rng);
            let parts = layout(&rank, None, false);
            let [part] = parts.as_slice() else {
                assert!(
                    rank.tensors.is_empty(),
                    "case {case}: {} parts",
                    parts.len()
                );
                continue;
            };
            let zeros: Vec<(String, Zeros)> = rank
                .tensors
                .iter()
                .map(|t| {
                    let z = Zeros {
                        dtype: t.dtype.to_safetensors(),
                        shape: t.shape.iter().map(|&d| d as usize).collect(),
                        data: vec![0; t.bytes as usize],
                    };
                    (t.name.clone(), z)
                })
                .collect();
            let file = safetensors::serialize(zeros.iter().map(|(n, z)| (n, z)), None).unwrap();
            let h = part.header.len();
            assert_eq!(
                String::from_utf8_lossy(&part.header[8..]),
                String::from_utf8_lossy(&file[8..h]),
                "case {case}"
            );
            assert_eq!(part.header, file[..h], "case {case}");
            assert_eq!(part.size, file.len() as u64, "case {case}");
            // Each tensor's data lands where the crate's header says.
            let (_, meta) = safetensors::SafeTensors::read_metadata(&file).unwrap();
            for &(i, at) in &part.tensors {
                let info = meta.info(&rank.tensors[i].name).unwrap();
                assert_eq!(at, (h + info.data_offsets.0) as u64, "case {case}");
            }
        }
    }

    #[test]
    fn dtypes_sort_as_safetensors_declares_them() {
        assert!(Dtype::F32 > Dtype::Bf16);
        assert!(Dtype::Bf16 > Dtype::F16);
        assert!(Dtype::F64 > Dtype::F32);
    }
}
