//! `sendium-loadgen`: load generator for an SMPP server (Sendium's, or the test SMSC).
//!
//! ```text
//! sendium-loadgen --addr 127.0.0.1:2775 [--system-id esme1] [--password secret]
//!                 [--sessions 4] [--count 10000] [--window 100] [--rate MSG_PER_S]
//!                 [--mix gsm=8,ucs2=1,multipart=1] [--no-receipts]
//!                 [--receipt-timeout-s 30] [--resp-timeout-s 30]
//!                 [--source 12345] [--dest-prefix 4477] [--threads N] [--json]
//! ```
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sendium_integration_tests::loadgen::{self, LoadConfig, Mix};

/// mimalloc: the load generator and test SMSC share the cores with the gateway they
/// measure, and with glibc's malloc a fifth of their CPU went to its arenas.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const USAGE: &str = "usage: sendium-loadgen --addr HOST:PORT [--system-id ID] [--password PW] [--sessions N] \
[--count N] [--window N] [--rate MSG_PER_S] [--mix gsm=8,ucs2=1,multipart=1] [--no-receipts] \
[--receipt-timeout-s S] [--resp-timeout-s S] [--source ADDR] [--dest-prefix DIGITS] [--threads N] [--json]";

fn main() {
    let mut config = LoadConfig::default();
    let mut threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    let mut json = false;
    let mut args = std::env::args().skip(1);
    let die = |msg: String| -> ! {
        eprintln!("{msg}\n{USAGE}");
        std::process::exit(2)
    };
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().unwrap_or_else(|| die(format!("{name} needs a value")));
        match arg.as_str() {
            "--addr" => config.addr = value("--addr").parse().unwrap_or_else(|_| die("bad --addr".into())),
            "--system-id" => config.system_id = value("--system-id"),
            "--password" => config.password = value("--password"),
            "--sessions" => {
                config.sessions = value("--sessions")
                    .parse()
                    .unwrap_or_else(|_| die("bad --sessions".into()))
            }
            "--count" => config.count = value("--count").parse().unwrap_or_else(|_| die("bad --count".into())),
            "--window" => config.window = value("--window").parse().unwrap_or_else(|_| die("bad --window".into())),
            "--rate" => config.rate = Some(value("--rate").parse().unwrap_or_else(|_| die("bad --rate".into()))),
            "--mix" => config.mix = Mix::parse(&value("--mix")).unwrap_or_else(|e| die(e)),
            "--no-receipts" => config.receipts = false,
            "--receipt-timeout-s" => {
                let s: u64 = value("--receipt-timeout-s")
                    .parse()
                    .unwrap_or_else(|_| die("bad --receipt-timeout-s".into()));
                config.receipt_timeout = Duration::from_secs(s);
            }
            "--resp-timeout-s" => {
                let s: u64 = value("--resp-timeout-s")
                    .parse()
                    .unwrap_or_else(|_| die("bad --resp-timeout-s".into()));
                config.resp_timeout = Duration::from_secs(s);
            }
            "--source" => config.source = value("--source"),
            "--dest-prefix" => config.dest_prefix = value("--dest-prefix"),
            "--threads" => {
                threads = value("--threads")
                    .parse()
                    .unwrap_or_else(|_| die("bad --threads".into()))
            }
            "--json" => json = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            other => die(format!("unknown argument {other}")),
        }
    }
    match loadgen::run_blocking(config, threads) {
        Ok(report) => {
            if json {
                println!("{}", report.to_json());
            } else {
                print!("{report}");
            }
            if !report.session_errors.is_empty() {
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    }
}
