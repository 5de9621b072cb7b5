//! A real power cut under load, on LazyFS: a FUSE file system that keeps every write in
//! its own page cache until the writer syncs it, and drops what is not synced when told
//! (`lazyfs::clear-cache` on its fault FIFO) — the disk after a power loss.
//!
//! The gateway runs file/file/file with the file DLR store on a data directory inside
//! the LazyFS mount while an ESME streams messages with receipts. Then the power goes:
//! the process is SIGKILLed and LazyFS drops every unsynced byte at once. After a
//! restart every acknowledged message must reach the SMSC and every receipt the ESME.
//!
//! LazyFS is not part of the repository or of CI (it is built from its source; see
//! `docs/power-loss.md`). Ignored: run with a mount and its FIFO,
//! `SENDIUM_LAZYFS_MOUNT=/tmp/lfs.mnt SENDIUM_LAZYFS_FIFO=/tmp/lfs.fifo cargo test -p
//! sendium-integration-tests --test power_cut -- --ignored --nocapture`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sendium_integration_tests::{BindKind, GatewayProcess, TestEsme};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a LazyFS mount: SENDIUM_LAZYFS_MOUNT and SENDIUM_LAZYFS_FIFO"]
async fn a_power_cut_under_load_on_lazyfs_loses_no_acknowledged_message() {
    let mount = std::env::var("SENDIUM_LAZYFS_MOUNT").expect("SENDIUM_LAZYFS_MOUNT: the LazyFS mount point");
    let fifo = std::env::var("SENDIUM_LAZYFS_FIFO").expect("SENDIUM_LAZYFS_FIFO: LazyFS's fault FIFO");
    let spool = format!("{mount}/sendium-{}", std::process::id());
    let config = durable_config_with(DLR_FILE, &memory_config()).replace("{data_dir}", &spool);
    let smsc = smsc().await;
    let mut gw = GatewayProcess::builder(&config).smsc_port(smsc.port()).start().await;
    let (stop, streaming) = bind_and_stream(&gw, "4479").await;
    assert!(smsc.wait_messages(3_000, WAIT).await, "traffic flows on LazyFS");

    // The power goes: the process dies and the disk keeps only what was synced.
    gw.kill();
    let mut f = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    f.write_all(b"lazyfs::clear-cache\n").unwrap();
    drop(f);
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let (before, acked) = streaming.await.unwrap();
    let receipts_before = before.receipts();
    drop(before);
    let delivered_before = smsc.messages().len();

    gw.restart().await;
    let after = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let ids: HashSet<String> = acked.values().cloned().collect();
    let all_delivered = eventually(WAIT, || {
        let sent: HashSet<String> = smsc.messages().into_iter().map(|m| m.destination).collect();
        acked.keys().all(|d| sent.contains(d))
    })
    .await;
    let missing: Vec<&String> = {
        let sent: HashSet<String> = smsc.messages().into_iter().map(|m| m.destination).collect();
        acked.keys().filter(|d| !sent.contains(*d)).take(5).collect()
    };
    assert!(all_delivered, "acknowledged messages never delivered, e.g. {missing:?}");
    let got_receipt = |receipts: &[sendium_integration_tests::Receipt]| -> HashSet<String> {
        receipts
            .iter()
            .filter_map(|r| r.message_id().map(str::to_string))
            .collect()
    };
    let owed: HashSet<String> = ids.difference(&got_receipt(&receipts_before)).cloned().collect();
    let receipts_after = after.wait_receipts(owed.len(), WAIT).await;
    let after_ids = got_receipt(&receipts_after);
    let lost: Vec<&String> = owed.iter().filter(|id| !after_ids.contains(*id)).take(5).collect();
    assert!(
        lost.is_empty(),
        "receipts owed across the power cut never came, e.g. {lost:?}"
    );
    let mut per_destination: HashMap<String, usize> = HashMap::new();
    for m in smsc.messages() {
        *per_destination.entry(m.destination).or_default() += 1;
    }
    println!(
        "power cut on LazyFS: {} acknowledged, {} delivered before the cut, {} after; {} sent twice; \
         receipts {} before, {} after",
        acked.len(),
        delivered_before,
        smsc.messages().len() - delivered_before,
        per_destination.values().filter(|n| **n > 1).count(),
        receipts_before.len(),
        receipts_after.len()
    );
}
