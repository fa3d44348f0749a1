//! What `Plan.load` returns: a frozen `LoadReport` with one typed attribute per figure
//! (`wload/_wload.pyi` types them). It replaced a plain dict of the same keys, so it also reads as
//! a read-only mapping (`report["bytes"]`, `keys()`, `to_dict()`, ...): code written against the
//! dict keeps working.

use std::sync::atomic::Ordering;

use pyo3::IntoPyObjectExt;
use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyIterator, PyList};

use wload::engine::Stats;

use crate::fill::{LoadDone, Target};

/// What one `Plan.load` did: the rank, where its bytes went, how long each stage took.
///
/// Also a read-only mapping of the same names (`report["bytes"]`, `keys()`, `items()`,
/// `to_dict()`), as the dict `Plan.load` returned before; the CUDA figures are keys only for a
/// load onto a GPU.
#[pyclass(frozen, get_all, module = "wload")]
pub(crate) struct LoadReport {
    /// The global rank loaded (`pp_rank * tp + tp_rank`).
    rank: u64,
    /// Where the bytes went: "cpu" or "cuda:N".
    device: String,
    /// How many tensors were filled.
    tensors: u64,
    /// The bytes of all the rank's tensors.
    bytes: u64,
    /// Wall time of the whole load.
    seconds: f64,
    /// `bytes` over `transfer_s + sync_s`, in GB/s.
    gbps: f64,
    /// The read mode used (`io="auto"` chooses by page-cache residency).
    io: String,
    /// Why that mode, in a sentence: the residency `auto` saw, and with `auto` reading direct,
    /// the bytes other ranks read too, read through the page cache so that a node of ranks
    /// loading apart takes them from storage once.
    io_why: String,
    /// Measuring the page-cache residency that `io="auto"` decides by.
    cache_s: f64,
    /// The engine's run: reading, converting, copying.
    transfer_s: f64,
    /// Waiting for the last GPU copies to land (0 for host memory).
    sync_s: f64,
    /// Reading, summed over worker threads.
    read_s: f64,
    /// Converting dtypes, summed over worker threads.
    convert_s: f64,
    /// Handing bytes to the destinations, summed over worker threads.
    copy_s: f64,
    /// Bytes read from the source files (for an object store: fetched by ranged GETs), the
    /// direct reads among them, each byte counted once.
    bytes_read: u64,
    /// Bytes read straight into the destinations or the staging slots.
    direct_read_bytes: u64,
    /// Seconds with at least one of those reads in progress.
    direct_read_s: f64,
    /// Bytes copied on the host: into host destinations, or into staging for a GPU.
    host_copy_bytes: u64,
    /// Seconds with at least one of those copies in progress.
    host_copy_s: f64,
    // The CUDA figures: `None` for a load into host memory, and no key of the mapping.
    /// The GPU copies' time as CUDA events measured it; None for host memory.
    device_copy_s: Option<f64>,
    /// Waiting for a staging slot whose copy had not landed (the GPU was the slower stage);
    /// None for host memory.
    staging_wait_s: Option<f64>,
    /// Pinned memory held for staging; None for host memory.
    staging_bytes: Option<u64>,
}

impl LoadReport {
    /// The report of a load of `rank`'s `tensors` tensors (`bytes` in all) onto `target`, done
    /// as `done` says in `seconds` of wall time.
    pub(crate) fn new(
        rank: u64,
        target: Target,
        (tensors, bytes): (usize, u64),
        seconds: f64,
        done: &LoadDone,
    ) -> LoadReport {
        let cuda = matches!(target, Target::Cuda { .. });
        // The engine counts every source byte it reads or hands to the sink to read itself
        // (exec/copy.rs `copy_span`), so the sink's own reads are already in it.
        let bytes_read = done.stats.bytes_read.load(Ordering::Relaxed);
        LoadReport {
            rank,
            device: target.to_string(),
            tensors: tensors as u64,
            bytes,
            seconds,
            gbps: gbps(bytes, done.transfer_s + done.sync_s),
            io: done.io.to_string(),
            io_why: done.io_why.clone(),
            cache_s: done.cache_s,
            transfer_s: done.transfer_s,
            sync_s: done.sync_s,
            read_s: Stats::secs(&done.stats.read_ns),
            convert_s: Stats::secs(&done.stats.convert_ns),
            copy_s: Stats::secs(&done.stats.put_ns),
            bytes_read,
            direct_read_bytes: done.sink.read_bytes,
            direct_read_s: done.sink.read_s,
            host_copy_bytes: done.sink.copy_bytes,
            host_copy_s: done.sink.copy_s,
            device_copy_s: cuda.then_some(done.sink.device_copy_s),
            staging_wait_s: cuda.then_some(done.sink.wait_s),
            staging_bytes: cuda.then_some(done.sink.staging_bytes),
        }
    }

    /// The mapping's keys and values, in the order the dict had them; the CUDA figures only for
    /// a load onto a GPU.
    fn entries<'py>(&self, py: Python<'py>) -> PyResult<Vec<(&'static str, Bound<'py, PyAny>)>> {
        let mut e = vec![
            ("rank", self.rank.into_bound_py_any(py)?),
            ("device", self.device.as_str().into_bound_py_any(py)?),
            ("tensors", self.tensors.into_bound_py_any(py)?),
            ("bytes", self.bytes.into_bound_py_any(py)?),
            ("seconds", self.seconds.into_bound_py_any(py)?),
            ("gbps", self.gbps.into_bound_py_any(py)?),
            ("io", self.io.as_str().into_bound_py_any(py)?),
            ("io_why", self.io_why.as_str().into_bound_py_any(py)?),
            ("cache_s", self.cache_s.into_bound_py_any(py)?),
            ("transfer_s", self.transfer_s.into_bound_py_any(py)?),
            ("sync_s", self.sync_s.into_bound_py_any(py)?),
            ("read_s", self.read_s.into_bound_py_any(py)?),
            ("convert_s", self.convert_s.into_bound_py_any(py)?),
            ("copy_s", self.copy_s.into_bound_py_any(py)?),
            ("bytes_read", self.bytes_read.into_bound_py_any(py)?),
            (
                "direct_read_bytes",
                self.direct_read_bytes.into_bound_py_any(py)?,
            ),
            ("direct_read_s", self.direct_read_s.into_bound_py_any(py)?),
            (
                "host_copy_bytes",
                self.host_copy_bytes.into_bound_py_any(py)?,
            ),
            ("host_copy_s", self.host_copy_s.into_bound_py_any(py)?),
        ];
        if let Some(s) = self.device_copy_s {
            e.push(("device_copy_s", s.into_bound_py_any(py)?));
        }
        if let Some(s) = self.staging_wait_s {
            e.push(("staging_wait_s", s.into_bound_py_any(py)?));
        }
        if let Some(n) = self.staging_bytes {
            e.push(("staging_bytes", n.into_bound_py_any(py)?));
        }
        Ok(e)
    }

    /// The value of `key`; None for a key the report lacks, as for anything not a str (a dict
    /// of str keys says the same) or a str Rust cannot hold (a lone surrogate).
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Ok(key) = key.extract::<String>() else {
            return Ok(None);
        };
        let e = self.entries(py)?;
        Ok(e.into_iter().find(|(k, _)| *k == key).map(|(_, v)| v))
    }
}

/// The read-only mapping the report was before it had attributes.
#[pymethods]
impl LoadReport {
    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.lookup(py, key)?
            .ok_or_else(|| PyKeyError::new_err(key.clone().unbind()))
    }

    fn __contains__<'py>(&self, py: Python<'py>, key: &Bound<'py, PyAny>) -> PyResult<bool> {
        Ok(self.lookup(py, key)?.is_some())
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.entries(py)?.len())
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyIterator>> {
        self.keys(py)?.try_iter()
    }

    /// The keys, in order: the attributes' names, the CUDA figures' only for a GPU load.
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let keys: Vec<&str> = self.entries(py)?.into_iter().map(|(k, _)| k).collect();
        PyList::new(py, keys)
    }

    fn values<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let values: Vec<Bound<'py, PyAny>> =
            self.entries(py)?.into_iter().map(|(_, v)| v).collect();
        PyList::new(py, values)
    }

    fn items<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.entries(py)?)
    }

    /// The value of `key`, or `default` when the report has no such key.
    #[pyo3(signature = (key, default=None, /))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let found = self.lookup(py, key)?.or(default);
        Ok(found.unwrap_or_else(|| py.None().into_bound(py)))
    }

    /// The report as the dict `Plan.load` used to return (for `json.dumps`, say).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self.entries(py)? {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let fields: Vec<String> = (self.entries(py)?.into_iter())
            .map(|(k, v)| Ok(format!("{k}={}", v.repr()?)))
            .collect::<PyResult<_>>()?;
        Ok(format!("LoadReport({})", fields.join(", ")))
    }
}

fn gbps(bytes: u64, s: f64) -> f64 {
    if s > 0.0 { bytes as f64 / s / 1e9 } else { 0.0 }
}
