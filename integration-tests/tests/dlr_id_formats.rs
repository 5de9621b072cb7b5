//! Provider ids in two bases across a restart, on the durable DLR backends: the provider
//! answers `submit_sm_resp` with a hexadecimal id and writes the same number in decimal
//! in the receipt text (no `receipted_message_id` TLV to fall back on). With the
//! destination's `id-format = "hex"` (and `"auto"`), the correlation the file and the
//! postgresql DLR stores keep must be the canonical key that such a receipt finds, even
//! when the receipt only arrives after the gateway was SIGKILLed and restarted on the
//! same data directory / database. (`e2e_memory::hex_resp_ids_match_decimal_receipt_ids`
//! covers the memory DLR without a restart.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use sendium_integration_tests::{BindKind, GatewayProcess, IdStyle, ReceiptState, SmscConfig, TestEsme, TestSmsc};
use sendium_storage::postgresql::test_cluster::TestCluster;
use support::*;

/// Receipt-requesting messages per run.
const N: usize = 30;

/// How long the provider waits after each `submit_sm_resp` before sending its receipt:
/// long enough for the submissions, the handoff and the kill to happen first (checked,
/// not assumed: see `receipts_sent` below).
const RECEIPT_DELAY: Duration = Duration::from_secs(3);

/// file/file/file with the given DLR section, and the upstream's `id-format`.
fn hex_config(dlr: &str, id_format: &str) -> String {
    let base = memory_config();
    // `window = 200` is the upstream's line (the SMPP listener's window is 1000).
    let with_format = base.replacen(
        "window = 200\n",
        &format!("window = 200\nid-format = \"{id_format}\"\n"),
        1,
    );
    assert_ne!(with_format, base, "id-format was not set on the upstream");
    durable_config_with(dlr, &with_format)
}

/// A provider with hexadecimal `submit_sm_resp` ids whose receipts quote the id in
/// decimal in the text only, `RECEIPT_DELAY` after the response.
async fn hex_resp_decimal_receipt_smsc() -> TestSmsc {
    TestSmsc::start(SmscConfig {
        id_style: IdStyle::Hex,
        receipt_id_style: Some(IdStyle::Decimal),
        receipt_tlvs: false,
        receipt_delay: RECEIPT_DELAY,
        ..SmscConfig::default()
    })
    .await
}

/// The value of a metric on the admin endpoint now.
async fn metric_now(gw: &GatewayProcess, name: &str) -> f64 {
    let (_, text) = gw.admin_get("/metrics").await;
    metric(&text, name, "")
}

/// Submit `N` receipt-requesting messages through the gateway, wait for the handoff to
/// the DLR store, SIGKILL the gateway before any receipt was sent, restart it on the
/// same storage, and check that every acknowledged submit_sm gets exactly one receipt,
/// with its own id and state delivered, from the restarted process.
async fn hex_ids_with_decimal_receipts_survive_a_restart(dlr: &str, id_format: &str, tag: &str) {
    let smsc = hex_resp_decimal_receipt_smsc().await;
    let mut gw = gateway(&hex_config(dlr, id_format), &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();

    // Once the sources completed, the DLR store alone holds the correlations.
    let ids = submit_and_hand_off(&gw, &esme, N, tag).await;

    // The premise: the provider accepted every message under a hexadecimal id whose
    // decimal form (the one its receipt will quote) is a different string.
    let provider_ids: Vec<String> = smsc
        .submits()
        .into_iter()
        .filter(|s| s.is_accepted())
        .filter_map(|s| s.message_id)
        .collect();
    assert_eq!(provider_ids.len(), N, "the provider accepted every message once");
    for id in &provider_ids {
        let value = u64::from_str_radix(id, 16).unwrap_or_else(|e| panic!("provider id {id} is not hex: {e}"));
        assert_ne!(&value.to_string(), id, "hex and decimal forms of {id} coincide");
    }

    // Kill before the provider sent a single receipt: all of them reach the restarted
    // process, which knows the messages only from the DLR store.
    assert_eq!(
        smsc.stats().receipts_sent,
        0,
        "a receipt was sent before the kill; the handoff took longer than {RECEIPT_DELAY:?}"
    );
    let esme = kill_and_rebind(&mut gw, esme, BindKind::Transceiver).await;

    assert!(
        smsc.wait_receipts_acked(N as u64, WAIT).await,
        "the provider's receipts reached the restarted gateway ({} acked)",
        smsc.stats().receipts_acked
    );
    let receipts = esme.wait_receipts(N, WAIT).await;
    let by_id = one_receipt_per_id(&receipts, &ids);
    for (id, r) in &by_id {
        assert_eq!(r.state(), Some(ReceiptState::Delivered), "receipt for {id}: {}", r.text);
    }
    // The restarted process matched every provider receipt (none was orphaned) and
    // delivered each once.
    assert!(
        wait_metric(&gw, "sendium_receipts_matched_total", "", |v| v == N as f64).await,
        "every provider receipt was matched after the restart"
    );
    assert!(
        wait_metric(&gw, "sendium_receipts_delivered_total", "", |v| v == N as f64).await,
        "every receipt was delivered once"
    );
    assert_eq!(metric_now(&gw, "sendium_receipts_unmatched_total").await, 0.0);
    assert_eq!(esme.receipts().len(), N, "no receipt was delivered twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_dlr_matches_decimal_receipts_for_hex_ids_after_a_restart() {
    hex_ids_with_decimal_receipts_survive_a_restart(DLR_FILE, "hex", "60").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql_dlr_matches_decimal_receipts_for_hex_ids_after_a_restart() {
    let url = TestCluster::shared().fresh_database();
    hex_ids_with_decimal_receipts_survive_a_restart(&pg_dlr(&url), "hex", "61").await;
}

/// `id-format = "auto"` stores a representation-preserving key and tries both
/// conversions on the receipt: the same restart on the file DLR store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_dlr_with_auto_id_format_matches_decimal_receipts_after_a_restart() {
    hex_ids_with_decimal_receipts_survive_a_restart(DLR_FILE, "auto", "62").await;
}
