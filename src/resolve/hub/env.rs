//! The environment Python's `huggingface_hub` reads (`HF_HOME`, `HF_HUB_CACHE`, `HF_ENDPOINT`,
//! `HF_TOKEN`, `HF_HUB_OFFLINE`, the two timeouts), read the same way.

use std::path::{Path, PathBuf};

/// The environment that Python's `huggingface_hub` reads, read the same way.
#[derive(Debug, Clone)]
pub(crate) struct HubEnv {
    /// `--download-dir`, else `HF_HUB_CACHE` (or the older `HUGGINGFACE_HUB_CACHE`), else
    /// `$HF_HOME/hub`, with `HF_HOME` defaulting to `$XDG_CACHE_HOME/huggingface` or
    /// `~/.cache/huggingface`.
    pub cache_dir: PathBuf,
    /// `HF_ENDPOINT`, default `https://huggingface.co`.
    pub endpoint: String,
    /// `HF_TOKEN` (or `HUGGING_FACE_HUB_TOKEN`), else the file `HF_TOKEN_PATH`
    /// (default `$HF_HOME/token`, where `hf auth login` writes it).
    pub token: Option<String>,
    /// `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`) is 1, ON, YES or TRUE: no connection at all.
    pub offline: bool,
    /// `HF_HUB_ETAG_TIMEOUT`, seconds: the longest silence while connecting to the hub or waiting
    /// for its answer to a metadata request (the file list, a file's etag).
    pub etag_timeout: u64,
    /// `HF_HUB_DOWNLOAD_TIMEOUT`, seconds: the longest silence while connecting for a transfer
    /// or waiting for its next bytes. It bounds a stall, not the transfer.
    pub download_timeout: u64,
}

/// huggingface_hub's default for both timeouts, in seconds.
const DEFAULT_TIMEOUT_SECS: u64 = 10;

/// A timeout variable whose value huggingface_hub would not take either.
#[derive(Debug, thiserror::Error)]
#[error(
    "{var}='{value}' is not a number of seconds: huggingface_hub reads it as a whole number (0 or unset means the default, {DEFAULT_TIMEOUT_SECS}); {why}"
)]
pub(crate) struct BadTimeout {
    pub var: &'static str,
    pub value: String,
    why: &'static str,
}

/// Reads a timeout as huggingface_hub does (`int(value) or 10`: surrounding blanks, a sign and
/// `_` between digits are allowed, 0 means the default). A negative value, which huggingface_hub
/// reads but its HTTP client then refuses, is refused here at once; so is one beyond ~136 years,
/// which no clock can add.
fn parse_timeout(var: &'static str, value: Option<&str>) -> Result<u64, BadTimeout> {
    let Some(value) = value else {
        return Ok(DEFAULT_TIMEOUT_SECS);
    };
    let bad = |why| BadTimeout {
        var,
        value: value.to_string(),
        why,
    };
    let t = value.trim();
    let (negative, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let well_formed = !digits.is_empty()
        && digits
            .split('_')
            .all(|g| !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()));
    if !well_formed {
        return Err(bad("write it as digits only, e.g. 30"));
    }
    let secs: u64 = match digits.replace('_', "").parse() {
        Ok(n) if n <= u64::from(u32::MAX) => n,
        _ => return Err(bad("it is too large")),
    };
    match secs {
        0 => Ok(DEFAULT_TIMEOUT_SECS),
        _ if negative => Err(bad("a timeout cannot be negative")),
        n => Ok(n),
    }
}

impl HubEnv {
    /// The environment, or the timeout variable that is malformed (a usage error).
    pub(crate) fn from_env(download_dir: Option<&Path>) -> Result<HubEnv, BadTimeout> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let home = || var("HOME").unwrap_or_else(|| "/".into());
        let expand = |p: String| match p.strip_prefix("~/") {
            Some(rest) => Path::new(&home()).join(rest),
            None if p == "~" => PathBuf::from(home()),
            None => PathBuf::from(p),
        };
        let hf_home = var("HF_HOME").map(expand).unwrap_or_else(|| {
            var("XDG_CACHE_HOME")
                .map(expand)
                .unwrap_or_else(|| Path::new(&home()).join(".cache"))
                .join("huggingface")
        });
        let cache_dir = match download_dir {
            Some(d) => d.to_path_buf(),
            None => var("HF_HUB_CACHE")
                .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
                .map(expand)
                .unwrap_or_else(|| hf_home.join("hub")),
        };
        let token = var("HF_TOKEN")
            .or_else(|| var("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| {
                let path = var("HF_TOKEN_PATH")
                    .map(expand)
                    .unwrap_or_else(|| hf_home.join("token"));
                crate::small_file::read_to_string(&path).ok()
            })
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        let truthy = |k: &str| {
            var(k).is_some_and(|v| {
                ["1", "ON", "YES", "TRUE"].contains(&v.trim().to_ascii_uppercase().as_str())
            })
        };
        let timeout = |k| parse_timeout(k, var(k).as_deref());
        Ok(HubEnv {
            cache_dir,
            endpoint: var("HF_ENDPOINT")
                .map(|e| e.trim_end_matches('/').to_string())
                .unwrap_or_else(|| "https://huggingface.co".into()),
            token,
            offline: truthy("HF_HUB_OFFLINE") || truthy("TRANSFORMERS_OFFLINE"),
            etag_timeout: timeout("HF_HUB_ETAG_TIMEOUT")?,
            download_timeout: timeout("HF_HUB_DOWNLOAD_TIMEOUT")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_read_as_huggingface_hub_reads_them() {
        let read = |v| parse_timeout("HF_HUB_ETAG_TIMEOUT", v);
        assert_eq!(read(None).unwrap(), 10);
        for (v, secs) in [
            ("1", 1),
            (" 30 ", 30),
            ("+7", 7),
            ("1_000", 1000),
            ("0", 10),
            ("-0", 10),
            ("007", 7),
        ] {
            assert_eq!(read(Some(v)).unwrap(), secs, "{v}");
        }
        for v in [
            "1.5",
            "ten",
            "",
            " ",
            "1e3",
            "-5",
            "1__0",
            "_1",
            "1_",
            "0x10",
            "99999999999999999999",
            "4294967296",
        ] {
            let e = read(Some(v)).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("HF_HUB_ETAG_TIMEOUT='{v}'")),
                "{v}: {e}"
            );
        }
    }
}
