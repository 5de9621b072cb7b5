//! The postgresql/postgresql/postgresql profile end to end: messages, multipart and
//! receipts through the PostgreSQL stages, and a database that goes away under load —
//! admissions are refused while it is down (nothing acknowledged that was not stored),
//! readiness says why, and traffic resumes by itself when it returns, with no
//! acknowledged message lost.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sendium_integration_tests::{Alphabet, BindKind, Concat, DlrParts, ReceiptState, SubmitSpec, TestEsme};
use sendium_storage::postgresql::test_cluster::TestCluster;
use support::*;

/// The postgresql stages at `url`, with `dlr`, over the memory profile's listeners,
/// destination and route.
fn pg_config(url: &str, dlr: &str) -> String {
    format!(
        "[sms.pending]\nbackend = \"postgresql\"\n[sms.router-queue]\nbackend = \"postgresql\"\n\
         [sms.routed-work]\nbackend = \"postgresql\"\n[storage.postgresql]\nurl = \"{url}\"\n{dlr}\n{}",
        memory_config()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_multipart_and_receipts_go_through_the_database() {
    let url = TestCluster::shared().fresh_database();
    let smsc = smsc().await;
    let gw = gateway(&pg_config(&url, "[dlr]\nbackend = \"postgresql\""), &smsc).await;
    let (_, profile) = gw.admin_get("/admin/profile").await;
    assert!(profile.contains("\"pending\":\"postgresql\""), "{profile}");
    assert!(profile.contains("in one PostgreSQL database"), "{profile}");
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let mut specs: Vec<SubmitSpec> = (0..200)
        .map(|i| SubmitSpec::gsm("Shop", &format!("4471{i:05}"), &format!("hello {i}")).dlr())
        .collect();
    let long = "A long message through PostgreSQL. ".repeat(10);
    specs.extend(SubmitSpec::multipart(
        "Shop",
        "447199999",
        Alphabet::Gsm7,
        &long,
        Concat::Sar(7),
        DlrParts::Every,
    ));
    let ids = submit_all_ok(&esme, &specs).await;
    assert!(
        smsc.wait_messages(201, WAIT).await,
        "SMSC got {}",
        smsc.messages().len()
    );
    assert_eq!(smsc.messages_to("447199999")[0].text, long);
    let receipts = esme.wait_receipts(ids.len(), WAIT).await;
    for r in one_receipt_per_id(&receipts, &ids).values() {
        assert_eq!(r.state(), Some(ReceiptState::Delivered));
    }
    assert!(
        wait_metric(&gw, "sendium_stage_records", "stage=\"pending\"", |v| v == 0.0).await,
        "every source completed"
    );
}

/// What a load task saw: destinations acknowledged, and how many were refused.
#[derive(Default)]
struct Seen {
    acked: HashSet<String>,
    refused: usize,
}

/// Submit a stream (20 pipelined every 20 ms, fresh destinations) until `stop`.
async fn stream(gw_addr: std::net::SocketAddr, stop: Arc<AtomicBool>) -> Seen {
    let esme = TestEsme::bind(gw_addr, "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let mut seen = Seen::default();
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let specs: Vec<SubmitSpec> = (0..20)
            .map(|i| SubmitSpec::gsm("1", &format!("4472{:06}", n + i), "while the database comes and goes"))
            .collect();
        n += specs.len();
        for (spec, o) in specs.iter().zip(esme.submit_pipelined(&specs, 20).await) {
            if o.is_ok() {
                seen.acked.insert(spec.destination.clone());
            } else {
                seen.refused += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_goes_away_under_load_loses_nothing() {
    // A cluster of its own: this test stops it.
    let cluster = TestCluster::start();
    let url = cluster.fresh_database();
    let smsc = smsc().await;
    let gw = gateway(&pg_config(&url, "[dlr]\nbackend = \"memory\""), &smsc).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(stream(gw.smpp_addr(), stop.clone()));
    assert!(smsc.wait_messages(100, WAIT).await, "traffic flows");

    cluster.stop_server().unwrap();
    // Readiness turns false, naming the stage and the database.
    let mut ready = gw.admin_get("/readyz").await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while ready.0 == 200 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        ready = gw.admin_get("/readyz").await;
    }
    assert_eq!(ready.0, 503, "{}", ready.1);
    assert!(ready.1.contains("postgresql"), "{}", ready.1);
    // Longer than an admission waits for a connection (2 s): refusals, not just delay.
    tokio::time::sleep(Duration::from_secs(5)).await;
    cluster.start_server().unwrap();

    // It recovers by itself, and traffic resumes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while gw.admin_get("/readyz").await.0 != 200 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not ready again after the database returned"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let before = smsc.messages().len();
    assert!(
        smsc.wait_for(WAIT, |s| s.messages().len() > before + 100).await,
        "traffic resumed"
    );
    stop.store(true, Ordering::Relaxed);
    let seen = load.await.unwrap();
    assert!(seen.refused > 0, "submissions were refused while the database was down");
    // Every acknowledged message reaches the SMSC.
    let delivered = |s: &sendium_integration_tests::TestSmsc| -> HashSet<String> {
        s.messages().into_iter().map(|m| m.destination).collect()
    };
    assert!(
        smsc.wait_for(Duration::from_secs(60), |s| seen.acked.is_subset(&delivered(s)))
            .await,
        "{} of {} acknowledged messages never reached the SMSC",
        seen.acked.difference(&delivered(&smsc)).count(),
        seen.acked.len()
    );
    eprintln!(
        "database down for 5 s under load: {} acknowledged, {} refused, all acknowledged delivered",
        seen.acked.len(),
        seen.refused
    );
    assert!(
        wait_metric(&gw, "sendium_stage_records", "stage=\"pending\"", |v| v == 0.0).await,
        "nothing left pending"
    );
}

/// A second process on the same database's outbound stages is refused at startup, naming
/// why (selection and delivery are not divided between processes); once the first stops,
/// the database is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_on_the_database_is_refused() {
    let url = TestCluster::shared().fresh_database();
    let smsc = smsc().await;
    let config = pg_config(&url, "[dlr]\nbackend = \"memory\"");
    let mut first = gateway(&config, &smsc).await;
    let mut second = sendium_integration_tests::GatewayProcess::builder(&config)
        .smsc_port(smsc.port())
        .spawn();
    let status = second
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the second gateway exits");
    assert!(!status.success());
    let log = second.log();
    assert!(
        log.contains("another Sendium process runs the outbound stages of this database"),
        "{log}"
    );
    first.kill();
    let mut third = sendium_integration_tests::GatewayProcess::builder(&config)
        .smsc_port(smsc.port())
        .start()
        .await;
    assert_eq!(third.admin_get("/readyz").await.0, 200);
    third.kill();
}
