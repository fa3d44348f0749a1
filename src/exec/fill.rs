//! One engine run into memory, for every loader: the devices `wload load` opens, and the
//! caller-owned host or GPU memory the Python package fills. Which destination, how its
//! placements are laid out and when the copies have landed are decided here once.

use std::path::Path;
use std::time::Instant;

use super::device::Device;
use super::host_ptr::HostPtrSink;
use super::load::LoadSink;
use super::{Control, ExecError, Placement, Sink, Stats};
use crate::plan::Plan;

/// Where the ranks' tensors go.
pub enum Destinations<'a> {
    /// A device per rank, in the order of the ranks given: a rank's tensors are its buffers
    /// `0..n`, allocated by the caller (`wload load`'s own, or a GPU borrowing the caller's).
    Devices(&'a [Box<dyn Device>]),
    /// Caller-owned host memory, one buffer per tensor of the ranks given, in order.
    Host(&'a HostPtrSink),
}

/// What a fill took.
#[derive(Debug)]
pub struct Filled {
    /// The engine's seconds, reads to the last copy queued.
    pub transfer_s: f64,
    /// Waiting for the devices' last copies to land (0 for host memory).
    pub sync_s: f64,
    /// Seconds each device's calls took, in the order of the ranks (empty for host memory).
    pub device_s: Vec<f64>,
}

/// Fills `ranks` (indexes into `plan.ranks`) of `plan`, read from `root`, into `dests`, with
/// `ctl`'s options, cancel flag and progress; its stats are `ctl.stats`. With devices, returns
/// once every copy has landed.
pub fn fill(
    plan: &Plan,
    root: &Path,
    ranks: &[usize],
    dests: Destinations,
    ctl: &Control,
) -> Result<Filled, ExecError> {
    let (placements, map) = placements(plan, ranks);
    let t = Instant::now();
    match dests {
        Destinations::Host(sink) => {
            super::execute(plan, root, &placements, sink, ctl)?;
            let transfer_s = t.elapsed().as_secs_f64();
            Ok(Filled {
                transfer_s,
                sync_s: 0.0,
                device_s: Vec::new(),
            })
        }
        Destinations::Devices(devices) => {
            let sink = LoadSink::new(devices, map);
            super::execute(plan, root, &placements, &sink as &dyn Sink, ctl)?;
            let transfer_s = t.elapsed().as_secs_f64();
            let t = Instant::now();
            for d in devices {
                d.synchronize()?;
            }
            Ok(Filled {
                transfer_s,
                sync_s: t.elapsed().as_secs_f64(),
                device_s: sink.copy_ns.iter().map(Stats::secs).collect(),
            })
        }
    }
}

/// Every tensor of `ranks`, in order, as the engine's outputs, and for each output the
/// destination (its rank's position in `ranks`, the tensor's index) a device sink needs.
fn placements(plan: &Plan, ranks: &[usize]) -> (Vec<Placement>, Vec<(usize, usize)>) {
    let mut placements = Vec::new();
    let mut map = Vec::new();
    for (d, &j) in ranks.iter().enumerate() {
        for tensor in 0..plan.ranks[j].tensors.len() {
            placements.push(Placement {
                rank: j,
                tensor,
                out: map.len(),
                offset: 0,
            });
            map.push((d, tensor));
        }
    }
    (placements, map)
}
