//! Mapped source files that shrink while they are read (`--io mmap`): reading a page past the new
//! end of a mapped file raises SIGBUS, which would kill the process without a word. A handler
//! installed with the first mapping puts a zero page where the vanished one was and marks the
//! mapping; the read goes on, and the engine, which checks every source after reading it
//! (`exec::check_sources`), refuses the run naming the file. So a truncated file ends in an error
//! message and a clean exit, never a signal, and its zeros are never published.
//!
//! Why not a crate: none handles SIGBUS for file maps (memmap2 leaves it to the caller), and the
//! handler must know which addresses are ours: it acts only inside a registered mapping, and
//! gives any other SIGBUS its default action (a real fault is not hidden).
//!
//! The registry is a fixed table of atomics, because a signal handler may not lock or allocate;
//! a file that finds the table full is read with `pread` instead of being mapped.

use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Mappings watched at once; more files than this are read without a map.
const SLOTS: usize = 4096;

struct Slot {
    /// Mapping start address; 0: free.
    start: AtomicUsize,
    /// One past the end; set before `start` is published.
    end: AtomicUsize,
    /// A page of it vanished and was replaced by zeros.
    lost: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    lost: AtomicBool::new(false),
};
static TABLE: [Slot; SLOTS] = [FREE; SLOTS];
static INSTALL: Once = Once::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// A mapping watched for vanished pages while it lives.
#[derive(Debug)]
pub(super) struct Watch {
    slot: usize,
}

impl Watch {
    /// Watches `[start, start + len)`; `None` when the handler could not be installed or the
    /// table is full (the caller then does not map the file).
    pub(super) fn new(start: *const u8, len: usize) -> Option<Watch> {
        INSTALL.call_once(install);
        if !INSTALLED.load(Ordering::Acquire) || len == 0 {
            return None;
        }
        let start = start as usize;
        for (i, s) in TABLE.iter().enumerate() {
            if s.start.load(Ordering::Relaxed) != 0 {
                continue;
            }
            // Claimed by the end first (a free slot has end 0), then published by the start.
            if s.end
                .compare_exchange(0, start + len, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                s.lost.store(false, Ordering::Relaxed);
                s.start.store(start, Ordering::Release);
                return Some(Watch { slot: i });
            }
        }
        None
    }

    /// Whether a page of the mapping vanished (the file shrank under it) and reads gave zeros.
    pub(super) fn lost_pages(&self) -> bool {
        TABLE[self.slot].lost.load(Ordering::Acquire)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let s = &TABLE[self.slot];
        s.start.store(0, Ordering::Release);
        s.end.store(0, Ordering::Release);
    }
}

fn install() {
    // SAFETY: a zeroed sigaction is a valid start; the handler is async-signal-safe (atomics,
    // mmap, sigaction only) and the previous action is not needed (wload sets no other SIGBUS
    // handler).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) == 0 {
            INSTALLED.store(true, Ordering::Release);
        }
    }
}

extern "C" fn handler(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in TABLE.iter() {
        let start = s.start.load(Ordering::Acquire);
        if start != 0 && addr >= start && addr < s.end.load(Ordering::Acquire) {
            let page = page_size();
            let at = addr & !(page - 1);
            // SAFETY: the page lies inside a mapping this process made and still holds; a
            // private anonymous page replaces the file page that no longer exists, so the
            // faulting read is retried on zeros. The mapping's owner unmaps the whole range.
            let p = unsafe {
                libc::mmap(
                    at as *mut libc::c_void,
                    page,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                s.lost.store(true, Ordering::Release);
                return;
            }
            break;
        }
    }
    // Not ours, or the page could not be replaced: the default action, as if no handler were
    // installed (the fault repeats when the handler returns).
    // SAFETY: resetting a signal's action is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 { n as usize } else { 4096 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mapped file cut short under its map reads zeros where its pages were, and the watch
    /// says so, instead of the process dying of SIGBUS.
    #[test]
    fn a_truncated_mapped_file_reads_zeros_and_is_reported() {
        let dir = tempfile::TempDir::new().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![7u8; 64 << 10]).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        // SAFETY: the test owns the file; shrinking it under the map is the point.
        let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        let watch = Watch::new(map.as_ptr(), map.len()).expect("a slot");
        assert!(!watch.lost_pages());
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(4096)
            .unwrap();
        let tail: Vec<u8> = map[32 << 10..(32 << 10) + 16].to_vec();
        assert_eq!(tail, vec![0u8; 16]);
        assert_eq!(map[0], 7, "the page still in the file reads as before");
        assert!(watch.lost_pages());
        drop(watch);
        drop(map);
    }
}
