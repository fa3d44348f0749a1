//! `wload._wload`: the Python binding of wload's plan and engine. `wload.plan(...)` resolves and
//! plans a source as `wload load` does (a checkpoint folder, a hub repo id, or a pre-sharded
//! folder of wload's or vLLM's), `Plan.tensors(rank)` lists what a rank holds, and
//! `Plan.load(rank, dests)` fills caller-owned host or CUDA memory given as raw addresses,
//! through the same engine as `wload load` (`fill.rs`). The Python package (`wload/__init__.py`) re-exports
//! these; python/README.md documents the API.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

mod fill;
mod interruptible;
mod report;

use pyo3::create_exception;
use pyo3::exceptions::{PyOverflowError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList, PyTuple};

use wload::ConfigFormat;
use wload::DownloadProgress;
use wload::DtypeChoice;
use wload::InputKind;
use wload::LoadFlags;
use wload::MmEncoderTpMode;
use wload::MoeBackend;
use wload::engine::DeviceError;
use wload::engine::ExecError;
use wload::engine::IoMode;
use wload::{Error, ExitStatus, SourceOptions};

use report::LoadReport;

create_exception!(
    _wload,
    WloadError,
    PyRuntimeError,
    "A wload failure that is not the checkpoint's or the caller's: I/O, network, a source that \
     changed while being read. After a failed load the destinations hold partial data."
);
create_exception!(
    _wload,
    PlanError,
    PyValueError,
    "wload cannot plan the source with these options (vLLM would refuse it too): str() is \
     wload's full message, `.problems` each problem as wload's JSON lists it."
);

/// The problem fields every dict in `PlanError.problems` has (None when not about one).
const PROBLEM_KEYS: [&str; 7] = [
    "message",
    "fix",
    "file",
    "tensor",
    "parameter",
    "shape",
    "expected_shape",
];

/// The command line's flags as `wload.plan`'s keywords, longest first so that no flag is cut
/// inside a longer one (`--pp-partition` before `--pp`).
const KEYWORDS: [(&str, &str); 13] = [
    ("--enable-expert-parallel", "expert_parallel=True"),
    ("--mm-encoder-tp-mode", "mm_encoder_tp_mode="),
    ("--language-model-only", "language_model_only=True"),
    ("--config-format", "config_format="),
    ("--download-dir", "download_dir="),
    ("--hf-overrides", "hf_overrides="),
    ("--load-format", "load_format="),
    ("--moe-backend", "moe_backend="),
    ("--revision", "revision="),
    ("--mapping", "mapping="),
    ("--dtype", "dtype="),
    ("--tp", "tp="),
    ("--pp", "pp="),
];

/// wload's message as a Python caller reads it: its flags named as the keywords they passed.
fn as_keywords(message: &str) -> String {
    let mut out = message.to_string();
    for (flag, keyword) in KEYWORDS {
        let mut next = String::with_capacity(out.len());
        let mut rest = out.as_str();
        while let Some(at) = rest.find(flag) {
            let after = &rest[at + flag.len()..];
            // Only the flag itself: `--tp` in `--tp-size` or `--tpx` stays.
            let whole = !after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-');
            next.push_str(&rest[..at]);
            if whole {
                // `--tp 2` reads `tp=2`, `--dtype 'float16'` `dtype='float16'`; `a --tp that
                // divides 8` reads `a tp that divides 8`.
                let value = after
                    .strip_prefix(' ')
                    .filter(|v| v.starts_with(|c: char| c.is_ascii_digit() || "'\"{[".contains(c)));
                match (keyword.strip_suffix('='), value) {
                    (Some(_), Some(v)) => {
                        next.push_str(keyword);
                        rest = v;
                    }
                    (Some(name), None) => {
                        next.push_str(name);
                        rest = after;
                    }
                    (None, _) => {
                        next.push_str(keyword);
                        rest = after;
                    }
                }
            } else {
                next.push_str(flag);
                rest = after;
            }
        }
        next.push_str(rest);
        out = next;
    }
    out
}

/// `e` as a Python exception: PlanError for what is wrong with the source or the options
/// (wload's exit statuses 2 and 3), WloadError for the rest; the flags its text names are
/// `wload.plan`'s keywords.
fn to_py(py: Python<'_>, e: &Error) -> PyErr {
    let status = e.exit_status();
    let message = as_keywords(&e.to_string());
    if !matches!(status, ExitStatus::Checkpoint | ExitStatus::Usage) {
        return WloadError::new_err(message);
    }
    let err = PlanError::new_err(message.clone());
    let problems = problem_dicts(py, e, &message).unwrap_or_else(|_| PyList::empty(py));
    // Setting an attribute on a fresh exception object does not fail.
    let _ = err.value(py).setattr("problems", problems);
    err
}

/// The problems of `e` as wload's JSON has them, or one problem carrying `message`.
fn problem_dicts<'py>(py: Python<'py>, e: &Error, message: &str) -> PyResult<Bound<'py, PyList>> {
    let failure = wload::report::json::failure(e, e.exit_status() as u8);
    let mut problems = serde_json::to_value(&failure.problems).unwrap_or_default();
    if failure.problems.is_empty() {
        problems = serde_json::json!([{ "message": message }]);
    }
    let loaded = py
        .import("json")?
        .call_method1("loads", (as_keywords(&problems.to_string()),))?;
    let list = loaded.downcast_into::<PyList>()?;
    for d in list.iter() {
        let d = d.downcast::<PyDict>()?;
        for k in PROBLEM_KEYS {
            if !d.contains(k)? {
                d.set_item(k, py.None())?;
            }
        }
    }
    Ok(list)
}

fn usage(py: Python<'_>, message: String) -> PyErr {
    to_py(py, &Error::Usage(message))
}

/// `v`'s repr for a message, cut to 80 characters; its type's name when its repr raises (a
/// caller's object may do anything), without reporting that exception as unraisable as pyo3's
/// `Display` would.
fn show(v: &Bound<'_, PyAny>) -> String {
    match v.repr().and_then(|r| r.extract::<String>()) {
        Ok(r) if r.chars().count() > 80 => format!("{}...", r.chars().take(77).collect::<String>()),
        Ok(r) => r,
        Err(_) => {
            let ty = (v.get_type().name()).map_or_else(|_| "object".into(), |n| n.to_string());
            format!("<{ty} object>")
        }
    }
}

/// A non-negative integer argument (a rank, `tp`, a stream, ...). A bool, or anything not an
/// int, is a TypeError as Python's own conversions give it (pyo3 adds the argument's name); an
/// int out of range is kept as its repr, so that the function, which knows the argument's name
/// and what it means, refuses it with the documented exception (PlanError for `wload.plan`'s
/// options, ValueError for `Plan`'s), not the OverflowError pyo3 would raise.
struct UInt(Result<u64, String>);

impl<'py> FromPyObject<'py> for UInt {
    fn extract_bound(ob: &Bound<'py, PyAny>) -> PyResult<Self> {
        if ob.is_instance_of::<PyBool>() {
            return Err(PyTypeError::new_err(format!(
                "expected an int, not the bool {}",
                show(ob)
            )));
        }
        match ob.extract::<u64>() {
            Ok(n) => Ok(UInt(Ok(n))),
            Err(e) if e.is_instance_of::<PyOverflowError>(ob.py()) => Ok(UInt(Err(show(ob)))),
            Err(e) => Err(e),
        }
    }
}

impl UInt {
    /// The value, or `refuse(repr)` when it is negative or not below 2^64.
    fn get(self, refuse: impl FnOnce(&str) -> PyErr) -> PyResult<u64> {
        self.0.map_err(|n| refuse(&n))
    }
}

/// The ValueError for a `Plan` argument that is a negative or too large integer.
fn out_of_range(what: &str, n: &str) -> PyErr {
    PyValueError::new_err(format!(
        "{what}={n}: expected a whole number from 0 to {}",
        u64::MAX
    ))
}

/// A plan option that must be a non-negative integer, or the PlanError naming it.
fn option_uint(py: Python<'_>, what: &str, v: Option<UInt>) -> PyResult<Option<u64>> {
    v.map(|v| {
        v.get(|n| {
            usage(
                py,
                format!("{what}={n}: expected a whole number from 0 to {}", u64::MAX),
            )
        })
    })
    .transpose()
}

/// `pp_partition` as vLLM's VLLM_PP_LAYER_PARTITION string: given as one ("3,5") or as a
/// sequence of layer counts. A sequence that is not all non-negative ints (a bool, -1, a float)
/// is a PlanError naming the option, as any other bad option is.
fn pp_partition_text(py: Python<'_>, v: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = v.extract::<String>() {
        return Ok(s);
    }
    let bad = |why: String| {
        usage(
            py,
            format!(
                "pp_partition {why}: expected the layer count of each pipeline stage, as a list \
                 of non-negative ints ([3, 5]) or a string (\"3,5\")"
            ),
        )
    };
    // Bytes are a sequence of ints to Python, not a list of layer counts.
    if v.is_instance_of::<pyo3::types::PyBytes>() || v.is_instance_of::<pyo3::types::PyByteArray>()
    {
        return Err(bad(show(v)));
    }
    let items = v.try_iter().map_err(|_| bad(show(v)))?;
    let mut counts = Vec::new();
    for item in items {
        let item = item?;
        match item.extract::<UInt>() {
            Ok(UInt(Ok(n))) => counts.push(n.to_string()),
            Ok(UInt(Err(_))) => return Err(bad(format!("has {}", show(&item)))),
            Err(e) if e.is_instance_of::<PyTypeError>(py) => {
                return Err(bad(format!("has {}", show(&item))));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(counts.join(","))
}

/// One tensor a rank holds: vLLM's parameter name, safetensors dtype (and torch's name for it),
/// shape and size.
#[pyclass(frozen, module = "wload")]
struct Tensor {
    /// vLLM's parameter name.
    #[pyo3(get)]
    name: String,
    /// The safetensors spelling: "BF16", "F32", "F8_E4M3", "I32", "U8", ...
    #[pyo3(get)]
    dtype: String,
    // From `Dtype::torch_name`, the one home of these names: the plugin has no table of them.
    /// torch's name for the dtype ("bfloat16", "float8_e4m3fn"), for
    /// `getattr(torch, t.torch_dtype)`; None for F4 and F6, which torch has no one-element type for.
    #[pyo3(get)]
    torch_dtype: Option<&'static str>,
    shape: Vec<u64>,
    #[pyo3(get)]
    nbytes: u64,
}

#[pymethods]
impl Tensor {
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    fn __repr__(&self) -> String {
        format!(
            "Tensor(name={:?}, dtype={:?}, shape={:?}, nbytes={})",
            self.name, self.dtype, self.shape, self.nbytes
        )
    }
}

/// A source planned for a TP × PP layout: what every rank holds, and how to fill it.
#[pyclass(frozen, module = "wload")]
struct Plan {
    plan: wload::Plan,
    root: PathBuf,
    kind: InputKind,
    warnings: Vec<String>,
    note: Option<String>,
}

impl Plan {
    /// The index of global rank `rank` in the plan.
    fn rank_index(&self, rank: UInt) -> PyResult<(u64, usize)> {
        let not_in = |rank: &str| {
            PyValueError::new_err(format!(
                "rank {rank} is not in the plan: ranks are 0 to {} (tp {} × pp {})",
                self.plan.world_size().saturating_sub(1),
                self.plan.tp,
                self.plan.pp
            ))
        };
        let rank = rank.get(not_in)?;
        let j = (self.plan.ranks.iter().position(|r| r.rank == rank))
            .ok_or_else(|| not_in(&rank.to_string()))?;
        Ok((rank, j))
    }

    /// Each tensor's destination, in the rank's tensor order; ValueError naming every unknown or
    /// missing name (or bad address), before anything is read.
    fn destinations(&self, j: usize, dests: &Bound<'_, PyDict>) -> PyResult<Vec<(*mut u8, usize)>> {
        let tensors = &self.plan.ranks[j].tensors;
        let index: HashMap<&str, usize> = (tensors.iter().enumerate())
            .map(|(i, t)| (t.name.as_str(), i))
            .collect();
        let mut addr: Vec<Option<usize>> = vec![None; tensors.len()];
        let mut unknown = Vec::new();
        let mut bad = Vec::new();
        // A snapshot of the items: iterating the dict itself would panic (pyo3 asserts the size
        // does not change) when a key's or an address's `__index__` mutates it.
        for kv in dests.items().iter() {
            let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = kv.extract()?;
            let name: String = k.extract().map_err(|_| {
                PyValueError::new_err(format!(
                    "destination keys are tensor names, not {}",
                    show(&k)
                ))
            })?;
            let Some(&i) = index.get(name.as_str()) else {
                unknown.push(name);
                continue;
            };
            // A bool is an int to Python, but True as address 1 is a bug in the caller's code.
            if v.is_instance_of::<PyBool>() {
                return Err(PyTypeError::new_err(format!(
                    "destination '{name}' is {}, a bool: give the integer address of its buffer \
                     (numpy a.ctypes.data, torch t.data_ptr()); nothing was written",
                    show(&v)
                )));
            }
            let bytes = tensors[i].bytes;
            match v.extract::<usize>() {
                // No buffer wraps around the end of the address space: such an address (numpy's
                // uint64 max, say) is refused here instead of being written through.
                Ok(a) if usize::try_from(bytes).is_ok_and(|n| a.checked_add(n).is_none()) => bad
                    .push(format!(
                        "'{name}': {} (its {bytes} bytes would end past the address space)",
                        show(&v)
                    )),
                Ok(a) if a != 0 || bytes == 0 => addr[i] = Some(a),
                _ => bad.push(format!("'{name}': {}", show(&v))),
            }
        }
        let rank = self.plan.ranks[j].rank;
        let missing: Vec<&str> = (addr.iter().zip(tensors))
            .filter(|(a, _)| a.is_none())
            .map(|(_, t)| t.name.as_str())
            .filter(|n| !bad.iter().any(|b| b.starts_with(&format!("'{n}'"))))
            .collect();
        let mut msgs = Vec::new();
        if !unknown.is_empty() {
            msgs.push(format!(
                "rank {rank} has no tensor named {}",
                quoted(unknown.iter().map(String::as_str))
            ));
        }
        if !missing.is_empty() {
            msgs.push(format!(
                "no destination for rank {rank}'s {}",
                quoted(missing.into_iter())
            ));
        }
        if !bad.is_empty() {
            msgs.push(format!(
                "destinations must be non-zero integer addresses: {}",
                bad.join(", ")
            ));
        }
        if !msgs.is_empty() {
            return Err(PyValueError::new_err(format!(
                "{}; nothing was written",
                msgs.join("; ")
            )));
        }
        Ok((addr.into_iter().zip(tensors))
            .map(|(a, t)| match a.expect("checked above") {
                // Nothing is written to an empty tensor, but a slice is never made from null.
                0 => (std::ptr::NonNull::<u8>::dangling().as_ptr(), 0),
                a => (a as *mut u8, t.bytes as usize),
            })
            .collect())
    }
}

fn quoted<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names
        .map(|n| format!("'{n}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[pymethods]
impl Plan {
    #[getter]
    fn tp(&self) -> u64 {
        self.plan.tp
    }

    #[getter]
    fn pp(&self) -> u64 {
        self.plan.pp
    }

    #[getter]
    fn world_size(&self) -> u64 {
        self.plan.world_size()
    }

    #[getter]
    fn expert_parallel(&self) -> bool {
        self.plan.expert_parallel
    }

    /// The model's dtype as wload spells it ("BF16").
    #[getter]
    fn dtype(&self) -> String {
        self.plan.dtype.to_string()
    }

    #[getter]
    fn architecture(&self) -> String {
        self.plan.architecture.clone()
    }

    /// The resolved folder the tensors are read from.
    #[getter]
    fn root(&self) -> String {
        self.root.display().to_string()
    }

    /// "checkpoint" or "pre-sharded".
    #[getter]
    fn kind(&self) -> &'static str {
        match self.kind {
            InputKind::Checkpoint => "checkpoint",
            InputKind::PreSharded => "pre-sharded",
        }
    }

    /// What `wload load` would warn about (a pre-sharded file's dtype that vLLM converts, ...).
    #[getter]
    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }

    /// Options taken from a pre-sharded folder's wload.json, in a sentence; None otherwise.
    #[getter]
    fn note(&self) -> Option<String> {
        self.note.clone()
    }

    /// Rank `rank`'s tensors, in the plan's order.
    fn tensors(&self, rank: UInt) -> PyResult<Vec<Tensor>> {
        let (_, j) = self.rank_index(rank)?;
        Ok((self.plan.ranks[j].tensors.iter())
            .map(|t| Tensor {
                name: t.name.clone(),
                dtype: t.dtype.to_string(),
                torch_dtype: t.dtype.torch_name(),
                shape: t.shape.clone(),
                nbytes: t.bytes,
            })
            .collect())
    }

    /// Reads rank `rank`'s tensors into `dests` (name → address of a writable, contiguous buffer
    /// of exactly the tensor's nbytes): host memory with device "cpu", memory of GPU
    /// `device_index` with device "cuda" (or "cuda:N"), the copies queued on `stream` (torch's
    /// `current_stream().cuda_stream`; 0 is the legacy default stream) and landed when this
    /// returns. Unsafe like any raw-pointer API: the caller guarantees the sizes and keeps the
    /// buffers alive and untouched until this returns.
    // The text signature gives `stream`'s default as Python sees it (pyo3 would show `...`).
    #[pyo3(
        signature = (rank, dests, device="cpu", device_index=None, stream=UInt(Ok(0)), io="auto"),
        text_signature = "($self, rank, dests, device='cpu', device_index=None, stream=0, io='auto')"
    )]
    #[allow(clippy::too_many_arguments)]
    fn load<'py>(
        &self,
        py: Python<'py>,
        rank: UInt,
        dests: &Bound<'py, PyDict>,
        device: &str,
        device_index: Option<UInt>,
        stream: UInt,
        io: &str,
    ) -> PyResult<LoadReport> {
        let io = choice::<IoMode>(py, "io", io)?;
        let device_index = (device_index.map(|i| i.get(|n| out_of_range("device_index", n))))
            .transpose()?
            .map(|i| usize::try_from(i).unwrap_or(usize::MAX));
        let stream = stream.get(|n| out_of_range("stream", n))?;
        let target = target(device, device_index, stream)?;
        let (rank, j) = self.rank_index(rank)?;
        let dests = self.destinations(j, dests)?;
        let t_all = Instant::now();
        let dests: Vec<(usize, usize)> = dests.into_iter().map(|(p, n)| (p as usize, n)).collect();
        let r = &self.plan.ranks[j];
        let done = fill::fill(py, &self.plan, &self.root, j, dests, io, target)
            .map_err(|e| fill_error(e, rank, target, &r.tensors))?;
        let total_s = t_all.elapsed().as_secs_f64();
        Ok(LoadReport::new(
            rank,
            target,
            (r.tensors.len(), r.bytes),
            total_s,
            &done,
        ))
    }

    fn __repr__(&self) -> String {
        format!(
            "Plan(architecture={:?}, tp={}, pp={}, dtype={:?}, kind={:?}, root={:?})",
            self.plan.architecture,
            self.plan.tp,
            self.plan.pp,
            self.plan.dtype.to_string(),
            self.kind(),
            self.root.display().to_string()
        )
    }
}

/// A failed `Plan.load` as the Python exception it raises, saying whether anything was written.
fn fill_error(
    e: fill::FillError,
    rank: u64,
    target: fill::Target,
    tensors: &[wload::OutTensor],
) -> PyErr {
    match e {
        fill::FillError::Destinations(problems) => PyValueError::new_err(format!(
            "rank {rank}'s destinations cannot be filled on {target}: {}; nothing was read",
            (problems.iter())
                .map(|(i, p)| format!("'{}': {p}", tensors[*i].name))
                .collect::<Vec<_>>()
                .join("; ")
        )),
        fill::FillError::NotStarted(ExecError::Device(DeviceError::NoDriver)) => {
            WloadError::new_err(format!(
                "cannot load rank {rank} onto {target}: no CUDA driver found (libcuda.so could \
                 not be loaded); load into host memory with device=\"cpu\"; nothing was written"
            ))
        }
        fill::FillError::NotStarted(e) => WloadError::new_err(format!(
            "cannot load rank {rank} onto {target}: {e}; nothing was written"
        )),
        fill::FillError::Exec(e) => WloadError::new_err(format!(
            "loading rank {rank} failed, its destinations hold partial data: {e}"
        )),
        fill::FillError::Interrupted(e) => e,
    }
}

/// `device` and `device_index` as a target: "cpu", "cuda" (GPU `device_index`, else 0) or
/// "cuda:N" (`device_index`, if given, must agree), as torch spells devices.
fn target(device: &str, device_index: Option<usize>, stream: u64) -> PyResult<fill::Target> {
    let bad = |why: String| PyValueError::new_err(why);
    let ordinal = match device.split_once(':') {
        None if device == "cpu" => {
            if stream != 0 || device_index.is_some() {
                return Err(bad(
                    "stream and device_index are for device=\"cuda\", not \"cpu\"".into(),
                ));
            }
            return Ok(fill::Target::Host);
        }
        None if device == "cuda" => device_index.unwrap_or(0),
        Some(("cuda", n)) => {
            let n: usize = n
                .parse()
                .map_err(|_| bad(format!("device {device:?}: expected cuda:N")))?;
            if device_index.is_some_and(|i| i != n) {
                return Err(bad(format!(
                    "device {device:?} and device_index={} disagree",
                    device_index.unwrap_or(n)
                )));
            }
            n
        }
        _ => {
            return Err(bad(format!(
                "device {device:?}: expected \"cpu\", \"cuda\" or \"cuda:N\""
            )));
        }
    };
    Ok(fill::Target::Cuda { ordinal, stream })
}

/// `hf_overrides` as a dict or a JSON string, into wload's JSON object.
fn overrides(
    py: Python<'_>,
    v: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<serde_json::Map<String, serde_json::Value>>> {
    let Some(v) = v.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    let text: String = match v.extract::<String>() {
        Ok(s) => s,
        Err(_) => {
            let dumped = (py.import("json")?.call_method1("dumps", (v,)))
                .and_then(|t| t.extract::<String>());
            match dumped {
                Ok(t) => t,
                // What json cannot write (a set, a circular dict, one changed while written)
                // is a bad option; the cause stays attached. KeyboardInterrupt and the like
                // are not Exceptions and go through as they are.
                Err(e) if e.is_instance_of::<pyo3::exceptions::PyException>(py) => {
                    let err = usage(
                        py,
                        format!(
                            "hf_overrides cannot be written as JSON: {e}; give a dict of JSON values or a JSON string"
                        ),
                    );
                    err.set_cause(py, Some(e));
                    return Err(err);
                }
                Err(e) => return Err(e),
            }
        }
    };
    wload::parse_overrides(&text)
        .map(Some)
        .map_err(|e| to_py(py, &Error::Config(e)))
}

/// One of a clap value enum's names, or a usage error listing them.
fn choice<T: clap::ValueEnum>(py: Python<'_>, what: &str, s: &str) -> PyResult<T> {
    T::from_str(s, true).map_err(|_| {
        let names: Vec<String> = T::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value().map(|p| p.get_name().to_string()))
            .collect();
        usage(
            py,
            format!("{what} {s:?}: expected one of {}", names.join(", ")),
        )
    })
}

/// Resolves and plans `source` as `wload load` does: a checkpoint folder or hub repo id is
/// planned for the layout, a pre-sharded folder (wload's or vLLM's) is checked against it and
/// its files copied whole. `tp`, `pp` and `dtype` may be None to take a pre-sharded folder's
/// recorded values.
#[pyfunction]
#[pyo3(signature = (
    source, tp=Some(UInt(Ok(1))), pp=Some(UInt(Ok(1))), expert_parallel=false, dtype=Some("auto"), hf_overrides=None,
    revision=None, download_dir=None, language_model_only=false, mm_encoder_tp_mode="weights",
    pp_partition=None, config_format="auto", moe_backend=None, load_format="auto", mapping=None,
))]
// The defaults as Python sees them (pyo3 shows `...` for `Some(..)`); stubtest checks both agree
// with `_wload.pyi`.
#[pyo3(
    text_signature = "(source, tp=1, pp=1, expert_parallel=False, dtype='auto', \
    hf_overrides=None, revision=None, download_dir=None, language_model_only=False, \
    mm_encoder_tp_mode='weights', pp_partition=None, config_format='auto', moe_backend=None, \
    load_format='auto', mapping=None)"
)]
#[allow(clippy::too_many_arguments)]
fn plan(
    py: Python<'_>,
    source: PathBuf,
    tp: Option<UInt>,
    pp: Option<UInt>,
    expert_parallel: bool,
    dtype: Option<&str>,
    hf_overrides: Option<&Bound<'_, PyAny>>,
    revision: Option<String>,
    download_dir: Option<PathBuf>,
    language_model_only: bool,
    mm_encoder_tp_mode: &str,
    pp_partition: Option<&Bound<'_, PyAny>>,
    config_format: &str,
    moe_backend: Option<&str>,
    load_format: &str,
    mapping: Option<PathBuf>,
) -> PyResult<Plan> {
    let tp = option_uint(py, "tp", tp)?;
    let pp = option_uint(py, "pp", pp)?;
    let pp_partition = (pp_partition.filter(|v| !v.is_none()))
        .map(|v| pp_partition_text(py, v))
        .transpose()?;
    let moe_backend = match moe_backend {
        None => None,
        Some(s) => Some(MoeBackend::parse(s).map_err(|m| usage(py, m))?),
    };
    let hf_overrides = overrides(py, hf_overrides)?;
    let flags = LoadFlags {
        tp,
        pp,
        expert_parallel,
        dtype: dtype
            .map(|d| choice::<DtypeChoice>(py, "dtype", d))
            .transpose()?,
        config_format: choice::<ConfigFormat>(py, "config_format", config_format)?,
        pp_partition,
        mapping,
        moe_backend,
        language_model_only,
        hf_overrides: hf_overrides.clone(),
        mm_encoder_tp_mode: Some(choice::<MmEncoderTpMode>(
            py,
            "mm_encoder_tp_mode",
            mm_encoder_tp_mode,
        )?),
        // VLLM_REPLICATE_EMBED: not a Python argument yet; a folder recorded with it still
        // loads with it (its wload.json), and a checkpoint is planned without it.
        replicate_embed: false,
    };
    // Set by Ctrl-C: a hub download stops at its next read.
    let stop = Arc::new(AtomicBool::new(false));
    let sopts = SourceOptions {
        source,
        load_format: choice(py, "load_format", load_format)?,
        config_format: ConfigFormat::Auto,
        hf_overrides,
        revision: Some(revision.unwrap_or_else(|| "main".into())),
        download_dir,
        download_progress: DownloadProgress::default().stopped_by(stop.clone()),
        side_files: false,
        headers_only: false,
    };
    let planned = interruptible::run(py, stop, move || -> Result<Plan, Error> {
        let p = wload::plan(wload::Request {
            source: sopts,
            flags,
            ranks: wload::Ranks::All,
            headers_only: false,
        })?;
        Ok(Plan {
            root: p.root().to_path_buf(),
            plan: p.plan,
            kind: p.kind,
            warnings: p.warnings,
            note: p.note,
        })
    })?;
    planned.map_err(|e| to_py(py, &e))
}

/// The local folder vLLM reads `source`'s config and tokenizer from: a folder as it is; for an
/// object-store URL (`s3://`, `gs://`, `az://`) or a hub repo id, the cache folder `plan` reads
/// it through, with its config, index and side files (tokenizer, generation config, chat
/// template, ...) fetched into it. Of the weight files only the headers are fetched: the weights
/// stay where they are, for `Plan.load` to read by range. The folder is what vLLM's
/// `--load-format runai_streamer` pulls with the Run:ai streamer (config/model.py:1204-1248).
#[pyfunction]
#[pyo3(signature = (source, revision=None, download_dir=None, config_format="auto", load_format="auto"))]
fn fetch(
    py: Python<'_>,
    source: PathBuf,
    revision: Option<String>,
    download_dir: Option<PathBuf>,
    config_format: &str,
    load_format: &str,
) -> PyResult<String> {
    let stop = Arc::new(AtomicBool::new(false));
    let sopts = SourceOptions {
        source,
        load_format: choice(py, "load_format", load_format)?,
        config_format: choice::<ConfigFormat>(py, "config_format", config_format)?,
        hf_overrides: None,
        revision: Some(revision.unwrap_or_else(|| "main".into())),
        download_dir,
        download_progress: DownloadProgress::default().stopped_by(stop.clone()),
        side_files: true,
        headers_only: true,
    };
    let opened = interruptible::run(py, stop, move || -> Result<PathBuf, Error> {
        Ok(wload::open(&sopts, wload::Want::Checkpoint)?.resolved.root)
    })?;
    opened
        .map(|root| root.display().to_string())
        .map_err(|e| to_py(py, &e))
}

#[pymodule]
fn _wload(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(fetch, m)?)?;
    m.add_class::<Plan>()?;
    m.add_class::<Tensor>()?;
    m.add_class::<LoadReport>()?;
    m.add("WloadError", m.py().get_type::<WloadError>())?;
    m.add("PlanError", m.py().get_type::<PlanError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
