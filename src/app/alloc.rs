//! The allocator's settings for the commands that only read headers and plan: one process-wide
//! choice, made once at start, with the measurements that justify it.

/// Lets glibc reuse freed memory instead of returning it to the kernel. By default it maps each
/// allocation above 128 KiB on its own and unmaps it on free, so every large table the header
/// and plan stages build and drop is faulted in again, page by page, by the next one (a
/// DeepSeek-V3 `plan` took 18,000 page faults; on a VM each costs 2–3 µs). Allocations under
/// 32 MiB then come from the heap, which keeps up to 512 MiB freed before trimming: `plan` takes
/// a fifth fewer faults. Only for the commands that read headers and plan: under `shard` it
/// raised peak RSS from 49 to 61 MiB in one run of three (buffers kept by one thread's arena
/// while another's grew), and `shard` and `load` promise bounded memory.
pub(crate) fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets the allocator's parameters; it runs before any other thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
    }
}
