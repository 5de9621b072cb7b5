//! An upstream SMSC that throttles, rejects, drops its connection and stops answering:
//! transient failures are retried until delivered, permanent ones end in a failure
//! receipt, and no acknowledged message is lost.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashSet;
use std::time::Duration;

use sendium_integration_tests::{BindKind, CommandStatus, ReceiptState, SubmitSpec, TestEsme, TestSmsc};
use support::*;

fn load(n: usize, prefix: &str) -> Vec<SubmitSpec> {
    (0..n)
        .map(|i| SubmitSpec::gsm("1", &format!("{prefix}{i:06}"), &format!("fault test {i}")).dlr())
        .collect()
}

async fn submit_all_ok(esme: &TestEsme, specs: &[SubmitSpec]) -> HashSet<String> {
    let outcomes = esme.submit_pipelined(specs, 100).await;
    assert!(outcomes.iter().all(|o| o.is_ok()));
    outcomes.into_iter().map(|o| o.message_id).collect()
}

fn delivered_destinations(smsc: &TestSmsc) -> HashSet<String> {
    smsc.messages().into_iter().map(|m| m.destination).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_upstream_is_retried_until_everything_is_delivered() {
    let smsc = smsc().await;
    smsc.faults().throttle_every(3);
    let gw = gateway(&memory_config(), &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let specs = load(300, "4480");
    let ids = submit_all_ok(&esme, &specs).await;
    assert!(
        smsc.wait_for(WAIT, |s| delivered_destinations(s).len() == 300).await,
        "delivered {} stats {:?} metrics {}",
        delivered_destinations(&smsc).len(),
        smsc.stats(),
        gw.admin_get("/metrics").await.1
    );
    assert!(smsc.stats().throttled > 0, "the fault was exercised");
    let receipts = esme.wait_receipts(300, WAIT).await;
    one_receipt_per_id(&receipts, &ids);
    assert!(
        wait_metric(&gw, "sendium_provider_retries_total", "reason=\"throttled\"", |v| v
            > 0.0)
        .await
    );
}

#[tokio::test]
async fn permanent_rejection_ends_the_branch_with_a_failure_receipt() {
    let smsc = smsc().await;
    smsc.faults().reject_prefix("4481", CommandStatus::EsmeRinvdstadr);
    let gw = gateway(&memory_config(), &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let bad = esme
        .submit(&SubmitSpec::gsm("1", "4481000", "rejected").dlr())
        .await
        .unwrap();
    let good = esme
        .submit(&SubmitSpec::gsm("1", "4482000", "fine").dlr())
        .await
        .unwrap();
    let receipts = esme.wait_receipts(2, WAIT).await;
    let expected: HashSet<String> = [bad.message_id.clone(), good.message_id.clone()].into();
    let by_id = one_receipt_per_id(&receipts, &expected);
    assert_eq!(by_id[&bad.message_id].state(), Some(ReceiptState::Rejected));
    assert_eq!(
        by_id[&bad.message_id].err.as_deref(),
        Some("011"),
        "err carries the provider status (0x0B)"
    );
    assert_eq!(by_id[&good.message_id].state(), Some(ReceiptState::Delivered));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(smsc.stats().rejected, 1, "a permanent error is not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connection_mid_load_loses_nothing() {
    let smsc = smsc().await;
    let gw = gateway(&memory_config(), &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    smsc.faults().drop_connection_after(200);
    let specs = load(1_000, "4483");
    let ids = submit_all_ok(&esme, &specs).await;
    assert!(
        smsc.wait_for(WAIT, |s| delivered_destinations(s).len() == 1_000).await,
        "delivered {} of 1000",
        delivered_destinations(&smsc).len()
    );
    assert!(
        smsc.stats().unanswered > 0 || smsc.stats().binds > 1,
        "the connection really dropped"
    );
    let receipts = esme.wait_receipts(1_000, WAIT).await;
    one_receipt_per_id(&receipts, &ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_submits_time_out_and_are_retried() {
    let smsc = smsc().await;
    let gw = gateway(&memory_config(), &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    smsc.faults().stop_answering(true);
    let specs = load(20, "4484");
    let ids = submit_all_ok(&esme, &specs).await;
    assert!(smsc.wait_submits(20, WAIT).await);
    // response-timeout is 2 s in the test config.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    smsc.faults().stop_answering(false);
    assert!(
        smsc.wait_for(WAIT, |s| delivered_destinations(s).len() == 20).await,
        "delivered {}",
        delivered_destinations(&smsc).len()
    );
    let receipts = esme.wait_receipts(20, WAIT).await;
    one_receipt_per_id(&receipts, &ids);
    assert!(wait_metric(&gw, "sendium_provider_retries_total", "reason=\"timeout\"", |v| v > 0.0).await);
}
