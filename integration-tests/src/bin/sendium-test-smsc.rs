//! `sendium-test-smsc`: the kit's test SMSC as a standalone process (the benchmark's
//! provider). Runs on one core (a single-threaded runtime).
//!
//! ```text
//! sendium-test-smsc [--port 2776] [--id-style hex|hexlower|dec|uuid]
//!                   [--receipt-id-style hex|hexlower|dec|uuid] [--receipt-delay-ms 100]
//!                   [--account SYSTEM_ID:PASSWORD]... [--any-credentials]
//!                   [--fail-suffix DIGITS] [--no-receipt-tlvs] [--no-receipt-text]
//!                   [--record] [--stats-interval-s 5]
//! ```
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sendium_integration_tests::ReceiptState;
use sendium_integration_tests::smsc::{IdStyle, ReceiptRule, SmscAccount, SmscConfig, TestSmsc};

/// mimalloc: the load generator and test SMSC share the cores with the gateway they
/// measure, and with glibc's malloc a fifth of their CPU went to its arenas.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const USAGE: &str = "usage: sendium-test-smsc [--port N] [--id-style hex|hexlower|dec|uuid] \
[--receipt-id-style STYLE] [--receipt-delay-ms MS] [--account ID:PASSWORD]... [--any-credentials] \
[--fail-suffix DIGITS] [--no-receipt-tlvs] [--no-receipt-text] [--record] [--stats-interval-s S]";

fn main() {
    let mut config = SmscConfig {
        port: 2776,
        record: false,
        receipt_delay: Duration::from_millis(100),
        ..SmscConfig::default()
    };
    let mut accounts = Vec::new();
    let mut any = false;
    let mut stats_interval = Duration::from_secs(5);
    let mut args = std::env::args().skip(1);
    let die = |msg: String| -> ! {
        eprintln!("{msg}\n{USAGE}");
        std::process::exit(2)
    };
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().unwrap_or_else(|| die(format!("{name} needs a value")));
        match arg.as_str() {
            "--port" => config.port = value("--port").parse().unwrap_or_else(|_| die("bad --port".into())),
            "--id-style" => {
                config.id_style = IdStyle::parse(&value("--id-style")).unwrap_or_else(|| die("bad --id-style".into()));
            }
            "--receipt-id-style" => {
                config.receipt_id_style = Some(
                    IdStyle::parse(&value("--receipt-id-style"))
                        .unwrap_or_else(|| die("bad --receipt-id-style".into())),
                );
            }
            "--receipt-delay-ms" => {
                let ms: u64 = value("--receipt-delay-ms")
                    .parse()
                    .unwrap_or_else(|_| die("bad --receipt-delay-ms".into()));
                config.receipt_delay = Duration::from_millis(ms);
            }
            "--account" => {
                let v = value("--account");
                let (id, pw) = v
                    .split_once(':')
                    .unwrap_or_else(|| die("--account wants ID:PASSWORD".into()));
                accounts.push(SmscAccount::new(id, pw));
            }
            "--any-credentials" => any = true,
            "--fail-suffix" => {
                let suffix = value("--fail-suffix");
                config
                    .receipt_rules
                    .push(ReceiptRule::dest_suffix(&suffix, ReceiptState::Undeliverable, "001"));
            }
            "--no-receipt-tlvs" => config.receipt_tlvs = false,
            "--no-receipt-text" => config.receipt_text = false,
            "--record" => config.record = true,
            "--stats-interval-s" => {
                let s: u64 = value("--stats-interval-s")
                    .parse()
                    .unwrap_or_else(|_| die("bad --stats-interval-s".into()));
                stats_interval = Duration::from_secs(s.max(1));
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            other => die(format!("unknown argument {other}")),
        }
    }
    if any {
        config.accounts.clear();
    } else if !accounts.is_empty() {
        config.accounts = accounts;
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let smsc = TestSmsc::start(config).await;
        println!("test SMSC listening on {}", smsc.addr());
        let mut last = smsc.stats();
        let mut ticker = tokio::time::interval(stats_interval);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = ticker.tick() => {
                    let now = smsc.stats();
                    let rate = (now.submits - last.submits) as f64 / stats_interval.as_secs_f64();
                    println!(
                        "conns {} submits {} ({rate:.0}/s) accepted {} throttled {} rejected {} receipts sent {} acked {} held {}",
                        now.connections, now.submits, now.accepted, now.throttled, now.rejected,
                        now.receipts_sent, now.receipts_acked, now.receipts_held
                    );
                    last = now;
                }
            }
        }
        println!("final: {:?}", smsc.stats());
        smsc.shutdown().await;
    });
}
