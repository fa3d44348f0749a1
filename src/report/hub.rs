//! The line that says what a remote source's run fetched (from the hub, or a store's URL):
//! `hub: fetched 412.3 KiB (headers of 163 files, config.json, model.safetensors.index.json); 0 B of tensor data`.

use crate::resolve::remote::Fetched;
use crate::units::HumanBytes;

/// What the run fetched, in one line (without a newline).
pub fn hub_fetched_line(f: &Fetched) -> String {
    let mut what = Vec::new();
    if f.header_files > 0 {
        let s = if f.header_files == 1 { "" } else { "s" };
        what.push(format!("headers of {} file{s}", f.header_files));
    }
    const SHOWN: usize = 4;
    what.extend(f.files.iter().take(SHOWN).cloned());
    if f.files.len() > SHOWN {
        what.push(format!("{} more files", f.files.len() - SHOWN));
    }
    let what = if what.is_empty() {
        "everything from the cache".to_string()
    } else {
        what.join(", ")
    };
    let from = if f.from.is_empty() { "hub" } else { &f.from };
    format!(
        "{from}: fetched {} ({what}); {} of tensor data",
        HumanBytes(f.bytes),
        HumanBytes(f.tensor_data_bytes)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_headers_files_and_tensor_data() {
        let mut f = Fetched {
            from: String::new(),
            bytes: 422_195,
            header_bytes: 420_000,
            header_files: 163,
            files: vec!["config.json".into(), "model.safetensors.index.json".into()],
            file_bytes: 2195,
            tensor_data_bytes: 0,
        };
        assert_eq!(
            hub_fetched_line(&f),
            "hub: fetched 412.3 KiB (headers of 163 files, config.json, model.safetensors.index.json); 0 B of tensor data"
        );
        assert_eq!(
            hub_fetched_line(&Fetched::default()),
            "hub: fetched 0 B (everything from the cache); 0 B of tensor data"
        );
        f.from = "s3://models/llama".into();
        assert!(hub_fetched_line(&f).starts_with("s3://models/llama: fetched 412.3 KiB"));
    }
}
