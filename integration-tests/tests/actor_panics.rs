//! Each actor kind panics once under load. The supervisor restarts it and reconciles by
//! stable id: no acknowledged message is lost, every receipt-requesting one gets its
//! receipt, and nothing is left stuck in any stage.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sendium_integration_tests::{BindKind, ReceiptState, SubmitSpec, TestEsme};
use serde_json::Value;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_actor_kind_panics_once_under_load_and_nothing_is_lost() {
    let smsc = smsc().await;
    let failpoints = [
        "actor-ingress=panic@40",
        "actor-selector=panic@60",
        "actor-router=panic@50",
        "actor-worker=panic@45",
        "actor-dlr-correlator=panic@15",
    ]
    .join(",");
    let gw = sendium_integration_tests::GatewayProcess::builder(&memory_config())
        .smsc_port(smsc.port())
        .env("SENDIUM_FAILPOINT", &failpoints)
        .start()
        .await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();

    let mut acked: HashMap<String, String> = HashMap::new(); // id → destination
    let mut refused = 0;
    for round in 0..20 {
        let specs: Vec<SubmitSpec> = (0..150)
            .map(|i| {
                SubmitSpec::gsm(
                    "1",
                    &format!("4490{round:02}{i:04}"),
                    &format!("panic load {round}/{i}"),
                )
                .dlr()
            })
            .collect();
        for (spec, o) in specs.iter().zip(esme.submit_pipelined(&specs, 50).await) {
            if o.is_ok() {
                acked.insert(o.message_id, spec.destination.clone());
            } else {
                refused += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        acked.len() > 2_500,
        "most submissions are acknowledged ({refused} refused)"
    );

    // Every acknowledged message reaches the provider at least once.
    let want: HashSet<String> = acked.values().cloned().collect();
    let arrived = smsc
        .wait_for(Duration::from_secs(60), |s| {
            let got: HashSet<String> = s.messages().into_iter().map(|m| m.destination).collect();
            want.is_subset(&got)
        })
        .await;
    let got: HashSet<String> = smsc.messages().into_iter().map(|m| m.destination).collect();
    assert!(
        arrived,
        "{} acknowledged messages never reached the SMSC",
        want.difference(&got).count()
    );

    // Every acknowledged message gets a receipt (at least once: a restart between
    // downstream delivery and its record may repeat one).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let ids: HashSet<String> = esme
            .receipts()
            .iter()
            .filter_map(|r| r.message_id().map(str::to_string))
            .collect();
        if acked.keys().all(|id| ids.contains(id)) {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            panic!(
                "{} acknowledged messages got no receipt; smsc {:?}\n{}",
                acked.keys().filter(|id| !ids.contains(*id)).count(),
                smsc.stats(),
                dlr_metrics(&gw).await
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for r in esme.receipts() {
        let id = r.message_id().unwrap();
        assert!(acked.contains_key(id), "a receipt for an id never acknowledged");
        assert_eq!(r.state(), Some(ReceiptState::Delivered));
    }

    // Each kind restarted, all are running again, and nothing is stuck.
    let (_, actors) = gw.admin_get("/admin/actors").await;
    let actors: Vec<Value> = serde_json::from_str(&actors).unwrap();
    for kind in ["ingress", "selector", "router", "destination-worker", "dlr-correlator"] {
        let a = actors.iter().find(|a| a["kind"] == kind).unwrap();
        assert!(a["restarts"].as_u64().unwrap() >= 1, "{kind} did not restart: {a}");
        assert_eq!(a["status"], "running", "{kind}: {a}");
    }
    for stage in ["pending", "router-queue", "routed-work"] {
        assert!(
            wait_metric(&gw, "sendium_stage_records", &format!("stage=\"{stage}\""), |v| v
                == 0.0)
            .await,
            "records left in {stage}"
        );
    }
    assert!(gw.log().contains("actor failed; restarting"));
}

/// The pending store's writer (the Ingress's committer task) panics after a commit,
/// before answering it: those clients are refused (their messages are stored, at least
/// once), the next admission finds the writer gone and stops the Ingress, the supervisor
/// restarts it with a new writer, and admissions are answered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_pending_writer_restarts_the_ingress() {
    let smsc = smsc().await;
    let gw = sendium_integration_tests::GatewayProcess::builder(&memory_config())
        .smsc_port(smsc.port())
        .env("SENDIUM_FAILPOINT", "after-admit=panic@5")
        .start()
        .await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let (mut ok, mut refused) = (0, 0);
    let mut last_ok = None;
    // Like a client that backs off after ESME_RSYSERR: how many submissions the restart
    // window refuses depends on the machine, that they are answered again does not.
    let mut i = 0;
    while ok < 30 && i < 400 {
        let r = esme
            .submit(&SubmitSpec::gsm("1", &format!("4491{i:04}"), "writer panic").dlr())
            .await
            .unwrap();
        if r.is_ok() {
            ok += 1;
            last_ok = Some(r.message_id);
        } else {
            refused += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        i += 1;
    }
    assert!(refused >= 1, "the commit the writer died in was refused");
    assert!(
        ok >= 30,
        "admissions answered again after the restart ({ok} ok, {refused} refused)"
    );
    let (_, actors) = gw.admin_get("/admin/actors").await;
    let actors: Vec<Value> = serde_json::from_str(&actors).unwrap();
    let ingress = actors.iter().find(|a| a["kind"] == "ingress").unwrap();
    assert!(ingress["restarts"].as_u64().unwrap() >= 1, "{ingress}");
    assert_eq!(ingress["status"], "running", "{ingress}");
    // The last acknowledged one goes all the way.
    let last = last_ok.unwrap();
    assert!(
        eventually(WAIT, || esme
            .receipts()
            .iter()
            .any(|r| r.message_id() == Some(last.as_str())))
        .await,
        "receipt for the last acknowledged submission"
    );
}

/// The DLR correlator panics right after it started committing a step. The step's
/// report (the deliveries it claimed, the handoffs and provider receipts it stored) and
/// the results of deliveries the old correlator had under way reach the restarted one.
/// Lost, the claimed receipts would wait for their lease to lapse, and the delivered
/// ones would go out again after it. So every receipt arrives well before the lease
/// ends, none arrives twice after it, and every provider receipt is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correlator_restarted_mid_step_takes_over_the_step() {
    const LEASE: Duration = Duration::from_secs(10);
    let smsc = smsc().await;
    let config = format!(
        "[dlr]\nbackend = \"memory\"\ncallback-timeout = \"5s\"\nclaim-lease = \"10s\"\n{}",
        memory_config()
    );
    let gw = sendium_integration_tests::GatewayProcess::builder(&config)
        .smsc_port(smsc.port())
        .env("SENDIUM_FAILPOINT", "dlr-step-started=panic@20")
        .start()
        .await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let mut acked: HashSet<String> = HashSet::new();
    for round in 0..10 {
        let specs: Vec<SubmitSpec> = (0..100)
            .map(|i| SubmitSpec::gsm("1", &format!("4492{round:02}{i:04}"), "correlator panic").dlr())
            .collect();
        acked.extend(submit_all_ok(&esme, &specs).await);
    }
    let submitted = tokio::time::Instant::now();
    let ids = |esme: &TestEsme| -> HashSet<String> {
        esme.receipts()
            .iter()
            .filter_map(|r| r.message_id().map(str::to_string))
            .collect()
    };
    let all = eventually(LEASE - Duration::from_secs(2), || acked.is_subset(&ids(&esme))).await;
    if !all {
        panic!(
            "{} acknowledged messages got no receipt before the lease ended; smsc {:?}\n{}",
            acked.difference(&ids(&esme)).count(),
            smsc.stats(),
            dlr_metrics(&gw).await
        );
    }
    tokio::time::sleep_until(submitted + LEASE + Duration::from_secs(2)).await;
    one_receipt_per_id(&esme.receipts(), &acked);
    let answered = eventually(WAIT, || {
        let s = smsc.stats();
        s.receipts_acked + s.receipts_nacked == s.receipts_sent
    })
    .await;
    assert!(answered, "every provider receipt answered: {:?}", smsc.stats());
    let (_, actors) = gw.admin_get("/admin/actors").await;
    let actors: Vec<Value> = serde_json::from_str(&actors).unwrap();
    let dlr = actors.iter().find(|a| a["kind"] == "dlr-correlator").unwrap();
    assert_eq!(dlr["restarts"].as_u64(), Some(1), "{dlr}");
}
