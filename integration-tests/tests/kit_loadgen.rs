//! The load generator, calibrated against the test SMSC (an SMPP server that also sends
//! receipts to transceivers of the same system_id).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sendium_integration_tests::CommandStatus;
use sendium_integration_tests::loadgen::{self, LoadConfig, Mix};
use sendium_integration_tests::smsc::{IdStyle, SmscConfig, TestSmsc};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_gets_its_receipt() {
    let smsc = TestSmsc::start(SmscConfig {
        id_style: IdStyle::Decimal,
        receipt_delay: Duration::from_millis(5),
        ..SmscConfig::default()
    })
    .await;
    let report = loadgen::run(LoadConfig {
        addr: smsc.addr(),
        system_id: "sendium".into(),
        password: "pw".into(),
        sessions: 3,
        count: 601,
        window: 16,
        mix: Mix::parse("gsm=1,ucs2=1,multipart=1").unwrap(),
        receipt_timeout: Duration::from_secs(10),
        ..LoadConfig::default()
    })
    .await
    .unwrap();
    println!("{report}");
    assert!(report.session_errors.is_empty(), "{:?}", report.session_errors);
    assert_eq!(report.messages, 601);
    // a third of the messages are 3-part
    assert_eq!(report.submits, 601 + 2 * 200);
    assert_eq!(report.submits_ok, report.submits);
    assert_eq!(report.receipts_expected, 601, "one receipt per message (part 1 asks)");
    assert_eq!(
        (
            report.receipts_matched,
            report.receipts_missing,
            report.receipts_unmatched
        ),
        (601, 0, 0)
    );
    assert!(report.statuses.is_empty());
    assert_eq!(report.resp_latency.count(), report.submits);
    assert!(report.elapsed >= report.submit_elapsed);
    assert!(report.msgs_per_sec > 0.0);
    assert!(smsc.wait_messages(601, Duration::from_secs(5)).await);
    let messages = smsc.messages();
    assert_eq!(messages.iter().filter(|m| m.parts == 3).count(), 200);
    assert_eq!(messages.iter().filter(|m| m.data_coding == 8).count(), 200);
    assert!(smsc.duplicates().is_empty());
    let json = report.to_json();
    assert_eq!(json["receipts_matched"], 601);
}

#[tokio::test]
async fn rate_limit_and_error_statuses_are_reported() {
    let smsc = TestSmsc::start(SmscConfig::default()).await;
    smsc.faults().throttle_every(4);
    let report = loadgen::run(LoadConfig {
        addr: smsc.addr(),
        system_id: "sendium".into(),
        password: "pw".into(),
        sessions: 1,
        count: 40,
        window: 4,
        rate: Some(200.0),
        receipt_timeout: Duration::from_secs(5),
        ..LoadConfig::default()
    })
    .await
    .unwrap();
    assert_eq!(report.statuses.get("ESME_RTHROTTLED"), Some(&10));
    assert_eq!(report.submits_ok, 30);
    assert_eq!((report.receipts_expected, report.receipts_matched), (30, 30));
    // 40 messages at 200/s take about 0.2 s
    assert!(
        report.submit_elapsed >= Duration::from_millis(150),
        "{:?}",
        report.submit_elapsed
    );
    let _ = CommandStatus::EsmeRok;
}

#[tokio::test]
async fn bind_failures_and_missing_receipts() {
    let smsc = TestSmsc::start(SmscConfig::default()).await;
    let report = loadgen::run(LoadConfig {
        addr: smsc.addr(),
        system_id: "sendium".into(),
        password: "wrong".into(),
        sessions: 2,
        count: 10,
        ..LoadConfig::default()
    })
    .await
    .unwrap();
    assert_eq!(report.session_errors.len(), 2);
    assert!(
        report.session_errors[0].contains("ESME_RINVPASWD"),
        "{:?}",
        report.session_errors
    );

    smsc.set_receipt_rules(vec![sendium_integration_tests::smsc::ReceiptRule::no_receipt(
        sendium_integration_tests::smsc::DestMatch::Any,
    )]);
    let report = loadgen::run(LoadConfig {
        addr: smsc.addr(),
        system_id: "sendium".into(),
        password: "pw".into(),
        sessions: 1,
        count: 10,
        receipt_timeout: Duration::from_millis(300),
        ..LoadConfig::default()
    })
    .await
    .unwrap();
    assert_eq!(
        (
            report.receipts_expected,
            report.receipts_matched,
            report.receipts_missing
        ),
        (10, 0, 10)
    );
}
