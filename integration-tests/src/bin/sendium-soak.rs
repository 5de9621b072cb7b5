//! `sendium-soak`: the release gateway for a long run under mixed SMPP and HTTP traffic,
//! provider faults and SIGKILLs, then a reckoning of every acknowledged message and
//! receipt, and of the gateway's memory and descriptors. See `docs/soak.md`.
//!
//! ```text
//! cargo build --release -p sendium-ops -p sendium-integration-tests
//! ./target/release/sendium-soak --minutes 30 --kill-every 3m
//! ```
#![forbid(unsafe_code)]

use sendium_integration_tests::soak::{self, SoakOptions, USAGE};

/// mimalloc: the load generator and test SMSC share the cores with the gateway they
/// measure, and with glibc's malloc a fifth of their CPU went to its arenas.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let options = match SoakOptions::parse(std::env::args().skip(1)) {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{USAGE}");
            return;
        }
        Err(e) => {
            eprintln!("{e}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start the tokio runtime: {e}");
            std::process::exit(2);
        }
    };
    match runtime.block_on(soak::run(options)) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("sendium-soak could not run: {e}");
            std::process::exit(2);
        }
    }
}
