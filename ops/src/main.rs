//! `sendium`: the SMS gateway binary. See `sendium help`.
#![forbid(unsafe_code)]

/// The gateway allocates and frees many small objects across threads (records, batches,
/// PDUs); glibc's allocator spent close to half the CPU in arena locks and consolidation
/// under load (measured with `perf record`, see docs/benchmarks.md). mimalloc's
/// thread-local free lists remove that.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    sendium_ops::cli::main()
}
