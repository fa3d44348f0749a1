//! A real S3-protocol server on 127.0.0.1 for the object-storage tests: `s3s-fs` (an S3
//! service over a folder), in this process, behind a layer that counts the bytes it sends for
//! GETs and can answer like a throttled or failing store.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;

/// The bucket every test server holds.
pub(crate) const BUCKET: &str = "models";

#[derive(Default)]
struct State {
    /// Bytes of object data sent in answers to GETs (Content-Length of 200 and 206 answers).
    get_bytes: AtomicU64,
    gets: AtomicU64,
    /// The next this many requests are answered `503 SlowDown`.
    throttle: AtomicU64,
    /// Upload-part requests are held this long each (to interrupt a run mid-upload).
    part_delay_ms: AtomicU64,
    parts: AtomicU64,
}

/// A running server; stopped when dropped (its runtime with it).
pub(crate) struct S3Server {
    pub(crate) addr: SocketAddr,
    root: tempfile::TempDir,
    cache: tempfile::TempDir,
    state: Arc<State>,
    _rt: tokio::runtime::Runtime,
}

impl S3Server {
    pub(crate) fn start() -> S3Server {
        let root = tempfile::TempDir::new().unwrap();
        std::fs::create_dir_all(root.path().join(BUCKET)).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let state = Arc::new(State::default());
        let fs = s3s_fs::FileSystem::new(root.path()).unwrap();
        let mut b = s3s::service::S3ServiceBuilder::new(fs);
        b.set_auth(s3s::auth::SimpleAuth::from_single(
            "test-key",
            "test-secret",
        ));
        let service = b.build();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let st = state.clone();
        rt.spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    continue;
                };
                let service = service.clone();
                let st = st.clone();
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let service = service.clone();
                        let st = st.clone();
                        async move { serve(&service, &st, req).await }
                    });
                tokio::spawn(async move {
                    let _ = ConnBuilder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(socket), svc)
                        .await;
                });
            }
        });
        S3Server {
            addr,
            root,
            cache: tempfile::TempDir::new().unwrap(),
            state,
            _rt: rt,
        }
    }

    /// The variables a `wload` run needs to reach this server.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", format!("http://{}", self.addr)),
            ("AWS_ACCESS_KEY_ID", "test-key".into()),
            ("AWS_SECRET_ACCESS_KEY", "test-secret".into()),
            ("AWS_REGION", "us-east-1".into()),
            // Retried requests back off for seconds by default: a throttling test would crawl.
            ("WLOAD_OBJECT_RETRIES", "3".into()),
            // The cache folder of object-store sources: never the user's.
            ("XDG_CACHE_HOME", self.cache.path().display().to_string()),
        ]
    }

    /// `wload` with this server's environment.
    pub(crate) fn wload(&self) -> assert_cmd::Command {
        let mut cmd = super::wload();
        for (k, v) in self.env() {
            cmd.env(k, v);
        }
        cmd
    }

    /// The folder that holds `prefix`'s objects, as files.
    pub(crate) fn folder(&self, prefix: &str) -> PathBuf {
        self.root.path().join(BUCKET).join(prefix)
    }

    /// Puts every file of `local` (a checkpoint folder, top level) under `prefix`.
    pub(crate) fn upload_dir(&self, local: &Path, prefix: &str) -> String {
        let to = self.folder(prefix);
        std::fs::create_dir_all(&to).unwrap();
        for e in std::fs::read_dir(local).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() {
                std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
            }
        }
        format!("s3://{BUCKET}/{prefix}")
    }

    /// The object names under `prefix`, sorted (the server's internal files left out).
    pub(crate) fn objects(&self, prefix: &str) -> Vec<String> {
        let dir = self.folder(prefix);
        let mut out: Vec<String> = match std::fs::read_dir(&dir) {
            Ok(rd) => rd
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with(".tmp."))
                .collect(),
            Err(_) => Vec::new(),
        };
        out.sort();
        out
    }

    /// Bytes sent for GETs since the last call (or the start).
    pub(crate) fn take_get_bytes(&self) -> u64 {
        self.state.gets.store(0, Ordering::Relaxed);
        self.state.get_bytes.swap(0, Ordering::Relaxed)
    }

    /// The next `n` requests are answered `503 SlowDown`, as a throttled S3 bucket does.
    pub(crate) fn throttle(&self, n: u64) {
        self.state.throttle.store(n, Ordering::Relaxed);
    }

    /// Each upload-part request is held `ms` milliseconds.
    pub(crate) fn delay_parts(&self, ms: u64) {
        self.state.part_delay_ms.store(ms, Ordering::Relaxed);
    }

    /// Upload-part requests received so far.
    pub(crate) fn parts(&self) -> u64 {
        self.state.parts.load(Ordering::Relaxed)
    }
}

async fn serve(
    service: &s3s::service::S3Service,
    st: &State,
    req: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<s3s::Body>, s3s::HttpError> {
    if st
        .throttle
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
    {
        let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code>\
                    <Message>Please reduce your request rate.</Message></Error>";
        return Ok(http::Response::builder()
            .status(503)
            .header("content-type", "application/xml")
            .body(s3s::Body::from(body.to_string()))
            .unwrap());
    }
    let is_get = req.method() == http::Method::GET;
    let is_part = req.method() == http::Method::PUT
        && req.uri().query().is_some_and(|q| q.contains("partNumber="));
    if is_part {
        st.parts.fetch_add(1, Ordering::Relaxed);
        let ms = st.part_delay_ms.load(Ordering::Relaxed);
        if ms > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
    }
    let listing = req
        .uri()
        .query()
        .is_some_and(|q| q.contains("list-type") || q.contains("prefix="));
    let resp = hyper::service::Service::call(service, req).await?;
    if is_get && !listing && resp.status().is_success() {
        let len = resp
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .unwrap_or(0);
        st.get_bytes.fetch_add(len, Ordering::Relaxed);
        st.gets.fetch_add(1, Ordering::Relaxed);
    }
    Ok(resp)
}
