//! Several Sendium processes on one PostgreSQL database (`storage.postgresql.shared`):
//! they split the partitions, each ESME's receipts reach it whichever process's session
//! the SMSC hands them to, and a process SIGKILLed under load (and not restarted) has
//! its partitions taken over within seconds — every acknowledged message still reaches
//! the SMSC, and a message is submitted twice only if the killed process had it at the
//! provider when it died.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sendium_integration_tests::{BindKind, GatewayProcess, TestEsme};
use sendium_storage::postgresql::test_cluster::TestCluster;
use support::*;

/// Shared postgresql stages and DLR store at `url`, 8 partitions, over the memory
/// profile's listeners, destination and route. Receipt claims lapse after 3 s, so the
/// receipts the killed process had claimed are delivered again soon.
fn shared_config(url: &str) -> String {
    format!(
        "[sms.pending]\nbackend = \"postgresql\"\n[sms.router-queue]\nbackend = \"postgresql\"\n\
         [sms.routed-work]\nbackend = \"postgresql\"\n[storage.postgresql]\nurl = \"{url}\"\nshared = true\n\
         partitions = 8\n[dlr]\nbackend = \"postgresql\"\ncallback-timeout = \"1s\"\nclaim-lease = \"3s\"\n{}",
        memory_config()
    )
}

/// `/admin/cluster` of a process, parsed.
async fn cluster(gw: &GatewayProcess) -> serde_json::Value {
    let (status, body) = gw.admin_get("/admin/cluster").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn held(view: &serde_json::Value) -> HashSet<u64> {
    view["held"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect()
}

/// Wait until `gw` holds `n` partitions and none is being handed on.
async fn holds(gw: &GatewayProcess, n: usize, within: Duration) -> serde_json::Value {
    let deadline = Instant::now() + within;
    loop {
        let view = cluster(gw).await;
        if held(&view).len() == n && view["releasing"].as_array().is_some_and(Vec::is_empty) {
            return view;
        }
        assert!(
            Instant::now() < deadline,
            "not holding {n} partitions within {within:?}: {view}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_the_work_and_one_killed_loses_nothing() {
    let url = TestCluster::shared().fresh_database();
    let smsc = smsc().await;
    let config = shared_config(&url);
    let a = gateway(&config, &smsc).await;
    holds(&a, 8, WAIT).await;
    let mut b = gateway(&config, &smsc).await;
    // They split the partitions between them.
    let (va, vb) = (holds(&a, 4, WAIT).await, holds(&b, 4, WAIT).await);
    assert!(held(&va).is_disjoint(&held(&vb)), "{va} {vb}");
    assert_eq!(va["members"], 2);
    assert_eq!(va["access"], "shared");
    let holders = va["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 8);
    assert_eq!(
        holders.iter().filter(|h| h["held_by"] == "this process").count(),
        4,
        "{va}"
    );

    // An ESME on each process, both submitting with receipts.
    let e1 = TestEsme::bind(a.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let e2 = TestEsme::bind(b.smpp_addr(), "esme2", "secret2", BindKind::Transceiver)
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let s1 = tokio::spawn(stream_with_receipts(
        e1,
        "4471",
        Duration::from_millis(20),
        stop.clone(),
    ));
    let s2 = tokio::spawn(stream_with_receipts(
        e2,
        "4472",
        Duration::from_millis(20),
        stop.clone(),
    ));
    assert!(smsc.wait_messages(600, WAIT).await, "traffic flows through both");

    // B dies under load and is not restarted.
    b.kill();
    let killed_at = Instant::now();
    let view = holds(&a, 8, Duration::from_secs(10)).await;
    let takeover = killed_at.elapsed();
    assert_eq!(view["members"], 1);
    let (e2, e2_acked) = s2.await.unwrap();
    // A keeps taking traffic meanwhile, then stops.
    let before = smsc.messages().len();
    assert!(smsc.wait_for(WAIT, |s| s.messages().len() > before + 200).await);
    stop.store(true, Ordering::Relaxed);
    let (e1, e1_acked) = s1.await.unwrap();

    // Every acknowledged message reaches the SMSC.
    let all_acked: HashSet<String> = e1_acked.keys().chain(e2_acked.keys()).cloned().collect();
    let delivered = |s: &sendium_integration_tests::TestSmsc| -> HashSet<String> {
        s.messages().into_iter().map(|m| m.destination).collect()
    };
    assert!(
        smsc.wait_for(Duration::from_secs(60), |s| all_acked.is_subset(&delivered(s)))
            .await,
        "{} of {} acknowledged messages never reached the SMSC",
        all_acked.difference(&delivered(&smsc)).count(),
        all_acked.len()
    );

    // A message went twice only if the killed process had it at the provider: its first
    // submission before the kill, the second after.
    let mut by_dest: HashMap<String, Vec<Instant>> = HashMap::new();
    for s in smsc.submits().into_iter().filter(|s| s.is_accepted()) {
        by_dest.entry(s.destination.clone()).or_default().push(s.arrived_at);
    }
    let twice: Vec<(&String, &Vec<Instant>)> = by_dest.iter().filter(|(_, at)| at.len() > 1).collect();
    for (dest, at) in &twice {
        assert_eq!(at.len(), 2, "{dest} submitted {} times", at.len());
        assert!(
            at[0] < killed_at && at[1] > killed_at,
            "{dest} submitted twice, not across the kill"
        );
    }
    // At most what the killed process could have at the provider: its window (200) of
    // unanswered submissions, plus answered ones whose routed-work write had not
    // committed yet — under a loaded database that second share reaches a window too,
    // so the bound is two windows.
    assert!(twice.len() <= 400, "{} submitted twice", twice.len());

    // Every receipt reaches its ESME: esme1's on A all along (the SMSC hands receipts
    // to either process's session), esme2's once it binds again, to the survivor.
    let ids1: HashSet<String> = e1_acked.values().cloned().collect();
    let r1 = e1.wait_receipts(ids1.len(), Duration::from_secs(60)).await;
    let got1: HashSet<String> = r1.iter().filter_map(|r| r.message_id().map(str::to_string)).collect();
    assert!(
        ids1.is_subset(&got1),
        "esme1 missed {} receipts",
        ids1.difference(&got1).count()
    );
    let receipt_ids = |esme: &TestEsme| -> HashSet<String> {
        esme.receipts()
            .iter()
            .filter_map(|r| r.message_id().map(str::to_string))
            .collect()
    };
    let got_on_b = receipt_ids(&e2);
    let e2_again = TestEsme::bind(a.smpp_addr(), "esme2", "secret2", BindKind::Transceiver)
        .await
        .unwrap();
    let ids2: HashSet<String> = e2_acked.values().cloned().collect();
    let missing2 = |e: &TestEsme| -> usize {
        let got: HashSet<String> = got_on_b.union(&receipt_ids(e)).cloned().collect();
        ids2.difference(&got).count()
    };
    assert!(
        eventually(Duration::from_secs(60), || missing2(&e2_again) == 0).await,
        "esme2 missed {} receipts",
        missing2(&e2_again)
    );
    eprintln!(
        "two processes, one SIGKILLed under load: {} + {} acknowledged, partitions taken over in {:?}, {} submitted \
         twice",
        e1_acked.len(),
        e2_acked.len(),
        takeover,
        twice.len()
    );
    assert!(
        wait_metric(&a, "sendium_stage_records", "stage=\"pending\"", |v| v == 0.0).await,
        "nothing left pending"
    );
}
