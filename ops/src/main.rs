//! `sendium`: the SMS gateway binary. See `sendium help`.
#![forbid(unsafe_code)]

/// The gateway allocates and frees many small objects across threads (records, batches,
/// PDUs); glibc's allocator spent close to half the CPU in arena locks and consolidation
/// under load (measured with `perf record`, see docs/benchmarks.md). mimalloc's
/// thread-local free lists remove that.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    no_transparent_huge_pages();
    sendium_ops::cli::main()
}

/// Turns transparent huge pages off for this process (`PR_SET_THP_DISABLE`), unless
/// `MIMALLOC_ALLOW_THP` is set, which then decides as mimalloc documents it.
///
/// The heap grows and shrinks with the pending backlog: mimalloc gives memory it no
/// longer uses back to the kernel and takes it again when the backlog grows. With huge
/// pages on (the `always` of many distributions) the first touch of such memory faults
/// in and zeroes a whole 2 MiB page, however little of it is needed: an eighth of the
/// gateway's CPU in the memory profile's benchmark went to `clear_page`. Without them
/// paired runs of that benchmark took 10% less CPU per message at the median and 8–29%
/// less peak RSS (docs/benchmarks.md).
fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // Kernels before 3.15 lack the flag: the process then keeps the machine's setting.
        let _ = rustix::thread::disable_transparent_huge_pages(true);
    }
}
