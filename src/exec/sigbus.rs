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
//!
//! The handler is installed while any mapping is watched, not once for the process: a host
//! process may set its own SIGBUS handler after wload's (Python's `faulthandler.enable()`, which
//! vLLM's watchdog and torch elastic call), and a handler set once would then be lost for every
//! later load. So each new watch installs it again if it is not the current one, keeping the action
//! it replaced, the last watch to end puts that action back, and a SIGBUS outside the watched mappings is
//! handed to it.

use std::cell::UnsafeCell;
use std::sync::Mutex;
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

/// Watches alive, under the lock that installs and restores the handler.
static ACTIVE: Mutex<usize> = Mutex::new(0);

/// The SIGBUS action wload's handler replaced, for faults that are not in a watched mapping.
/// Two copies: `install` (under `ACTIVE`'s lock) writes the one not in use and then publishes it
/// in `PREVIOUS_AT`, so that the handler, which may run on another thread meanwhile (a load
/// already under way when the host replaced wload's handler), never reads a half-written one.
struct Previous([UnsafeCell<std::mem::MaybeUninit<libc::sigaction>>; 2]);
// SAFETY: see `Previous`: one writer at a time, under a lock, and never into the copy published.
unsafe impl Sync for Previous {}
static PREVIOUS: Previous = Previous([
    UnsafeCell::new(std::mem::MaybeUninit::uninit()),
    UnsafeCell::new(std::mem::MaybeUninit::uninit()),
]);
/// Which copy of `PREVIOUS` holds the action; `NONE_KEPT` until one was kept.
static PREVIOUS_AT: AtomicUsize = AtomicUsize::new(NONE_KEPT);
const NONE_KEPT: usize = usize::MAX;

/// The kept action, if any.
fn previous() -> Option<*const libc::sigaction> {
    match PREVIOUS_AT.load(Ordering::Acquire) {
        NONE_KEPT => None,
        i => Some(PREVIOUS.0[i].get().cast_const().cast()),
    }
}

/// A mapping watched for vanished pages while it lives.
#[derive(Debug)]
pub(super) struct Watch {
    slot: usize,
}

impl Watch {
    /// Watches `[start, start + len)`; `None` when the handler could not be installed or the
    /// table is full (the caller then does not map the file).
    pub(super) fn new(start: *const u8, len: usize) -> Option<Watch> {
        if len == 0 {
            return None;
        }
        let mut active = ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
        // Checked at every new mapping, not only the first of a load: the host may have set its
        // handler while another load (another thread's) was under way.
        if !install() {
            if *active == 0 {
                restore();
            }
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
                *active += 1;
                return Some(Watch { slot: i });
            }
        }
        if *active == 0 {
            restore();
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
        let mut active = ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
        *active -= 1;
        if *active == 0 {
            restore();
        }
    }
}

/// Installs wload's handler (again, if the host replaced it), keeping the action it replaces;
/// false when it could not be set. Called under `ACTIVE`'s lock.
fn install() -> bool {
    // SAFETY: a zeroed sigaction is a valid start; the handler is async-signal-safe (atomics,
    // mmap, sigaction only). The kept action is written into the copy not published (see
    // `Previous`), under the lock.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        // Swapped in one call, so that an action the host sets meanwhile is not lost between a
        // look and a set.
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, &sa, &mut old) != 0 {
            return false;
        }
        if old.sa_sigaction != handler as *const () as usize {
            let next = match PREVIOUS_AT.load(Ordering::Acquire) {
                0 => 1,
                _ => 0,
            };
            (*PREVIOUS.0[next].get()).write(old);
            PREVIOUS_AT.store(next, Ordering::Release);
        }
        true
    }
}

/// Puts back the action wload's handler replaced, unless something replaced wload's own since
/// (that one is left alone). Called under `ACTIVE`'s lock with no watch alive.
fn restore() {
    let Some(previous) = previous() else { return };
    // SAFETY: the kept action was written whole before it was published; sigaction with valid
    // pointers has no other precondition.
    unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut cur) == 0
            && cur.sa_sigaction == handler as *const () as usize
        {
            libc::sigaction(libc::SIGBUS, previous, std::ptr::null_mut());
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
    // Not ours, or the page could not be replaced: the action wload's replaced (faulthandler's
    // traceback, the default's core dump), as if wload's were not installed. The fault repeats
    // when this returns and meets that action.
    // SAFETY: sigaction and signal are async-signal-safe; the kept action was written whole
    // before it was published and its copy is not written again until another is published.
    unsafe {
        match previous() {
            Some(previous) => {
                libc::sigaction(libc::SIGBUS, previous, std::ptr::null_mut());
            }
            None => {
                libc::signal(libc::SIGBUS, libc::SIG_DFL);
            }
        }
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
    /// The tests set the process's SIGBUS action: one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn a_truncated_mapped_file_reads_zeros_and_is_reported() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
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

    /// A host process's handler that ends the process as faulthandler's does (after its
    /// traceback): the test binary dies with 135 if wload's guard is not the one called.
    extern "C" fn other_handler(_sig: libc::c_int) {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(135) }
    }

    fn current_action() -> usize {
        // SAFETY: reading the action with valid pointers.
        unsafe {
            let mut cur: libc::sigaction = std::mem::zeroed();
            assert_eq!(libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut cur), 0);
            cur.sa_sigaction
        }
    }

    /// A handler the host process sets after wload's (Python's faulthandler) does not make the
    /// next load's truncated mapping fatal, and is the action again once the load is over.
    #[test]
    fn a_handler_set_after_wloads_does_not_unguard_later_maps() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::TempDir::new().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![7u8; 64 << 10]).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        // SAFETY: the test owns the file; shrinking it under the map is the point.
        let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        drop(Watch::new(map.as_ptr(), map.len()).expect("a slot"));
        // SAFETY: setting a handler of the host's, as faulthandler.enable() sets its own.
        unsafe { libc::signal(libc::SIGBUS, other_handler as *const () as usize) };
        let watch = Watch::new(map.as_ptr(), map.len()).expect("a slot");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(4096)
            .unwrap();
        assert_eq!(map[48 << 10], 0, "the vanished page reads as zeros");
        assert!(watch.lost_pages());
        drop(watch);
        // Other tests of this process may hold watches; with none alive (checked under the lock
        // that restores), the host's handler is back.
        if *ACTIVE.lock().unwrap_or_else(|e| e.into_inner()) == 0 {
            assert_eq!(current_action(), other_handler as *const () as usize);
        }
        // SAFETY: back to the default for the rest of the test process.
        unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
        drop(map);
    }
}
