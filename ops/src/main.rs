//! `sendium`: the SMS gateway binary. See `sendium help`.
#![forbid(unsafe_code)]

/// The gateway allocates many small objects on one thread and frees them on another
/// (records, batches, PDUs pass from actor to actor). glibc's allocator spent close to
/// half the CPU in arena locks and consolidation under load. With mimalloc a fifth of
/// the CPU went to its allocator, most of it cache misses on blocks freed by the other
/// thread; jemalloc, which keeps a block freed on a thread in that thread's cache, took
/// 11% less CPU per message on memory and 19% less on file + dlr file (alternating
/// benchmark runs, docs/benchmarks.md). It is built with its background thread on (the
/// workspace's `background_threads` feature): that thread, not the next allocation,
/// returns freed memory to the kernel, so RSS falls after a backlog drains even when no
/// traffic follows.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    no_transparent_huge_pages();
    sendium_ops::cli::main()
}

/// Turns transparent huge pages off for this process (`PR_SET_THP_DISABLE`), unless
/// `SENDIUM_ALLOW_THP` is set.
///
/// The heap grows and shrinks with the pending backlog: the allocator gives memory it no
/// longer uses back to the kernel and takes it again when the backlog grows. With huge
/// pages on (the `always` of many distributions) such memory comes back as whole 2 MiB
/// pages, however little of each is used: in alternating benchmark runs the peak RSS of
/// file + dlr file was 257–375 MiB with them against 216–265 without, and CPU per message
/// the same within the noise (docs/benchmarks.md).
fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("SENDIUM_ALLOW_THP").is_none() {
        // Kernels before 3.15 lack the flag: the process then keeps the machine's setting.
        let _ = rustix::thread::disable_transparent_huge_pages(true);
    }
}
