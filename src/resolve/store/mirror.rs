//! A pre-sharded folder in a store (the output of `shard -o s3://…`, complete or still being
//! written by `--ranks` runs), mirrored for `inspect` so that it is surveyed exactly as a local
//! folder is (one verdict on records and rank files, [`crate::sharded::runs`]). Only what the
//! survey reads is fetched: the run records and the config whole, and of each rank file its
//! header (two ranged GETs), written into a sparse local file of the object's size. Other
//! objects are empty sparse files of their size: the survey needs their names only. No rank
//! file's data is fetched.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::client::{Listed, Store};
use super::url::StoreUrl;
use super::{StoreError, header_bytes};
use crate::resolve::ResolveError;
use crate::resolve::remote::needed::is_rank_file;

/// The local mirror of a store's pre-sharded folder; removed when dropped.
#[derive(Debug)]
pub(crate) struct Mirror {
    pub(crate) dir: PathBuf,
    /// The folder's URL, as the user wrote it.
    pub(crate) url: String,
}

impl Drop for Mirror {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The mirror of `source` when it is a store URL whose prefix holds rank files; `None` for
/// anything else (a local path, a checkpoint in a store, a URL the resolver will refuse), which
/// `inspect` handles as before.
pub(crate) fn pre_sharded(source: &Path) -> Result<Option<Mirror>, ResolveError> {
    let Ok(Some(url)) = StoreUrl::parse(&source.to_string_lossy()) else {
        return Ok(None);
    };
    let store = Store::open(&url)?;
    let objects = store.list()?;
    let top = |o: &&Listed| !o.name.contains('/');
    if !objects.iter().filter(top).any(|o| is_rank_file(&o.name)) {
        return Ok(None);
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!(".wload-inspect-{}-{nanos}", std::process::id()));
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ResolveError::Io { path, source }
    };
    fs::create_dir(&dir).map_err(io(&dir))?;
    let mirror = Mirror {
        dir,
        url: url.to_string(),
    };
    for o in &objects {
        // Nested objects (a copied side folder): the survey sees their folder's name.
        if let Some((folder, _)) = o.name.split_once('/') {
            let p = mirror.dir.join(folder);
            if safe_name(folder) && !p.exists() {
                fs::create_dir(&p).map_err(io(&p))?;
            }
            continue;
        }
        if safe_name(&o.name) {
            mirror_object(&store, o, &mirror.dir.join(&o.name)).map_err(|e| match e {
                Fault::Store(e) => ResolveError::from(e),
                Fault::Local(path, source) => ResolveError::Io { path, source },
            })?;
        }
    }
    Ok(Some(mirror))
}

/// A name a folder can hold: no `.` or `..`, nothing empty.
fn safe_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".."
}

enum Fault {
    Store(StoreError),
    Local(PathBuf, std::io::Error),
}

/// One top-level object at `path`: a record or the config whole, a rank file's header in a
/// sparse file of its size, anything else an empty sparse file of its size.
fn mirror_object(store: &Store, o: &Listed, path: &Path) -> Result<(), Fault> {
    let small = crate::sharded::runs::is_record(&o.name)
        || o.name == "config.json"
        || o.name == "params.json";
    let bytes = match () {
        _ if small => store.get(&o.name).map_err(Fault::Store)?.0.to_vec(),
        _ if is_rank_file(&o.name) => header_bytes(store, o).map_err(Fault::Store)?.0,
        _ => Vec::new(),
    };
    let local = |e| Fault::Local(path.to_path_buf(), e);
    let mut f = fs::File::create(path).map_err(local)?;
    f.write_all(&bytes).map_err(local)?;
    if !small {
        f.set_len(o.size).map_err(local)?;
    }
    Ok(())
}
