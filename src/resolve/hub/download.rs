//! Putting files into a snapshot: linked from a blob the cache already holds, or downloaded into
//! `blobs/<etag>.part` (hf-hub's name; a Python `.incomplete` file is adopted), resumed with a
//! `Range` request after a break, retried while the link is only flaky, renamed to the blob when
//! complete, and only one download per blob at a time (`blobs/<etag>.lock`).

use std::collections::BTreeMap;
use std::fs;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::cache;
use super::error::http_error;
use super::http::{Client, HttpError, Meta};
use super::progress::Shown;
use super::{HubError, HubRequest, Origin, Stalled, Why};
use crate::resolve::ResolveError;

/// Makes sure files are in the snapshot: found in the cache, or downloaded.
pub(super) struct Fetcher<'a> {
    req: &'a HubRequest<'a>,
    repo_dir: &'a Path,
    snapshot: &'a Path,
    commit: &'a str,
    /// Set when nothing may be downloaded, and why.
    why: Option<Why>,
    pub(super) origins: BTreeMap<String, Origin>,
    /// Bytes each download of this run transferred (tries that failed included).
    transferred: Mutex<BTreeMap<String, u64>>,
    /// Made on the first download.
    client: Option<Client>,
}

/// Files downloaded at once.
const PARALLEL_DOWNLOADS: usize = 4;

/// Failed tries in a row, per request; a try that brought new bytes before it failed starts the
/// count again (as huggingface_hub does), so a long transfer over a flaky link still completes.
const DOWNLOAD_ATTEMPTS: u32 = 4;

impl<'a> Fetcher<'a> {
    /// `why` is set when nothing may be downloaded.
    pub(super) fn new(
        req: &'a HubRequest<'a>,
        repo_dir: &'a Path,
        snapshot: &'a Path,
        commit: &'a str,
        why: Option<Why>,
    ) -> Self {
        Fetcher {
            req,
            repo_dir,
            snapshot,
            commit,
            why,
            origins: BTreeMap::new(),
            transferred: Mutex::new(BTreeMap::new()),
            client: None,
        }
    }

    /// The commit files are fetched from.
    pub(super) fn commit(&self) -> &str {
        self.commit
    }

    /// Why nothing may be downloaded, when so.
    pub(super) fn why(&self) -> Option<&Why> {
        self.why.as_ref()
    }

    /// The files this run transferred bytes of, and how many.
    pub(super) fn bytes(&self) -> BTreeMap<String, u64> {
        self.transferred.lock().expect("not poisoned").clone()
    }

    /// Whether anything was asked of the hub (a file's metadata or content).
    pub(super) fn asked_hub(&self) -> bool {
        self.client.is_some()
    }

    /// Makes sure `files` are in the snapshot: found there, or downloaded unless `why` forbids it.
    pub(super) fn ensure(&mut self, files: &[String]) -> Result<(), ResolveError> {
        let mut missing = Vec::new();
        for f in files {
            if self.origins.contains_key(f) {
                continue;
            }
            // `is_file` follows the symlink: a link whose blob is gone is not cached.
            let path = self.snapshot.join(f);
            if path.is_file() {
                cache::check_inside(self.repo_dir, &path)?;
                self.origins.insert(f.clone(), Origin::Cache);
            } else {
                missing.push(f.clone());
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        if let Some(why) = &self.why {
            return Err(HubError::FilesNotCached {
                repo: self.req.repo.to_string(),
                revision: self.req.revision.to_string(),
                snapshot: self.snapshot.to_path_buf(),
                files: missing,
                why: why.clone(),
            }
            .into());
        }
        if self.client.is_none() {
            adopt_partial_downloads(&self.repo_dir.join("blobs"));
            self.client = Some(Client::new(self.req.env));
        }
        for f in &missing {
            // A link left behind by a deleted blob would stop the new one from being linked.
            let path = self.snapshot.join(f);
            if path.symlink_metadata().is_ok() {
                let _ = fs::remove_file(&path);
            }
        }
        let client = self.client.as_ref().expect("made above");
        let got = self.download(client, &missing)?;
        self.origins.extend(missing.into_iter().zip(got));
        Ok(())
    }

    /// Fetches `files` a few at a time, in file order each one's origin; the first failure
    /// (in file order) is returned.
    fn download(&self, client: &Client, files: &[String]) -> Result<Vec<Origin>, HubError> {
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let errors: Mutex<Vec<(usize, HubError)>> = Mutex::new(Vec::new());
        let origins: Mutex<Vec<Origin>> = Mutex::new(vec![Origin::Download; files.len()]);
        std::thread::scope(|s| {
            for _ in 0..PARALLEL_DOWNLOADS.min(files.len()) {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= files.len() || failed.load(Ordering::Relaxed) {
                            break;
                        }
                        match self.download_one(client, &files[i]) {
                            Ok(o) => origins.lock().expect("not poisoned")[i] = o,
                            Err(e) => {
                                failed.store(true, Ordering::Relaxed);
                                errors.lock().expect("not poisoned").push((i, e));
                            }
                        }
                    }
                });
            }
        });
        let mut errors = errors.into_inner().expect("not poisoned");
        errors.sort_by_key(|(i, _)| *i);
        match errors.into_iter().next() {
            Some((_, e)) => Err(e),
            None => Ok(origins.into_inner().expect("not poisoned")),
        }
    }

    /// Puts one file in the snapshot: a link to the blob when the cache has it already (the same
    /// content under another commit), else a download into `blobs/<etag>.part`, resumed from
    /// what is there, renamed to the blob when complete.
    fn download_one(&self, client: &Client, file: &str) -> Result<Origin, HubError> {
        if self.req.progress.stopped() {
            return Err(self.stopped(file, None));
        }
        // Pinned to the commit, so that every file comes from the same one even if the branch
        // moves meanwhile.
        let url = client.file_url(self.req.repo, self.commit, file);
        let meta = pinned_metadata(client, &url, self.req, self.commit, file)?;
        let blobs = self.repo_dir.join("blobs");
        let blob = blobs.join(&meta.etag);
        // huggingface_hub asks for the etag first and only links a blob it already has (the
        // same content under another commit); so does this.
        let complete = || fs::metadata(&blob).is_ok_and(|m| m.is_file() && m.len() == meta.size);
        if complete() {
            cache::link(self.snapshot, file, &meta.etag)?;
            return Ok(Origin::Cache);
        }
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| HubError::Io { path, source }
        };
        fs::create_dir_all(&blobs).map_err(io(&blobs))?;
        let _lock = self.lock(client, &blob, file)?;
        // Another process may have completed it while this one waited for the lock.
        if complete() {
            cache::link(self.snapshot, file, &meta.etag)?;
            return Ok(Origin::Cache);
        }
        let part = blobs.join(format!("{}.part", meta.etag));
        self.check_space(&blobs, &part, file, &meta)?;
        self.transfer(client, &url, file, &meta, &part)?;
        fs::rename(&part, &blob).map_err(io(&part))?;
        cache::link(self.snapshot, file, &meta.etag)?;
        Ok(Origin::Download)
    }

    /// Completes `part`, retrying a transfer that broke off or stalled, each try resuming from
    /// what the ones before it wrote.
    fn transfer(
        &self,
        client: &Client,
        url: &str,
        file: &str,
        meta: &Meta,
        part: &Path,
    ) -> Result<(), HubError> {
        let len = || fs::metadata(part).map_or(0, |m| m.len());
        let mut bar = Shown::new(self.req.progress, file);
        let mut tries = 0;
        let count = |from: u64, to: u64| {
            let mut t = self.transferred.lock().expect("not poisoned");
            *t.entry(file.to_string()).or_default() += to.saturating_sub(from);
        };
        loop {
            let before = len();
            let got = client.fetch(url, part, meta, &mut |have| {
                bar.show(meta.size, have);
                match self.req.progress.stopped() {
                    true => ControlFlow::Break(()),
                    false => ControlFlow::Continue(()),
                }
            });
            count(before, len());
            let Err(e) = got else {
                return Ok(());
            };
            let retry = match &e {
                // What is there is not this file's beginning (longer than the file, or complete
                // but not yet renamed when the hub says so): start it again.
                HttpError::Status(416) => fs::remove_file(part).is_ok(),
                e => e.is_transient(),
            };
            tries = if len() > before { 1 } else { tries + 1 };
            if !retry || tries >= DOWNLOAD_ATTEMPTS {
                return Err(match e {
                    HttpError::Stopped => self.stopped(file, Some((len(), meta.size, part))),
                    HttpError::Timeout(limit) => HubError::DownloadStalled(Box::new(Stalled {
                        repo: self.req.repo.to_string(),
                        file: file.to_string(),
                        endpoint: self.req.env.endpoint.clone(),
                        limit,
                        tries,
                        have: len(),
                        size: meta.size,
                        part: part.to_path_buf(),
                    })),
                    e => http_error(self.req, Some(file), self.commit, e),
                });
            }
            backoff(&e, tries);
            if self.req.progress.stopped() {
                return Err(self.stopped(file, Some((len(), meta.size, part))));
            }
        }
    }

    /// The error of a download the caller stopped, with what it left for the next run.
    fn stopped(&self, file: &str, part: Option<(u64, u64, &Path)>) -> HubError {
        HubError::Stopped {
            repo: self.req.repo.to_string(),
            file: file.to_string(),
            kept: part.map(|(have, size, part)| (have, size, part.to_path_buf())),
        }
    }

    /// Refuses a download that cannot fit, before writing a byte: a size announced far beyond
    /// the free space (honestly or not) would otherwise fill the disk before failing.
    fn check_space(
        &self,
        blobs: &Path,
        part: &Path,
        file: &str,
        meta: &Meta,
    ) -> Result<(), HubError> {
        let have = fs::metadata(part).map_or(0, |m| m.len());
        let need = meta.size.saturating_sub(have);
        match free_bytes(blobs) {
            Some(free) if free < need => Err(HubError::NoSpace {
                repo: self.req.repo.to_string(),
                file: file.to_string(),
                size: need,
                dir: blobs.to_path_buf(),
                free,
            }),
            _ => Ok(()),
        }
    }

    /// Holds `blobs/<etag>.lock` (hf-hub's lock) so that two downloads of one blob, by two runs
    /// or by two files of this one with the same content, do not append to one partial file.
    /// The holder is waited for while its partial file grows; one that has written nothing for
    /// `HF_HUB_DOWNLOAD_TIMEOUT` is given up on, as a stalled transfer would be. A lock dies with its
    /// process, so none is ever left stale.
    fn lock(&self, client: &Client, blob: &Path, file: &str) -> Result<fs::File, HubError> {
        use std::os::fd::AsRawFd;
        use std::time::{Duration, Instant};
        let path = blob.with_extension("lock");
        let part = blob.with_extension("part");
        let lock = fs::File::create(&path).map_err(|source| HubError::Io {
            path: path.clone(),
            source,
        })?;
        let patience = Duration::from_secs(client.download.secs);
        let len = || fs::metadata(&part).map_or(0, |m| m.len());
        let (mut seen, mut since) = (len(), Instant::now());
        loop {
            // SAFETY: flock on a descriptor this function owns; no memory is involved.
            if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(lock);
            }
            if self.req.progress.stopped() {
                return Err(self.stopped(file, None));
            }
            if len() != seen {
                (seen, since) = (len(), Instant::now());
            } else if since.elapsed() > patience {
                return Err(HubError::Download {
                    repo: self.req.repo.to_string(),
                    file: file.to_string(),
                    message: format!(
                        "{} is held by another download of the same content, which has written nothing to {} for {} s; run again when it is done",
                        path.display(),
                        part.display(),
                        patience.as_secs()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Bytes an unprivileged process may still write on the file system of `dir`, when it says.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs only writes the struct it is given, from a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    st.f_bavail.checked_mul(st.f_frsize)
}

/// huggingface_hub leaves an interrupted download in `blobs/<etag>.incomplete`; hf-hub resumes
/// from `blobs/<etag>.part`. Renaming the first to the second lets a download that Python (or
/// vLLM) started be resumed here instead of starting over. Both are named by the file's etag, so
/// no request is needed to match them.
fn adopt_partial_downloads(blobs: &Path) {
    let Ok(rd) = fs::read_dir(blobs) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(etag) = name.strip_suffix(".incomplete") {
            let part = blobs.join(format!("{etag}.part"));
            if !part.exists() {
                let _ = fs::rename(e.path(), part);
            }
        }
    }
}

/// Asks again, a few times, when the network rather than the request failed. A metadata request
/// that timed out is not asked again: a hub silent for that long is reported at once, as
/// huggingface_hub does, rather than after several timeouts.
/// `file`'s metadata at `url`, pinned to `commit`: a hub that answers for another commit (the
/// branch moved meanwhile) is refused, so that every file of a run comes from one commit.
pub(super) fn pinned_metadata(
    client: &Client,
    url: &str,
    req: &HubRequest,
    commit: &str,
    file: &str,
) -> Result<Meta, HubError> {
    let meta =
        retried(|| client.metadata(url)).map_err(|e| http_error(req, Some(file), commit, e))?;
    if meta.commit != commit {
        return Err(HubError::Download {
            repo: req.repo.to_string(),
            file: file.to_string(),
            message: format!(
                "the hub answered for commit {} rather than {commit}",
                meta.commit
            ),
        });
    }
    Ok(meta)
}

pub(super) fn retried<T>(mut f: impl FnMut() -> Result<T, HttpError>) -> Result<T, HttpError> {
    let mut tries = 0;
    loop {
        tries += 1;
        match f() {
            Err(e)
                if e.is_transient()
                    && !matches!(e, HttpError::Timeout(_))
                    && tries < DOWNLOAD_ATTEMPTS =>
            {
                backoff(&e, tries)
            }
            other => return other,
        }
    }
}

/// Waits before another try, unless the last one already waited out a timeout.
fn backoff(e: &HttpError, tries: u32) {
    if !matches!(e, HttpError::Timeout(_)) {
        std::thread::sleep(std::time::Duration::from_millis(250 << tries.min(4)));
    }
}
