//! Timers for the stage reports: wall time with at least one operation in progress, GB/s and
//! overlap from it, and thread-summed nanoseconds ([`add_since`]); one home, so that every stage
//! measures alike.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Wall time during which at least one operation of a kind was in progress, summed over threads
/// that overlap; with bytes, a throughput that means what it says.
#[derive(Debug, Default)]
pub struct Busy {
    state: Mutex<BusyState>,
    pub bytes: AtomicU64,
}

#[derive(Debug, Default)]
struct BusyState {
    active: u32,
    since: Option<Instant>,
    total: Duration,
}

impl Busy {
    /// Runs `f` as one operation moving `bytes`.
    pub(crate) fn time<T>(&self, bytes: u64, f: impl FnOnce() -> T) -> T {
        self.enter();
        let r = f();
        self.leave(bytes);
        r
    }

    fn enter(&self) {
        let now = Instant::now();
        let mut s = self.state.lock().expect("no panics under the busy lock");
        if s.active == 0 {
            s.since = Some(now);
        }
        s.active += 1;
    }

    fn leave(&self, bytes: u64) {
        let now = Instant::now();
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        let mut s = self.state.lock().expect("no panics under the busy lock");
        s.active -= 1;
        if s.active == 0
            && let Some(since) = s.since.take()
        {
            s.total += now - since;
        }
    }

    /// Seconds with at least one operation in progress.
    pub fn busy_s(&self) -> f64 {
        self.state
            .lock()
            .expect("no panics under the busy lock")
            .total
            .as_secs_f64()
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// Bytes per second over `secs`, in GB/s (0 when nothing was timed).
pub(crate) fn gbps(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 / secs / 1e9
    } else {
        0.0
    }
}

/// How much of the shorter of two stages ran while the other did, from their busy times and
/// the wall time they shared: 1 is fully hidden, 0 is one after the other.
pub(crate) fn overlap(a_s: f64, b_s: f64, wall_s: f64) -> f64 {
    let shorter = a_s.min(b_s);
    if shorter <= 0.0 {
        return 0.0;
    }
    ((a_s + b_s - wall_s) / shorter).clamp(0.0, 1.0)
}

pub(super) fn add_since(v: &AtomicU64, t: Instant) {
    v.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_is_bounded() {
        assert_eq!(overlap(1.0, 1.0, 1.0), 1.0);
        assert_eq!(overlap(1.0, 1.0, 2.0), 0.0);
        assert!((overlap(1.0, 0.5, 1.25) - 0.5).abs() < 1e-9);
        assert_eq!(overlap(0.0, 1.0, 1.0), 0.0);
    }
}
