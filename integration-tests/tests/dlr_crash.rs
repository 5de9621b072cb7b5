//! The SMS-to-DLR handoff across a SIGKILL, with a durable DLR store (file and
//! postgresql) behind file/file/file outbound stages.
//!
//! The gateway is killed at each named failpoint around the handoff while messages
//! (every tenth a 3-part multipart, each part asking for a receipt) flow and receipts
//! come back, then restarted on the same data directory and database. What must hold,
//! whatever the interruption point:
//!
//! * every acknowledged `submit_sm` gets its receipt, carrying its own id — a restart
//!   between provider submit and handoff resubmits the message (at least once) and the
//!   repeated handoff is idempotent; a restart after the handoff but before the source
//!   completed hands off again without a second receipt;
//! * a provider receipt acknowledged with `deliver_sm_resp` is stored first: a kill right
//!   after the acknowledgement (`after-receipts-acked`; the test SMSC resends only what
//!   was not acknowledged) loses none of them;
//! * after the restart, a receipt arrives twice only if it had already reached the ESME
//!   before the kill (a delivery whose result was not yet recorded is sent again: at
//!   least once downstream); a message never resolves twice.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{HashMap, HashSet};
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use sendium_integration_tests::{
    Alphabet, BindKind, Concat, DlrParts, GatewayProcess, SmscConfig, SubmitSpec, TestEsme, TestSmsc,
};
use sendium_storage::postgresql::test_cluster::TestCluster;
use support::*;

/// A kill can land between the parts of a multipart message: the ESME's connection goes
/// and the group never completes. Its acknowledged parts still get their (failure)
/// receipts when the group expires, soon here.
fn config(dlr: &str) -> String {
    format!(
        "[sms]\nmultipart-expiry = \"3s\"\n[sms.pending]\nbackend = \"file\"\n[sms.router-queue]\nbackend = \"file\"\n[sms.routed-work]\nbackend = \"file\"\n\
         [storage.file]\ndir = \"{{data_dir}}\"\n{dlr}\n{}",
        memory_config()
    )
}

/// PostgreSQL is shared by several processes, so a restarted gateway cannot release
/// the claims its predecessor held: they come back after `claim-lease`, kept short here.
fn dlr_pg() -> String {
    let url = TestCluster::shared().fresh_database();
    format!(
        "[dlr]\nbackend = \"postgresql\"\nclaim-lease = \"6s\"\ncallback-timeout = \"2s\"\n[storage.postgresql]\nurl = \"{url}\""
    )
}

/// Messages per round; rounds go on until the failpoint killed the gateway (the points
/// are hit once per batch, and how many messages a batch holds depends on the machine's
/// load, so the cap leaves room: a quiet machine dies in 8–25 rounds).
const ROUND: usize = 100;
const MAX_ROUNDS: usize = 80;

fn specs(round: usize) -> Vec<SubmitSpec> {
    let mut specs = Vec::new();
    for i in round * ROUND..(round + 1) * ROUND {
        let dest = format!("4471{i:05}");
        if i % 10 == 9 {
            specs.extend(SubmitSpec::multipart(
                "1",
                &dest,
                Alphabet::Gsm7,
                &format!("handoff crash {i} ").repeat(20),
                Concat::Udh8((i % 256) as u8),
                DlrParts::Every,
            ));
        } else {
            specs.push(SubmitSpec::gsm("1", &dest, &format!("handoff crash {i}")).dlr());
        }
    }
    specs
}

fn receipt_counts(esme: &TestEsme) -> HashMap<String, usize> {
    let mut c = HashMap::new();
    for r in esme.receipts() {
        if let Some(id) = r.message_id() {
            *c.entry(id.to_owned()).or_insert(0) += 1;
        }
    }
    c
}

async fn killed_at(dlr: &str, failpoint: &str) {
    let smsc = TestSmsc::start(SmscConfig {
        receipt_delay: Duration::from_millis(200),
        ..SmscConfig::default()
    })
    .await;
    let mut gw = GatewayProcess::builder(&config(dlr))
        .smsc_port(smsc.port())
        .env("SENDIUM_FAILPOINT", failpoint)
        .start()
        .await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let mut acked: HashSet<String> = HashSet::new();
    for round in 0..MAX_ROUNDS {
        if gw.try_wait().is_some() {
            break;
        }
        let outcomes = esme.submit_pipelined(&specs(round), 20).await;
        acked.extend(outcomes.iter().filter(|o| o.is_ok()).map(|o| o.message_id.clone()));
    }
    let status = gw.wait_exit(Duration::from_secs(30)).await;
    let log = gw.log();
    assert_eq!(
        status.and_then(|s| s.signal()),
        Some(9),
        "the gateway did not die at {failpoint} (status {status:?})\n{log}"
    );
    assert!(log.contains("FAILPOINT"), "{failpoint} never fired");
    assert!(!acked.is_empty(), "something was acknowledged before {failpoint}");
    // What reached the ESME before the kill (the connection is gone now).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = receipt_counts(&esme);
    drop(esme);

    gw.restart().await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let after = receipt_counts(&esme);
        let missing = acked
            .iter()
            .filter(|id| !before.contains_key(*id) && !after.contains_key(*id))
            .count();
        if missing == 0 {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "{failpoint}: {missing} of {} acknowledged submissions never got a receipt\n{}\n{}",
                acked.len(),
                dlr_metrics(&gw).await,
                gw.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let late duplicates arrive, if any would.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = receipt_counts(&esme);
    // An id the ESME never saw acknowledged may get a receipt too: its submission was
    // stored before the kill took its submit_sm_resp (stored means delivered).
    for (id, n) in &after {
        assert!(
            *n == 1,
            "{failpoint}: {n} receipts for one submission after the restart"
        );
        if let Some(b) = before.get(id) {
            assert_eq!(*b, 1, "{failpoint}: {b} receipts for one submission before the kill");
        }
    }
    for (id, n) in &before {
        assert_eq!(*n, 1, "{failpoint}: {n} receipts for {id} before the kill");
    }
    assert!(
        wait_metric(&gw, "sendium_stage_records", "stage=\"pending\"", |v| v == 0.0).await,
        "{failpoint}: sources left behind"
    );
    if !wait_metric(&gw, "sendium_dlr_pending_receipts", "", |v| v == 0.0).await {
        panic!("{failpoint}: receipts left undelivered\n{}", dlr_metrics(&gw).await);
    }
}

/// Each fires on a hit well into the load (points are hit once per batch, not per
/// message), after the first receipts came back.
const FAILPOINTS: [&str; 5] = [
    "after-provider-submit@60",
    "after-dlr-handoff@20",
    "after-receipts-acked@30",
    "before-branch-completion@30",
    "before-source-completion@30",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_dlr_handoff_survives_a_kill_at_every_point() {
    for fp in FAILPOINTS {
        killed_at(DLR_FILE, fp).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql_dlr_handoff_survives_a_kill_at_every_point() {
    for fp in FAILPOINTS {
        killed_at(&dlr_pg(), fp).await;
    }
}
