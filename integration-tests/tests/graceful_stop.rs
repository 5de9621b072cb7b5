//! An orderly stop (SIGTERM) under load: admissions are refused, provider submissions
//! in flight finish, and the process exits 0 within `[shutdown] timeout`. On a durable
//! profile the restart delivers every acknowledged message once and every receipt; on
//! the memory profile the stop sends what it can and logs how many acknowledged
//! messages and receipts it drops.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sendium_integration_tests::{BindKind, SmscConfig, SubmitSpec, TestEsme, TestSmsc};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_on_file_stages_exits_0_and_the_restart_loses_nothing() {
    let smsc = TestSmsc::start(SmscConfig {
        receipt_delay: Duration::from_millis(200),
        ..SmscConfig::default()
    })
    .await;
    let config = format!(
        "{}\n[shutdown]\ntimeout = \"10s\"\n",
        durable_config("[dlr]\nbackend = \"file\"")
    );
    let mut gw = gateway(&config, &smsc).await;
    let (stop, streaming) = bind_and_stream(&gw, "4475").await;
    assert!(smsc.wait_messages(400, WAIT).await, "traffic flows");
    // Answers take 300 ms from now on: the stop finds submissions in flight, and must
    // wait for their answers (cut off, they would be sent again after the restart).
    smsc.faults().delay_responses(Duration::from_millis(300));
    tokio::time::sleep(Duration::from_millis(100)).await;

    assert!(gw.terminate());
    let stopped_at = Instant::now();
    let status = gw
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("exits after SIGTERM");
    let took = stopped_at.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (esme, acked) = streaming.await.unwrap();
    let log = gw.log();
    assert!(status.success(), "exit status {status}\n{log}");
    assert!(took < Duration::from_secs(12), "stopped in {took:?} (timeout 10 s)");
    assert!(log.contains("stopping: admissions refused"), "{log}");
    let before: usize = smsc.messages().len();

    // The restart sends the rest; nothing acknowledged is lost, nothing goes twice.
    gw.restart().await;
    let again = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let want: HashSet<String> = acked.keys().cloned().collect();
    let delivered = |s: &TestSmsc| -> HashSet<String> { s.messages().into_iter().map(|m| m.destination).collect() };
    assert!(
        smsc.wait_for(Duration::from_secs(60), |s| want.is_subset(&delivered(s)))
            .await,
        "{} of {} acknowledged messages never reached the SMSC",
        want.difference(&delivered(&smsc)).count(),
        want.len()
    );
    let mut count: HashMap<String, usize> = HashMap::new();
    for m in smsc.messages() {
        *count.entry(m.destination).or_default() += 1;
    }
    let twice: Vec<_> = count.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(twice.is_empty(), "in flight at the stop and sent again: {twice:?}");

    // Every acknowledged message has its receipt: a receipt goes to whichever session of
    // the account is bound when it is delivered (the one bound before the stop, or the
    // one bound after the restart).
    let ids: HashSet<String> = acked.values().cloned().collect();
    let got = |a: &TestEsme, b: &TestEsme| -> HashSet<String> {
        a.receipts()
            .iter()
            .chain(b.receipts().iter())
            .filter_map(|r| r.message_id().map(str::to_string))
            .collect()
    };
    assert!(
        eventually(Duration::from_secs(60), || ids.is_subset(&got(&esme, &again))).await,
        "{} of {} receipts missing",
        ids.difference(&got(&esme, &again)).count(),
        ids.len()
    );
    eprintln!(
        "SIGTERM under load: {} acknowledged, {} sent before the stop, stopped in {took:?}",
        acked.len(),
        before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_on_the_memory_profile_logs_what_it_drops() {
    // The SMSC holds every submit_sm_resp back: nothing can be sent in time.
    let smsc = smsc().await;
    let config = format!("{}\n[shutdown]\ntimeout = \"1s\"\n", memory_config());
    let mut gw = gateway(&config, &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    smsc.faults().throttle_all_for(Duration::from_secs(60));
    let specs: Vec<SubmitSpec> = (0..50)
        .map(|i| SubmitSpec::gsm("Shop", &format!("4476{i:07}"), "dropped at the stop").dlr())
        .collect();
    let acked = esme
        .submit_pipelined(&specs, 50)
        .await
        .into_iter()
        .filter(|o| o.is_ok())
        .count();
    assert_eq!(acked, 50);

    assert!(gw.terminate());
    // While it drains: no new bind, no new HTTP submission.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let bind = TestEsme::bind(gw.smpp_addr(), "esme2", "secret2", BindKind::Transceiver).await;
    assert!(bind.is_err(), "a bind while stopping is refused");
    let r = gw
        .post_message("key-1", r#"{"from":"Shop","to":"447600000999","text":"too late"}"#)
        .await
        .unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    let status = gw
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("exits after SIGTERM");
    let log = gw.log();
    assert!(status.success(), "exit status {status}\n{log}");
    assert!(log.contains("SMPP bind refused"), "{log}");
    let line = log
        .lines()
        .find(|l| l.contains("memory pending stage cannot keep"))
        .unwrap_or_else(|| panic!("no dropped count in the log:\n{log}"));
    assert!(line.contains("messages=50 owing_receipts=50"), "{line}");
    assert!(!log.contains("4476"), "no destination numbers in the log");
}
