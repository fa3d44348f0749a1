//! Object-store URLs as SOURCE and OUT take them: `s3://bucket/prefix`, `gs://bucket/prefix`,
//! `az://container/prefix` (also `abfs://`, `abfss://`), parsed once. The prefix is a "folder":
//! the objects under `prefix/` are its files.

use std::fmt;

/// The object stores wload reads and writes, each served by the `object_store` crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    S3,
    Gcs,
    Azure,
}

impl Scheme {
    /// The variables that configure it, for messages.
    pub(crate) fn variables(self) -> &'static str {
        match self {
            Scheme::S3 => {
                "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_SESSION_TOKEN, a web-identity \
                 token file, or the instance's role), AWS_REGION, and AWS_ENDPOINT_URL for an \
                 S3-compatible store"
            }
            Scheme::Gcs => "GOOGLE_SERVICE_ACCOUNT (a key file) or the instance's credentials",
            Scheme::Azure => {
                "AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY (or a SAS token)"
            }
        }
    }
}

/// A parsed object-store URL: the bucket (or container) and the prefix of the "folder", without
/// slashes at either end (empty for the bucket's root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoreUrl {
    pub(crate) scheme: Scheme,
    /// As written (`s3`, `gs`, `az`, `abfs`, `abfss`).
    pub(crate) written: String,
    pub(crate) bucket: String,
    pub(crate) prefix: String,
}

/// Whether `text` is meant as an object-store URL (a scheme wload knows, or any `x://`):
/// such a SOURCE or OUT is never a local path.
pub(crate) fn looks_like_url(text: &str) -> bool {
    text.split_once("://")
        .is_some_and(|(s, _)| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric()))
}

impl StoreUrl {
    /// Parses `text`; `Err` says what is wrong with it, `Ok(None)` when it is no URL at all.
    pub(crate) fn parse(text: &str) -> Result<Option<StoreUrl>, String> {
        if !looks_like_url(text) {
            return Ok(None);
        }
        let (written, rest) = text.split_once("://").unwrap_or_default();
        let scheme = match written.to_ascii_lowercase().as_str() {
            "s3" | "s3a" => Scheme::S3,
            "gs" | "gcs" => Scheme::Gcs,
            "az" | "abfs" | "abfss" | "azure" => Scheme::Azure,
            _ => {
                return Err(format!(
                    "{text}: wload reads and writes s3://, gs:// and az:// URLs (object storage) \
                     and local paths; a {written}:// URL is none of these"
                ));
            }
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        // abfs://container@account.dfs.core.windows.net/path: the container is before the '@'.
        let bucket = bucket.split('@').next().unwrap_or_default();
        if bucket.is_empty() {
            return Err(format!(
                "{text}: no bucket; write {written}://BUCKET/PREFIX"
            ));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|c| c == "." || c == "..") {
            return Err(format!(
                "{text}: '.' and '..' are not folders in object storage; write the prefix as it is"
            ));
        }
        Ok(Some(StoreUrl {
            scheme,
            written: written.to_string(),
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        }))
    }

    /// The object key of `name` (a file of the folder).
    pub(crate) fn key(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.prefix)
        }
    }

    /// The URL of `name` in the folder.
    pub(crate) fn child(&self, name: &str) -> String {
        format!("{}://{}/{}", self.written, self.bucket, self.key(name))
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.written, self.bucket)?;
        if !self.prefix.is_empty() {
            write!(f, "/{}", self.prefix)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_bucket_and_prefix() {
        let u = StoreUrl::parse("s3://models/llama/8b/").unwrap().unwrap();
        assert_eq!(
            (u.scheme, &*u.bucket, &*u.prefix),
            (Scheme::S3, "models", "llama/8b")
        );
        assert_eq!(u.to_string(), "s3://models/llama/8b");
        assert_eq!(u.child("config.json"), "s3://models/llama/8b/config.json");
        let root = StoreUrl::parse("gs://b").unwrap().unwrap();
        assert_eq!(
            (root.scheme, &*root.prefix, root.key("x")),
            (Scheme::Gcs, "", "x".into())
        );
        let az = StoreUrl::parse("abfss://c@acct.dfs.core.windows.net/m")
            .unwrap()
            .unwrap();
        assert_eq!(
            (az.scheme, &*az.bucket, &*az.prefix),
            (Scheme::Azure, "c", "m")
        );
        assert_eq!(StoreUrl::parse("org/name").unwrap(), None);
        assert_eq!(StoreUrl::parse("./s3:/x").unwrap(), None);
        for bad in ["s3://", "s3:///x", "ftp://host/x", "s3://b/a/../c"] {
            assert!(StoreUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
