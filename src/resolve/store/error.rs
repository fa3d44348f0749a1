//! What can go wrong with object storage, worded with the URL, the operation and what to do.
//! Messages never carry credentials: the crate's texts are cut of every URL's query (where SAS
//! tokens and presigned signatures live) before they are shown.

use std::path::PathBuf;

use super::url::Scheme;
use crate::exit::ExitStatus;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A URL that names no bucket, or a scheme wload does not serve.
    #[error("{0}")]
    Url(String),
    #[error(
        "{url}: cannot set up the {scheme:?} client: {message}; it is configured by {vars}",
        vars = scheme.variables()
    )]
    Config {
        url: String,
        scheme: Scheme,
        message: String,
    },
    #[error("{url}: no such bucket{endpoint}; check the name and AWS_ENDPOINT_URL / AWS_REGION", endpoint = endpoint.as_ref().map_or_else(String::new, |e| format!(" at {e}")))]
    NoSuchBucket {
        url: String,
        endpoint: Option<String>,
    },
    #[error("{url}: nothing there (no object under this prefix){hint}")]
    Empty { url: String, hint: String },
    #[error(
        "{url}: a pre-sharded folder (vLLM sharded_state rank files: {files}), not a checkpoint; plan and shard read checkpoints. Serve it with `vllm serve {url} --load-format runai_streamer_sharded`, load it with `wload load {url}`; `wload inspect {url}` says which ranks it holds"
    )]
    PreSharded { url: String, files: String },
    #[error("{url}: not found while {op}")]
    NotFound { url: String, op: &'static str },
    #[error(
        "{url}: access denied while {op} ({message}); the credentials in use come from {vars}",
        vars = scheme.variables()
    )]
    Denied {
        url: String,
        op: &'static str,
        scheme: Scheme,
        message: String,
    },
    #[error(
        "{url}: the bucket is in another region than the one asked ({message}); set AWS_REGION to the bucket's region"
    )]
    WrongRegion { url: String, message: String },
    #[error(
        "{url}: {op} failed after {tries} tries over {secs:.0} s ({message}); WLOAD_OBJECT_RETRIES sets the retries (default 10), and the store may be throttling or down"
    )]
    Failed {
        url: String,
        op: &'static str,
        tries: usize,
        secs: f64,
        message: String,
    },
    #[error(
        "{url}: the object changed while it was read (etag {planned} when planned, {now} now); nothing was published: run again once nothing writes to the checkpoint"
    )]
    Changed {
        url: String,
        planned: String,
        now: String,
    },
    #[error("{url}: the store sent {got} bytes for a range of {want}; nothing was published")]
    Short { url: String, want: u64, got: u64 },
    #[error("{path}: {op}: {source}")]
    Local {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{url}: interrupted while {op}; nothing was published{aborted}", aborted = if *.aborted { " and the uploads begun were aborted" } else { "" })]
    Stopped {
        url: String,
        op: &'static str,
        aborted: bool,
    },
}

impl StoreError {
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            StoreError::Url(_) => ExitStatus::Usage,
            StoreError::Stopped { .. } => ExitStatus::Interrupted,
            _ => ExitStatus::Runtime,
        }
    }

    /// The crate's error for `op` on `url`, as one of ours: the status classes the store
    /// answered become their own variants with what to do.
    pub(crate) fn from_store(
        url: &str,
        op: &'static str,
        scheme: Scheme,
        retry: (usize, f64),
        e: object_store::Error,
    ) -> StoreError {
        use object_store::Error as E;
        let url = url.to_string();
        let message = without_queries(&e.to_string());
        match e {
            E::NotFound { .. } => StoreError::NotFound { url, op },
            E::PermissionDenied { .. } | E::Unauthenticated { .. } => StoreError::Denied {
                url,
                op,
                scheme,
                message,
            },
            _ if message.contains("NoSuchBucket") => StoreError::NoSuchBucket {
                url,
                endpoint: None,
            },
            _ if [
                "PermanentRedirect",
                "AuthorizationHeaderMalformed",
                "IllegalLocationConstraint",
            ]
            .iter()
            .any(|m| message.contains(m)) =>
            {
                StoreError::WrongRegion { url, message }
            }
            _ if message.contains("AccessDenied")
                || message.contains("InvalidAccessKeyId")
                || message.contains("SignatureDoesNotMatch") =>
            {
                StoreError::Denied {
                    url,
                    op,
                    scheme,
                    message,
                }
            }
            _ => StoreError::Failed {
                url,
                op,
                tries: retry.0 + 1,
                secs: retry.1,
                message,
            },
        }
    }
}

/// `text` with every URL's query string cut (`?X-Amz-Signature=…`, `?sig=…`): what the crate
/// prints may name the request it made, and a query can hold a credential.
pub(crate) fn without_queries(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_url_query = false;
    let mut word_is_url = false;
    for (i, c) in text.char_indices() {
        if c.is_whitespace() || c == '"' || c == '\'' || c == ')' || c == ',' {
            if in_url_query {
                out.push_str("?…");
            }
            in_url_query = false;
            word_is_url = false;
        } else if !word_is_url && text[i..].starts_with("http") {
            word_is_url = text[i..]
                .split_whitespace()
                .next()
                .is_some_and(|w| w.contains("://"));
        }
        if word_is_url && c == '?' {
            in_url_query = true;
        }
        if !in_url_query {
            out.push(c);
        }
    }
    if in_url_query {
        out.push_str("?…");
    }
    out
}

impl crate::resolve::RemoteError for StoreError {
    fn exit_status(&self) -> ExitStatus {
        StoreError::exit_status(self)
    }
}

impl From<StoreError> for crate::resolve::ResolveError {
    fn from(e: StoreError) -> Self {
        crate::resolve::ResolveError::Remote(crate::resolve::RemoteFailure::new(e))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn queries_are_cut_from_urls_and_nothing_else() {
        let t = "Error performing GET https://acct.blob.core.windows.net/c/x?sig=SECRET&se=1 in 2s, (retry) see 'why?'";
        let cut = super::without_queries(t);
        assert!(!cut.contains("SECRET"), "{cut}");
        assert!(
            cut.contains("https://acct.blob.core.windows.net/c/x?…"),
            "{cut}"
        );
        assert!(cut.ends_with("see 'why?'"), "{cut}");
    }
}
