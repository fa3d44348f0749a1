//! The three requests a hub source needs, each bounded by huggingface_hub's timeouts: the repo's
//! file list, a file's metadata (etag, commit, size) and a transfer into a partial file.
//!
//! They are made here, with wload's own ureq agent, rather than by hf-hub 0.5: its `ApiBuilder`
//! builds its agents with no timeout at all (a hub that accepts the connection and never answers
//! hangs every download forever), its URLs leave file names unencoded (`notes#1.md` is fetched as
//! `notes`) and its file list is read whole into memory.
//!
//! Timeouts bound silence, never a whole transfer, as in huggingface_hub (httpx's connect and
//! read timeouts): connecting, and each read from the socket, may take at most the timeout, so a
//! 10 GB shard takes as long as the link needs while a stalled one is noticed within seconds.
//!
//! Nothing a server says is taken on trust: redirects are followed here, one hop at a time, so
//! that the token goes only to the endpoint's own origin and only http(s) URLs are followed; a
//! transfer never writes a byte past the size the file's metadata announced, and an answer that
//! disagrees with what was asked (its Content-Range, Content-Length or encoding) is refused
//! before anything is written; the file list is read with a cap on its bytes and entries.

use super::url::{is_relative, quote, resolve_location, same_origin, shown};
use std::fs::OpenOptions;
use std::io::{self, Read, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use ureq::typestate::WithoutBody;
use ureq::{Agent, Body, RequestBuilder};

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
pub(super) enum HttpError {
    /// The server answered with this status.
    Status(u16),
    /// Nothing came for `limit`: connecting, or waiting for the next bytes.
    Timeout(Limit),
    /// The connection failed or broke off.
    Transport(String),
    /// The answer lacks what the hub always sends, or contradicts the request: asking again
    /// would get the same.
    Invalid(String),
    /// The server redirected to a URL that is not followed.
    Redirect { location: String, why: String },
    /// The partial file could not be written.
    Local(PathBuf, io::Error),
    /// The caller asked the transfer to stop.
    Stopped,
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
    pub(super) fn from_io(e: io::Error, limit: Limit) -> HttpError {
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
    pub(super) fn is_transient(&self) -> bool {
        match self {
            HttpError::Status(s) => *s >= 500 || *s == 408 || *s == 429,
            HttpError::Timeout(_) | HttpError::Transport(_) => true,
            HttpError::Invalid(_)
            | HttpError::Redirect { .. }
            | HttpError::Local(..)
            | HttpError::Stopped => false,
        }
    }
}

/// What the hub says about one file of a commit.
#[derive(Debug, Clone)]
pub(super) struct Meta {
    pub etag: String,
    pub commit: String,
    pub size: u64,
    /// The header `size` was read from, for messages.
    pub size_from: &'static str,
}

/// The repo's commit and the files it lists (only their names are kept).
#[derive(Debug, Deserialize)]
pub(super) struct RepoInfo {
    pub sha: String,
    #[serde(deserialize_with = "super::capped::capped_names")]
    pub siblings: Vec<String>,
}

/// The most bytes of a file list read from the hub (or from the cache's saved copy): the
/// largest real repos list a few thousand files in well under a megabyte.
pub(super) const MAX_LISTING_BYTES: u64 = 64 << 20;
/// The most files a file list may name.
pub(super) const MAX_LISTING_FILES: usize = 100_000;

/// The most redirects a request follows; the hub sends at most two (a renamed repo, its CDN).
const MAX_REDIRECTS: u32 = 10;

/// At most this much of what a server sends past a file's announced size is read, to say how
/// much it was; none of it is written.
const OVERRUN_PROBE: u64 = 1 << 20;

pub(super) struct Client {
    agent: Agent,
    endpoint: String,
    token: Option<String>,
    /// Metadata requests: the file list and each file's etag.
    pub etag: Limit,
    /// Transfers.
    pub download: Limit,
}

/// Which redirects a request follows.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Follow {
    /// Every http(s) redirect.
    All,
    /// Only the hub's own, relative ones (huggingface_hub's `follow_relative_redirects`): a HEAD
    /// stops at the CDN's, whose answer already names the blob.
    Relative,
}

impl Client {
    pub(super) fn new(env: &HubEnv) -> Client {
        let agent: Agent = Agent::config_builder()
            // Followed in `send`, which decides where the token may go.
            .max_redirects(0)
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

    fn request(&self, url: &str, head: bool, limit: Limit) -> RequestBuilder<WithoutBody> {
        let builder = if head {
            self.agent.head(url)
        } else {
            self.agent.get(url)
        };
        // huggingface_hub (httpx) drops the token when the origin changes; so does this, and a
        // move from https to http, or to another port of the same host, is a change of origin.
        let builder = match &self.token {
            Some(t) if same_origin(url, &self.endpoint) => {
                builder.header("Authorization", format!("Bearer {t}"))
            }
            _ => builder,
        };
        builder
            .config()
            .timeout_resolve(Some(limit.duration()))
            .timeout_connect(Some(limit.duration()))
            .timeout_per_read(Some(limit.duration()))
            .timeout_per_write(Some(limit.duration()))
            .build()
    }

    /// Sends the request, following redirects as `follow` allows, one hop at a time.
    pub(super) fn send(
        &self,
        url: &str,
        head: bool,
        range: Option<&str>,
        limit: Limit,
        follow: Follow,
    ) -> Result<ureq::http::Response<Body>, HttpError> {
        let mut url = url.to_string();
        for _ in 0..=MAX_REDIRECTS {
            let mut req = self.request(&url, head, limit);
            if let Some(r) = range {
                req = req.header("Range", r);
            }
            let response = req.call().map_err(|e| HttpError::from_ureq(e, limit))?;
            let status = response.status().as_u16();
            if !matches!(status, 301 | 302 | 303 | 307 | 308) {
                return Ok(response);
            }
            let Some(location) = response.headers().get("Location") else {
                return Err(HttpError::Invalid(format!(
                    "the answer (HTTP {status}) is a redirect without a Location header"
                )));
            };
            let location = String::from_utf8_lossy(location.as_bytes()).into_owned();
            if follow == Follow::Relative && !is_relative(&location) {
                // Not followed, but a redirect to `file:` is no CDN's either.
                return match resolve_location(&url, &location) {
                    Ok(_) => Ok(response),
                    Err(why) => Err(HttpError::Redirect { location, why }),
                };
            }
            url = resolve_location(&url, &location).map_err(|why| HttpError::Redirect {
                location: location.clone(),
                why,
            })?;
        }
        Err(HttpError::Redirect {
            location: url,
            why: format!("more than {MAX_REDIRECTS} redirects in a row"),
        })
    }

    /// `{endpoint}/{repo}/resolve/{revision}/{file}`, each part percent-encoded as
    /// huggingface_hub's `hf_hub_url` encodes it.
    pub(super) fn file_url(&self, repo: &str, revision: &str, file: &str) -> String {
        format!(
            "{}/{}/resolve/{}/{}",
            self.endpoint,
            quote(repo, true),
            quote(revision, false),
            quote(file, true)
        )
    }

    /// `GET {endpoint}/api/models/{repo}/revision/{revision}`: the commit and its files, read
    /// with a cap on bytes and entries, keeping only the file names.
    pub(super) fn repo_info(&self, repo: &str, revision: &str) -> Result<RepoInfo, HttpError> {
        let url = format!(
            "{}/api/models/{}/revision/{}",
            self.endpoint,
            quote(repo, true),
            quote(revision, false)
        );
        let limit = self.etag;
        let response = self.send(&url, false, None, limit, Follow::All)?;
        refuse_encoded(&response)?;
        let mut body = Counted::new(response.into_body().into_reader(), MAX_LISTING_BYTES);
        let parsed: Result<RepoInfo, _> = serde_json::from_reader(&mut body);
        if body.over() {
            return Err(HttpError::Invalid(format!(
                "the file list is larger than {} MiB, wload's limit (the largest real repos list a few thousand files in under a megabyte)",
                MAX_LISTING_BYTES >> 20
            )));
        }
        parsed.map_err(|e| match e.io_error_kind() {
            Some(_) => HttpError::from_io(e.into(), limit),
            None => HttpError::Invalid(format!("the file list cannot be read: {e}")),
        })
    }

    /// A `HEAD` of the file, as huggingface_hub asks: the hub's own (relative) redirects are
    /// followed, the CDN's are not, since the hub's answer already names the blob
    /// (`X-Linked-Etag`, `X-Linked-Size`) and its commit.
    pub(super) fn metadata(&self, url: &str) -> Result<Meta, HttpError> {
        let response = self.send(url, true, None, self.etag, Follow::Relative)?;
        let header = |names: &[&'static str]| {
            names.iter().find_map(|n| {
                let v = response.headers().get(*n)?.to_str().ok()?;
                Some((*n, v.trim().to_string()))
            })
        };
        let missing = |what: &str| {
            HttpError::Invalid(format!(
                "the answer (HTTP {}) has no {what} header",
                response.status().as_u16()
            ))
        };
        let (_, etag) = header(&["X-Linked-Etag", "ETag"]).ok_or_else(|| missing("ETag"))?;
        // A weak etag (`W/"…"`) names the same blob as the strong one.
        let etag = etag.trim_start_matches("W/").replace('"', "");
        let (_, commit) = header(&["X-Repo-Commit"]).ok_or_else(|| missing("X-Repo-Commit"))?;
        let (size_from, size) = header(&["X-Linked-Size", "Content-Length"])
            .ok_or_else(|| missing("X-Linked-Size or Content-Length"))?;
        let size = size.parse().map_err(|_| {
            HttpError::Invalid(format!(
                "the answer's {size_from} ('{}') is not a size in bytes",
                shown(&size)
            ))
        })?;
        if !usable_etag(&etag) {
            return Err(HttpError::Invalid(format!(
                "the answer names no usable etag ('{}')",
                shown(&etag)
            )));
        }
        Ok(Meta {
            etag,
            commit,
            size,
            size_from,
        })
    }

    /// One try at completing `part` (the file's first bytes, or none) from `url`: asks for the
    /// rest with a `Range` request and appends what arrives, reporting the partial file's length
    /// as it grows; `progress` breaks to stop the transfer there. Done when `part` holds
    /// `meta.size` bytes; never holds more.
    pub(super) fn fetch(
        &self,
        url: &str,
        part: &Path,
        meta: &Meta,
        progress: &mut dyn FnMut(u64) -> ControlFlow<()>,
    ) -> Result<(), HttpError> {
        let size = meta.size;
        let local = |e| HttpError::Local(part.to_path_buf(), e);
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(part)
            .map_err(local)?;
        let mut have = file.metadata().map_err(local)?.len();
        if have > size {
            // Longer than the file: not its beginning (another file's, or garbage).
            file.set_len(0).map_err(local)?;
            have = 0;
        }
        let go_on = progress(have);
        if have == size {
            return Ok(());
        }
        if go_on.is_break() {
            return Err(HttpError::Stopped);
        }
        let limit = self.download;
        let range = format!("bytes={have}-");
        let response = self.send(url, false, Some(&range), limit, Follow::All)?;
        refuse_encoded(&response)?;
        let from = match response.status().as_u16() {
            206 => check_range(&response, have, meta)?,
            // The Range was ignored: the whole file follows.
            200 => 0,
            s => {
                return Err(HttpError::Invalid(format!(
                    "the answer to a download is HTTP {s}, neither 200 nor 206"
                )));
            }
        };
        if from == 0 && have > 0 {
            file.set_len(0).map_err(local)?;
            have = 0;
            if progress(0).is_break() {
                return Err(HttpError::Stopped);
            }
        }
        let want = size - have;
        let announced = response.body().content_length();
        if let Some(n) = announced.filter(|n| *n != want) {
            return Err(HttpError::Invalid(format!(
                "the answer announces {n} bytes (Content-Length) where {want} of the file's {size} ({}) remain; nothing of it was written",
                meta.size_from
            )));
        }
        let mut body = response.into_body().into_reader();
        copy_exactly(&mut body, &mut file, want, &mut |n| {
            have += n;
            progress(have)
        })
        .map_err(|e| match e {
            Copy::Read(e) => HttpError::from_io(e, limit),
            Copy::Write(e) => local(e),
            Copy::Stopped => HttpError::Stopped,
        })?;
        if have < size {
            return Err(HttpError::Transport(format!(
                "the transfer ended after {have} of {size} bytes"
            )));
        }
        // With a Content-Length, ureq reads no further; without one, whatever follows the
        // announced size is counted (not written) to say what the server did.
        if announced.is_none() {
            let past = overrun(&mut body).map_err(|e| HttpError::from_io(e, limit))?;
            if past > 0 {
                drop(file);
                // It holds `size` bytes and would be taken as complete by the next run.
                let removed = std::fs::remove_file(part).is_ok();
                return Err(HttpError::Invalid(format!(
                    "the server sent {} past the {size} bytes its {} announced; wload stopped at {size}{}",
                    if past > OVERRUN_PROBE {
                        format!("more than {OVERRUN_PROBE} bytes")
                    } else {
                        format!("{past} byte{}", if past == 1 { "" } else { "s" })
                    },
                    meta.size_from,
                    if removed {
                        format!(" and removed {}", part.display())
                    } else {
                        String::new()
                    }
                )));
            }
        }
        Ok(())
    }
}

/// Names become paths under blobs/: an etag that could lead out of it, or that no file system
/// takes as a name, is not one.
pub(super) fn usable_etag(etag: &str) -> bool {
    !etag.is_empty()
        && etag.len() <= 128
        && !etag.starts_with('.')
        && etag
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b'\\')
}

/// Why a bounded copy stopped.
enum Copy {
    Read(io::Error),
    Write(io::Error),
    /// `wrote` said to stop.
    Stopped,
}

/// Copies at most `n` bytes from `from` to `to`, reporting each write's length; stops when the
/// report breaks.
fn copy_exactly(
    from: &mut dyn Read,
    to: &mut dyn Write,
    n: u64,
    wrote: &mut dyn FnMut(u64) -> ControlFlow<()>,
) -> Result<(), Copy> {
    let mut buf = vec![0; 1 << 16];
    let mut left = n;
    while left > 0 {
        let cap = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let got = match from.read(&mut buf[..cap]) {
            Ok(0) => return Ok(()),
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Copy::Read(e)),
        };
        to.write_all(&buf[..got]).map_err(Copy::Write)?;
        left -= got as u64;
        if wrote(got as u64).is_break() {
            return Err(Copy::Stopped);
        }
    }
    Ok(())
}

/// How many more bytes `body` holds, counting to just past [`OVERRUN_PROBE`].
fn overrun(body: &mut dyn Read) -> io::Result<u64> {
    io::copy(&mut body.take(OVERRUN_PROBE + 1), &mut io::sink())
}

/// A compressed answer's bytes are not the file's, nor its sizes the file's sizes.
pub(super) fn refuse_encoded(response: &ureq::http::Response<Body>) -> Result<(), HttpError> {
    match response.headers().get("Content-Encoding") {
        Some(e) if !e.as_bytes().eq_ignore_ascii_case(b"identity") => {
            Err(HttpError::Invalid(format!(
                "the answer is encoded ('Content-Encoding: {}') though only identity was accepted",
                shown(&String::from_utf8_lossy(e.as_bytes()))
            )))
        }
        _ => Ok(()),
    }
}

/// Where a 206 starts: it must be exactly the rest asked for, `bytes HAVE-(SIZE-1)/SIZE`.
fn check_range(
    response: &ureq::http::Response<Body>,
    have: u64,
    meta: &Meta,
) -> Result<u64, HttpError> {
    let asked = format!("bytes {have}-{}/{}", meta.size - 1, meta.size);
    let value = response
        .headers()
        .get("Content-Range")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_string());
    let parsed = value.as_deref().and_then(parse_content_range);
    match parsed {
        Some((start, end, total))
            if start == have && end == meta.size - 1 && total.is_none_or(|t| t == meta.size) =>
        {
            Ok(start)
        }
        _ => Err(HttpError::Invalid(format!(
            "asked for the rest of the file ({asked}, per its {}), the answer (HTTP 206) has {}; nothing of it was written",
            meta.size_from,
            match value {
                Some(v) => format!("Content-Range '{}'", shown(&v)),
                None => "no Content-Range".to_string(),
            }
        ))),
    }
}

/// `bytes START-END/SIZE` (SIZE may be `*`) as numbers.
pub(super) fn parse_content_range(value: &str) -> Option<(u64, u64, Option<u64>)> {
    let (range, total) = value.strip_prefix("bytes ")?.split_once('/')?;
    let (start, end) = range.split_once('-')?;
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse().ok()?),
    };
    Some((start.trim().parse().ok()?, end.trim().parse().ok()?, total))
}

/// A reader that stops after `cap + 1` bytes and remembers whether it got there.
struct Counted<R> {
    inner: io::Take<R>,
    cap: u64,
}

impl<R: Read> Counted<R> {
    fn new(inner: R, cap: u64) -> Self {
        Counted {
            inner: inner.take(cap + 1),
            cap,
        }
    }

    fn over(&self) -> bool {
        self.inner.limit() == 0 && self.cap < u64::MAX
    }
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::super::url::origin;
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
    fn quoting_follows_python() {
        assert_eq!(quote("LICENSE (1).txt", true), "LICENSE%20%281%29.txt");
        assert_eq!(quote("notes#1.md", true), "notes%231.md");
        assert_eq!(quote("sub/a?b.json", true), "sub/a%3Fb.json");
        assert_eq!(quote("refs/pr/1", false), "refs%2Fpr%2F1");
        assert_eq!(quote("é~_.-", true), "%C3%A9~_.-");
    }

    #[test]
    fn the_token_goes_only_to_the_endpoints_origin() {
        let hub = "http://127.0.0.1:8080";
        assert!(same_origin("http://127.0.0.1:8080/x", hub));
        assert!(same_origin("HTTP://127.0.0.1:8080/y?z", hub));
        assert!(!same_origin("http://127.0.0.1:8081/x", hub));
        assert!(!same_origin("https://127.0.0.1:8080/x", hub));
        assert!(!same_origin("http://localhost:8080/x", hub));
        assert!(same_origin("https://hf.co:443/x", "https://hf.co"));
        assert!(!same_origin("http://hf.co/x", "https://hf.co"));
    }

    #[test]
    fn locations_resolve_like_a_browser_and_only_to_http() {
        let base = "http://h:1/a/resolve/main/f.json?x=1";
        let ok = |l| resolve_location(base, l).unwrap();
        assert_eq!(ok("/b/c"), "http://h:1/b/c");
        assert_eq!(ok("g.json"), "http://h:1/a/resolve/main/g.json");
        assert_eq!(ok("//cdn:2/x"), "http://cdn:2/x");
        assert_eq!(ok("https://cdn/x#frag"), "https://cdn/x");
        for bad in ["file:///etc/passwd", "ftp://h/x", "data:,x", "gopher://h"] {
            let e = resolve_location(base, bad).unwrap_err();
            assert!(e.contains("only http and https"), "{bad}: {e}");
        }
        assert!(resolve_location(base, "http://").is_err());
        assert!(is_relative("/a") && is_relative("b") && !is_relative("//h/a"));
        assert!(!is_relative("https://h/a") && !is_relative("file:/x"));
    }

    #[test]
    fn content_ranges_parse() {
        assert_eq!(parse_content_range("bytes 0-9/10"), Some((0, 9, Some(10))));
        assert_eq!(parse_content_range("bytes 5-9/*"), Some((5, 9, None)));
        assert_eq!(parse_content_range("bytes 5-/10"), None);
        assert_eq!(parse_content_range("items 0-9/10"), None);
    }

    #[test]
    fn file_lists_are_capped_in_entries_and_keep_only_names() {
        let info: RepoInfo = serde_json::from_str(
            r#"{"id":"a/b","sha":"x","siblings":[{"rfilename":"a","size":3,"lfs":{"x":1}},{"rfilename":"b"}],"other":[1,2]}"#,
        )
        .unwrap();
        assert_eq!(info.siblings, ["a", "b"]);
        let many = format!(
            r#"{{"sha":"x","siblings":[{}]}}"#,
            vec![r#"{"rfilename":"f"}"#; MAX_LISTING_FILES + 1].join(",")
        );
        let e = serde_json::from_str::<RepoInfo>(&many)
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than 100000 files"), "{e}");
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
