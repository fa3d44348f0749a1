//! A blocking face over the `object_store` crate: one client per URL, the crate's own retries
//! with back-off and timeouts, and every call checked against what was planned (sizes, etags).
//! wload's engine runs on its own threads (rayon): each call blocks on one shared runtime.

use std::ops::Range;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutPayload,
    RetryConfig,
};

use super::error::StoreError;
use super::url::{Scheme, StoreUrl};

/// Retries of a failed or throttled request (the crate's default); `WLOAD_OBJECT_RETRIES` sets
/// it, within [0, 100].
const RETRIES: usize = 10;
/// No request is retried past this since it began (the crate's default).
const RETRY_WINDOW: Duration = Duration::from_secs(180);

/// The one runtime every blocking call runs on. Four workers: they only drive sockets.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .thread_name("wload-store")
            .enable_all()
            .build()
            .expect("a tokio runtime (threads and a timer) can always be built")
    })
}

/// Runs `fut` to completion on the shared runtime, from any thread that is not the runtime's.
pub(crate) fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    runtime().block_on(fut)
}

/// One object of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    /// Its key relative to the folder's prefix.
    pub(crate) name: String,
    pub(crate) size: u64,
    pub(crate) etag: String,
}

/// A client for one "folder" of a store.
#[derive(Debug, Clone)]
pub(crate) struct Store {
    pub(crate) url: StoreUrl,
    inner: Arc<dyn ObjectStore>,
    retries: usize,
}

impl Store {
    /// A client for `url`, configured from the environment as each store's own tools are.
    pub(crate) fn open(url: &StoreUrl) -> Result<Store, StoreError> {
        let retries = std::env::var("WLOAD_OBJECT_RETRIES")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(RETRIES, |n| n.min(100));
        let retry = RetryConfig {
            backoff: BackoffConfig::default(),
            max_retries: retries,
            retry_timeout: RETRY_WINDOW,
        };
        let config_err = |e: object_store::Error| StoreError::Config {
            url: url.to_string(),
            scheme: url.scheme,
            message: super::error::without_queries(&e.to_string()),
        };
        let bucket_url = format!("{}://{}", url.written, url.bucket);
        // The builders share no trait: the same calls, once per store.
        macro_rules! finish {
            ($builder:expr) => {
                $builder
                    .with_url(&bucket_url)
                    .with_client_options(client_options(false))
                    .with_retry(retry)
                    .build()
                    .map(|s| Arc::new(s) as _)
                    .map_err(config_err)?
            };
        }
        let inner: Arc<dyn ObjectStore> = match url.scheme {
            Scheme::S3 => {
                use object_store::aws::AmazonS3Builder;
                let b = AmazonS3Builder::from_env().with_url(&bucket_url);
                // An S3-compatible server on plain HTTP (MinIO, a test server) is named by its
                // endpoint: that is the user's say-so, as the AWS CLI takes it.
                let endpoint = std::env::var("AWS_ENDPOINT_URL_S3")
                    .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
                    .or_else(|_| std::env::var("AWS_ENDPOINT"))
                    .ok();
                let http = endpoint
                    .as_deref()
                    .is_some_and(|e| e.starts_with("http://"));
                let b = match &endpoint {
                    Some(e) => b.with_endpoint(e),
                    None => b,
                };
                b.with_client_options(client_options(http))
                    .with_retry(retry)
                    .build()
                    .map(|s| Arc::new(s) as _)
                    .map_err(config_err)?
            }
            Scheme::Gcs => finish!(object_store::gcp::GoogleCloudStorageBuilder::from_env()),
            Scheme::Azure => finish!(object_store::azure::MicrosoftAzureBuilder::from_env()),
        };
        Ok(Store {
            url: url.clone(),
            inner,
            retries,
        })
    }

    fn path(&self, name: &str) -> ObjectPath {
        ObjectPath::from(self.url.key(name))
    }

    fn err(&self, name: &str, op: &'static str, t: Instant, e: object_store::Error) -> StoreError {
        let url = if name.is_empty() {
            self.url.to_string()
        } else {
            self.url.child(name)
        };
        StoreError::from_store(
            &url,
            op,
            self.url.scheme,
            (self.retries, t.elapsed().as_secs_f64()),
            e,
        )
    }

    /// Every object under the folder's prefix, by name relative to it, in name order.
    pub(crate) fn list(&self) -> Result<Vec<Listed>, StoreError> {
        let t = Instant::now();
        let prefix = (!self.url.prefix.is_empty()).then(|| ObjectPath::from(&*self.url.prefix));
        let metas: Vec<object_store::ObjectMeta> =
            block_on(self.inner.list(prefix.as_ref()).try_collect::<Vec<_>>())
                .map_err(|e| self.err("", "listing", t, e))?;
        let strip = if self.url.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.url.prefix)
        };
        let mut out: Vec<Listed> = metas
            .into_iter()
            .filter_map(|m| {
                let key = m.location.to_string();
                let name = key.strip_prefix(&strip)?.to_string();
                Some(Listed {
                    name,
                    size: m.size,
                    etag: m.e_tag.unwrap_or_default(),
                })
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Bytes `range` of `name`, which must still have `etag` (when known): a replaced object is
    /// refused, never read from.
    pub(crate) fn get_range(
        &self,
        name: &str,
        range: Range<u64>,
        etag: Option<&str>,
    ) -> Result<Bytes, StoreError> {
        self.get_range_tagged(name, range, etag).map(|(b, _)| b)
    }

    /// [`Store::get_range`], with the etag the store answered with (empty when it sent none).
    pub(crate) fn get_range_tagged(
        &self,
        name: &str,
        range: Range<u64>,
        etag: Option<&str>,
    ) -> Result<(Bytes, String), StoreError> {
        let t = Instant::now();
        let want = range.end - range.start;
        let opts = GetOptions {
            if_match: etag.filter(|e| !e.is_empty()).map(str::to_string),
            range: Some(GetRange::Bounded(range)),
            ..Default::default()
        };
        let got = block_on(async {
            let r = self.inner.get_opts(&self.path(name), opts).await?;
            let now = r.meta.e_tag.clone().unwrap_or_default();
            Ok::<_, object_store::Error>((now, r.bytes().await?))
        })
        .map_err(|e| match (e, etag) {
            // The store refused If-Match: the object is no longer the one planned.
            (object_store::Error::Precondition { .. }, Some(planned)) => StoreError::Changed {
                url: self.url.child(name),
                planned: planned.to_string(),
                now: "another".into(),
            },
            (e, _) => self.err(name, "reading", t, e),
        })?;
        let (now, bytes) = got;
        if let Some(planned) = etag.filter(|e| !e.is_empty())
            && !now.is_empty()
            && now != planned
        {
            return Err(StoreError::Changed {
                url: self.url.child(name),
                planned: planned.to_string(),
                now,
            });
        }
        if bytes.len() as u64 != want {
            return Err(StoreError::Short {
                url: self.url.child(name),
                want,
                got: bytes.len() as u64,
            });
        }
        Ok((bytes, now))
    }

    /// The whole of `name` (a small file: config, index, tokenizer), with its etag.
    pub(crate) fn get(&self, name: &str) -> Result<(Bytes, String), StoreError> {
        let t = Instant::now();
        let (etag, bytes) = block_on(async {
            let r = self.inner.get(&self.path(name)).await?;
            let etag = r.meta.e_tag.clone().unwrap_or_default();
            Ok::<_, object_store::Error>((etag, r.bytes().await?))
        })
        .map_err(|e| self.err(name, "downloading", t, e))?;
        Ok((bytes, etag))
    }

    /// Writes `bytes` as `name` in one request (visible at once, whole).
    pub(crate) fn put(&self, name: &str, bytes: Bytes) -> Result<(), StoreError> {
        let t = Instant::now();
        block_on(self.inner.put(&self.path(name), PutPayload::from(bytes)))
            .map(|_| ())
            .map_err(|e| self.err(name, "uploading", t, e))
    }

    /// Starts a multipart upload of `name`: nothing is visible until it is completed.
    pub(crate) fn begin_upload(
        &self,
        name: &str,
    ) -> Result<Box<dyn object_store::MultipartUpload>, StoreError> {
        let t = Instant::now();
        block_on(self.inner.put_multipart(&self.path(name)))
            .map_err(|e| self.err(name, "starting an upload", t, e))
    }

    /// Uploads `parts` of one multipart upload, `in_flight` at a time, in order.
    pub(crate) fn upload_parts(
        &self,
        name: &str,
        up: &mut dyn object_store::MultipartUpload,
        parts: impl Iterator<Item = Result<Bytes, StoreError>>,
        in_flight: usize,
    ) -> Result<(), StoreError> {
        let t = Instant::now();
        let mut local = None;
        let futs = parts.map_while(|p| match p {
            Ok(b) => Some(up.put_part(PutPayload::from(b))),
            Err(e) => {
                local = Some(e);
                None
            }
        });
        // Built lazily by the stream: each part is read from disk only when a slot is free.
        let r = block_on(
            futures::stream::iter(futs)
                .buffer_unordered(in_flight)
                .try_collect::<Vec<_>>(),
        );
        if let Some(e) = local {
            return Err(e);
        }
        r.map(|_| ()).map_err(|e| self.err(name, "uploading", t, e))
    }

    pub(crate) fn complete(
        &self,
        name: &str,
        up: &mut dyn object_store::MultipartUpload,
    ) -> Result<(), StoreError> {
        let t = Instant::now();
        block_on(up.complete())
            .map(|_| ())
            .map_err(|e| self.err(name, "completing an upload", t, e))
    }

    /// Aborts an upload: its parts are dropped by the store, no object appears.
    pub(crate) fn abort(&self, up: &mut dyn object_store::MultipartUpload) {
        // Best effort: a store that cannot be reached now expires incomplete uploads by its
        // lifecycle rules, and they were never visible objects.
        let _ = block_on(up.abort());
    }

    /// Deletes `name`.
    pub(crate) fn delete(&self, name: &str) -> Result<(), StoreError> {
        let t = Instant::now();
        block_on(self.inner.delete(&self.path(name))).map_err(|e| self.err(name, "deleting", t, e))
    }
}

/// Timeouts: 10 s to connect, 5 minutes for one request (a 16 MiB range or part at 60 KB/s).
fn client_options(allow_http: bool) -> ClientOptions {
    ClientOptions::new()
        .with_connect_timeout(Duration::from_secs(10))
        .with_timeout(Duration::from_secs(300))
        .with_allow_http(allow_http)
}
