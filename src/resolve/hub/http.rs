//! The three requests a hub source needs, each bounded by huggingface_hub's timeouts: the repo's
//! file list, a file's metadata (etag, commit, size) and a transfer into a partial file.
//!
//! They are made here, with wload's own ureq agent, rather than by hf-hub 0.5: its `ApiBuilder`
//! sets the endpoint, token, retries, progress and user agent only, and builds its agents inside
//! `build()` with no timeout at all, so a hub that accepts the connection and never answers hangs
//! `metadata` and every download forever. Only its repo-info request is handed out as a request
//! builder, which would leave the two that matter without a bound. hf-hub still names the repo's
//! URLs and parses its file list ([`hf_hub::Repo`], [`hf_hub::api::RepoInfo`]); the cache layout
//! its downloads wrote (`blobs/<etag>.part`, renamed when complete) is kept as it was.
//!
//! Timeouts bound silence, never a whole transfer, as in huggingface_hub (httpx's connect and
//! read timeouts): connecting, and each read from the socket, may take at most the timeout, so a
//! 10 GB shard takes as long as the link needs while a stalled one is noticed within seconds.

use std::fs::OpenOptions;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hf_hub::api::RepoInfo;
use ureq::config::RedirectAuthHeaders;
use ureq::typestate::WithoutBody;
use ureq::{Agent, RequestBuilder};

use super::HubEnv;

/// One of huggingface_hub's timeout variables and the value it has in this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// `HF_HUB_ETAG_TIMEOUT` or `HF_HUB_DOWNLOAD_TIMEOUT`.
    pub var: &'static str,
    pub secs: u64,
}

impl Limit {
    fn duration(self) -> Duration {
        Duration::from_secs(self.secs)
    }
}

/// Why a request failed.
#[derive(Debug)]
pub enum HttpError {
    /// The server answered with this status.
    Status(u16),
    /// Nothing came for `limit`: connecting, or waiting for the next bytes.
    Timeout(Limit),
    /// The connection failed or broke off.
    Transport(String),
    /// The answer lacks what the hub always sends, or contradicts the request: asking again
    /// would get the same.
    Invalid(String),
    /// The partial file could not be written.
    Local(PathBuf, io::Error),
}

impl HttpError {
    fn from_ureq(e: ureq::Error, limit: Limit) -> HttpError {
        match e {
            ureq::Error::StatusCode(s) => HttpError::Status(s),
            ureq::Error::Timeout(_) => HttpError::Timeout(limit),
            ureq::Error::Io(e) => HttpError::from_io(e, limit),
            other => HttpError::Transport(other.to_string()),
        }
    }

    /// A read from the body: ureq wraps its own errors (a per-read timeout among them) in
    /// `io::Error`.
    fn from_io(e: io::Error, limit: Limit) -> HttpError {
        if matches!(
            e.kind(),
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
        ) {
            return HttpError::Timeout(limit);
        }
        match e.get_ref().and_then(|i| i.downcast_ref::<ureq::Error>()) {
            Some(ureq::Error::Timeout(_)) => HttpError::Timeout(limit),
            Some(ureq::Error::StatusCode(s)) => HttpError::Status(*s),
            _ => HttpError::Transport(e.to_string()),
        }
    }

    /// Worth another try: the network, not the request, failed.
    pub fn is_transient(&self) -> bool {
        match self {
            HttpError::Status(s) => *s >= 500 || *s == 408 || *s == 429,
            HttpError::Timeout(_) | HttpError::Transport(_) => true,
            HttpError::Invalid(_) | HttpError::Local(..) => false,
        }
    }
}

/// What the hub says about one file of a commit.
#[derive(Debug, Clone)]
pub struct Meta {
    pub etag: String,
    pub commit: String,
    pub size: u64,
}

pub struct Client {
    agent: Agent,
    endpoint: String,
    token: Option<String>,
    /// Metadata requests: the file list and each file's etag.
    pub etag: Limit,
    /// Transfers.
    pub download: Limit,
}

/// The most redirects a request follows; the hub sends at most one (to its CDN).
const MAX_REDIRECTS: u32 = 10;

/// A JSON file list larger than this is not the hub's.
const MAX_LISTING_BYTES: u64 = 256 << 20;

impl Client {
    pub fn new(env: &HubEnv) -> Client {
        let agent: Agent = Agent::config_builder()
            // The token may follow the hub's own redirects (a renamed repo), never to the CDN.
            .redirect_auth_headers(RedirectAuthHeaders::SameHost)
            .max_redirects(MAX_REDIRECTS)
            .user_agent(format!("wload/{}", env!("CARGO_PKG_VERSION")))
            // Ranges count bytes of the file, and sizes are the file's: no compression.
            .accept_encoding("identity")
            .build()
            .into();
        Client {
            agent,
            endpoint: env.endpoint.clone(),
            token: env.token.clone(),
            etag: Limit {
                var: "HF_HUB_ETAG_TIMEOUT",
                secs: env.etag_timeout,
            },
            download: Limit {
                var: "HF_HUB_DOWNLOAD_TIMEOUT",
                secs: env.download_timeout,
            },
        }
    }

    fn request(
        &self,
        builder: RequestBuilder<WithoutBody>,
        limit: Limit,
        redirects: u32,
    ) -> RequestBuilder<WithoutBody> {
        let builder = match &self.token {
            Some(t) => builder.header("Authorization", format!("Bearer {t}")),
            None => builder,
        };
        builder
            .config()
            .timeout_resolve(Some(limit.duration()))
            .timeout_connect(Some(limit.duration()))
            .timeout_per_read(Some(limit.duration()))
            .timeout_per_write(Some(limit.duration()))
            .max_redirects(redirects)
            .build()
    }

    /// `{endpoint}/{repo}/resolve/{revision}/{file}`.
    pub fn file_url(&self, repo: &hf_hub::Repo, file: &str) -> String {
        format!(
            "{}/{}/resolve/{}/{file}",
            self.endpoint,
            repo.url(),
            repo.url_revision()
        )
    }

    /// `GET {endpoint}/api/models/{repo}/revision/{revision}`: the commit and its files.
    pub fn repo_info(&self, repo: &hf_hub::Repo) -> Result<RepoInfo, HttpError> {
        let url = format!("{}/api/{}", self.endpoint, repo.api_url());
        let limit = self.etag;
        let mut response = self
            .request(self.agent.get(&url), limit, MAX_REDIRECTS)
            .call()
            .map_err(|e| HttpError::from_ureq(e, limit))?;
        response
            .body_mut()
            .with_config()
            .limit(MAX_LISTING_BYTES)
            .read_json()
            .map_err(|e| HttpError::from_ureq(e, limit))
    }

    /// A `HEAD` of the file, as huggingface_hub asks: the hub's own (relative) redirects are
    /// followed, the CDN's are not, since the hub's answer already names the blob
    /// (`X-Linked-Etag`, `X-Linked-Size`) and its commit.
    pub fn metadata(&self, url: &str) -> Result<Meta, HttpError> {
        let limit = self.etag;
        let mut url = url.to_string();
        let mut hops = 0;
        let response = loop {
            let response = self
                .request(self.agent.head(&url), limit, 0)
                .call()
                .map_err(|e| HttpError::from_ureq(e, limit))?;
            let relative = response
                .headers()
                .get("Location")
                .and_then(|l| l.to_str().ok())
                .filter(|l| l.starts_with('/') && !l.starts_with("//"));
            match relative {
                Some(path) if response.status().is_redirection() && hops < MAX_REDIRECTS => {
                    hops += 1;
                    url = format!("{}{path}", origin(&url));
                }
                _ => break response,
            }
        };
        let header = |names: &[&str]| {
            names.iter().find_map(|n| {
                response
                    .headers()
                    .get(*n)
                    .and_then(|v| v.to_str().ok())
                    .map(|v| v.trim().to_string())
            })
        };
        let missing = |what: &str| {
            HttpError::Invalid(format!(
                "the answer (HTTP {}) has no {what} header",
                response.status().as_u16()
            ))
        };
        let etag = header(&["X-Linked-Etag", "ETag"]).ok_or_else(|| missing("ETag"))?;
        // A weak etag (`W/"…"`) names the same blob as the strong one.
        let etag = etag.trim_start_matches("W/").replace('"', "");
        let commit = header(&["X-Repo-Commit"]).ok_or_else(|| missing("X-Repo-Commit"))?;
        let size = header(&["X-Linked-Size", "Content-Length"])
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| missing("X-Linked-Size or Content-Length"))?;
        // Names become paths under blobs/: an etag that could lead out of it is not one.
        if etag.is_empty() || etag.contains(['/', '\\']) || etag.starts_with('.') {
            return Err(HttpError::Invalid(format!(
                "the answer names no usable etag ('{etag}')"
            )));
        }
        Ok(Meta { etag, commit, size })
    }

    /// One try at completing `part` (the file's first bytes, or none) from `url`: asks for the
    /// rest with a `Range` request and appends what arrives, reporting the partial file's length
    /// as it grows. Done when `part` holds `size` bytes.
    pub fn fetch(
        &self,
        url: &str,
        part: &Path,
        size: u64,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(), HttpError> {
        let local = |e| HttpError::Local(part.to_path_buf(), e);
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(part)
            .map_err(local)?;
        let mut have = file.metadata().map_err(local)?.len();
        progress(have);
        if have == size {
            return Ok(());
        }
        if have > size {
            // Not this file's beginning: the hub would answer 416, which means the same.
            return Err(HttpError::Status(416));
        }
        let limit = self.download;
        let response = self
            .request(self.agent.get(url), limit, MAX_REDIRECTS)
            .header("Range", format!("bytes={have}-"))
            .call()
            .map_err(|e| HttpError::from_ureq(e, limit))?;
        let start = match response.status().as_u16() {
            206 => range_start(&response),
            // The Range was ignored: the whole file follows.
            _ => Some(0),
        };
        match start {
            Some(0) if have > 0 => {
                file.set_len(0).map_err(local)?;
                have = 0;
                progress(0);
            }
            Some(start) if start != have => {
                return Err(HttpError::Invalid(format!(
                    "asked for the bytes from {have}, the answer starts at {start}"
                )));
            }
            _ => {}
        }
        let mut body = response.into_body().into_reader();
        let mut buf = vec![0; 1 << 16];
        loop {
            let n = match body.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(HttpError::from_io(e, limit)),
            };
            file.write_all(&buf[..n]).map_err(local)?;
            have += n as u64;
            progress(have);
        }
        match have.cmp(&size) {
            std::cmp::Ordering::Equal => Ok(()),
            std::cmp::Ordering::Less => Err(HttpError::Transport(format!(
                "the transfer ended after {have} of {size} bytes"
            ))),
            std::cmp::Ordering::Greater => Err(HttpError::Status(416)),
        }
    }
}

/// Where a 206's `Content-Range: bytes START-END/SIZE` starts, when it says.
fn range_start<B>(response: &ureq::http::Response<B>) -> Option<u64> {
    let value = response.headers().get("Content-Range")?.to_str().ok()?;
    let (start, _) = value.trim().strip_prefix("bytes ")?.split_once('-')?;
    start.trim().parse().ok()
}

/// `scheme://host[:port]` of an absolute URL.
fn origin(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => &url[..after_scheme + i],
        None => url,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_keeps_scheme_host_and_port() {
        assert_eq!(
            origin("http://127.0.0.1:8080/a/resolve/b"),
            "http://127.0.0.1:8080"
        );
        assert_eq!(origin("https://huggingface.co"), "https://huggingface.co");
    }

    #[test]
    fn a_read_timeout_inside_an_io_error_is_a_timeout() {
        let limit = Limit {
            var: "HF_HUB_DOWNLOAD_TIMEOUT",
            secs: 3,
        };
        let wrapped = io::Error::other(ureq::Error::Timeout(ureq::Timeout::PerRead));
        assert!(matches!(
            HttpError::from_io(wrapped, limit),
            HttpError::Timeout(l) if l == limit
        ));
        let reset = io::Error::from(io::ErrorKind::ConnectionReset);
        assert!(matches!(
            HttpError::from_io(reset, limit),
            HttpError::Transport(_)
        ));
    }
}
