//! DLR backends across restarts: with the file (and postgresql) DLR store, receipts
//! that arrive after a SIGKILL and restart are still correlated and delivered, and
//! receipts waiting for an ESME or a callback survive; with the memory DLR store they
//! are lost, exactly as documented. Also: an unanswered deliver_sm is redelivered on the
//! next bind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sendium_integration_tests::{
    BindKind, CallbackServer, CommandStatus, DlrReply, EsmeOptions, GatewayProcess, SmscConfig, SubmitSpec, TestEsme,
    TestSmsc,
};
use support::*;

async fn slow_receipt_smsc() -> TestSmsc {
    TestSmsc::start(SmscConfig {
        receipt_delay: Duration::from_secs(2),
        ..SmscConfig::default()
    })
    .await
}

/// Receipts that arrive after a restart find their correlations (file DLR).
pub async fn receipts_after_restart_are_delivered(dlr: &str, durable: bool) {
    let smsc = slow_receipt_smsc().await;
    let mut gw = gateway(&durable_config(dlr), &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let ids = submit_and_hand_off(&gw, &esme, 50, "30").await;
    let esme = kill_and_rebind(&mut gw, esme, BindKind::Transceiver).await;
    // The SMSC holds the receipts while nobody is bound and sends them to the new session.
    assert!(
        smsc.wait_receipts_acked(50, WAIT).await,
        "the provider's receipts reached the gateway"
    );
    if durable {
        let receipts = esme.wait_receipts(50, WAIT).await;
        one_receipt_per_id(&receipts, &ids);
    } else {
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            esme.receipts().is_empty(),
            "memory DLR: correlations are lost on restart"
        );
        assert!(wait_metric(&gw, "sendium_receipts_unmatched_total", "", |v| v >= 50.0).await);
    }
}

/// Receipts waiting for an ESME to bind survive a restart (file DLR).
pub async fn held_receipts_survive_restart(dlr: &str, durable: bool) {
    let smsc = TestSmsc::start(SmscConfig::default()).await;
    let mut gw = gateway(&durable_config(dlr), &smsc).await;
    let tx = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transmitter)
        .await
        .unwrap();
    let ids = submit_and_hand_off(&gw, &tx, 20, "31").await;
    assert!(smsc.wait_receipts_acked(20, WAIT).await);
    assert!(
        wait_metric(&gw, "sendium_dlr_pending_receipts", "", |v| v == 20.0).await,
        "held for the account"
    );
    let rx = kill_and_rebind(&mut gw, tx, BindKind::Receiver).await;
    if durable {
        let receipts = rx.wait_receipts(20, WAIT).await;
        one_receipt_per_id(&receipts, &ids);
    } else {
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(rx.receipts().is_empty());
    }
}

/// Callbacks that could not be delivered before a restart are delivered after it.
pub async fn failing_callbacks_survive_restart(dlr: &str) {
    let smsc = TestSmsc::start(SmscConfig::default()).await;
    let mut gw = gateway(&durable_config(dlr), &smsc).await;
    let cb = CallbackServer::start().await;
    cb.set_status(Some(503));
    let mut ids = HashSet::new();
    for i in 0..10 {
        let body = serde_json::json!({"from": "Shop", "to": format!("4432{i:03}"), "text": "cb", "callback_url": cb.url("/dlr")});
        let r = gw.post_message("key-1", &body.to_string()).await.unwrap();
        assert_eq!(r.status, 202);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        ids.insert(v["id"].as_str().unwrap().to_string());
    }
    assert!(cb.wait_requests(10, WAIT).await, "first attempts failed");
    gw.kill();
    cb.heal();
    gw.restart().await;
    assert!(
        cb.wait_accepted(10, Duration::from_secs(60)).await,
        "accepted {}",
        cb.accepted().len()
    );
    let got: HashSet<String> = cb.receipts().into_iter().map(|r| r.id).collect();
    assert_eq!(got, ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_dlr_delivers_receipts_that_arrive_after_a_restart() {
    receipts_after_restart_are_delivered(DLR_FILE, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_dlr_loses_correlations_on_restart_as_documented() {
    receipts_after_restart_are_delivered(DLR_MEMORY, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_dlr_keeps_receipts_held_for_an_unbound_esme() {
    held_receipts_survive_restart(DLR_FILE, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_dlr_loses_held_receipts_on_restart_as_documented() {
    held_receipts_survive_restart(DLR_MEMORY, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_dlr_keeps_undelivered_callbacks() {
    failing_callbacks_survive_restart(DLR_FILE).await;
}

/// A slow callback endpoint and a short claim lease: 300 receipts resolve together, so
/// one claim round takes them all, and through at most 64 callbacks at once (1.5 s each)
/// the last of them would get their turn only after their 4 s claim lapsed — when a later
/// round has claimed them again and posts them too. A callback starts only while its claim
/// has time left for a whole attempt, so every receipt arrives and none is posted twice.
///
/// The receipts must resolve at once: submitted one by one, the messages resolve about
/// as fast as the endpoint drains, and no callback waits out its lease. So the provider
/// is cut off after the handoffs and holds the receipts until the gateway binds again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_callbacks_outlasting_the_lease_are_posted_once_each() {
    const N: usize = 300;
    let smsc = TestSmsc::start(SmscConfig {
        // Well beyond the time submitting and handing off every message takes.
        receipt_delay: Duration::from_secs(5),
        ..SmscConfig::default()
    })
    .await;
    let dlr = "[dlr]\nbackend = \"file\"\ncallback-timeout = \"2s\"\nclaim-lease = \"4s\"";
    let gw = gateway(&durable_config(dlr), &smsc).await;
    let cb = CallbackServer::start().await;
    cb.set_delay(Duration::from_millis(1500));
    let mut posts = tokio::task::JoinSet::new();
    for i in 0..N {
        let body = serde_json::json!({"from": "Shop", "to": format!("4436{i:03}"), "text": "slow", "callback_url": cb.url("/dlr")});
        let addr = gw.http_addr();
        posts.spawn(async move {
            sendium_integration_tests::http::post_json(
                addr,
                "/v1/messages",
                &[("Authorization", "Bearer key-1")],
                &body.to_string(),
            )
            .await
        });
    }
    let mut ids = HashSet::new();
    while let Some(r) = posts.join_next().await {
        let r = r.unwrap().unwrap();
        assert_eq!(r.status, 202);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        ids.insert(v["id"].as_str().unwrap().to_string());
    }
    assert_eq!(ids.len(), N);
    assert!(
        wait_metric(&gw, "sendium_stage_records", "stage=\"pending\"", |v| v == 0.0).await,
        "sources completed after handoff"
    );
    // Cut the provider off before the receipts are due: it holds them for the next bind.
    smsc.faults().reject_binds(Some(CommandStatus::EsmeRbindfail));
    smsc.disconnect_all();
    assert!(
        smsc.wait_for(WAIT, |s| s.held_receipts() == N).await,
        "every receipt is held, none went out before the cut ({} held, {} acked)",
        smsc.held_receipts(),
        smsc.stats().receipts_acked
    );
    // The gateway binds again and gets all of them in one go.
    smsc.faults().reject_binds(None);
    assert!(
        smsc.wait_receipts_acked(N as u64, WAIT).await,
        "the gateway took the receipts"
    );
    assert!(
        eventually(Duration::from_secs(60), || {
            cb.receipts().into_iter().map(|r| r.id).collect::<HashSet<_>>().len() >= N
        })
        .await,
        "accepted {}",
        cb.accepted().len()
    );
    // Nothing left to deliver and no callback still on its way: every post was answered.
    assert!(wait_metric(&gw, "sendium_dlr_pending_receipts", "", |v| v == 0.0).await);
    assert!(wait_metric(&gw, "sendium_dlr_deliveries_in_flight", "", |v| v == 0.0).await);
    let mut seen: HashMap<String, usize> = HashMap::new();
    for r in cb.receipts() {
        *seen.entry(r.id).or_insert(0) += 1;
    }
    let twice = seen.values().filter(|n| **n > 1).count();
    assert_eq!(
        twice,
        0,
        "{twice} receipts posted more than once ({} requests)",
        cb.requests().len()
    );
    assert_eq!(seen.keys().cloned().collect::<HashSet<_>>(), ids);
}

/// Moving away from a file DLR store that still holds work: the new profile is refused,
/// and `sendium drain` runs the recorded one until every message got its provider
/// receipt and every receipt was delivered, not only until nothing is left to deliver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_waits_for_provider_receipts_before_leaving_a_file_dlr_store() {
    let smsc = slow_receipt_smsc().await;
    let mut gw = gateway(&durable_config(DLR_FILE), &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let ids = submit_and_hand_off(&gw, &esme, 20, "37").await;
    gw.kill();
    drop(esme);
    let recorded = std::fs::read_to_string(gw.config_path()).unwrap();
    let changed = recorded.replacen("[dlr]\nbackend = \"file\"", "[dlr]\nbackend = \"memory\"", 1);
    assert_ne!(changed, recorded);
    let changed_path = gw.config_path().with_extension("memory-dlr.toml");
    std::fs::write(&changed_path, &changed).unwrap();

    let out = sendium_integration_tests::sendium_command()
        .args(["serve", "--config"])
        .arg(&changed_path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("sendium drain") && stderr.contains("dlr"), "{stderr}");

    let stdout = drain_delivering_receipts(&gw, &changed_path, &ids).await;
    assert!(
        stdout.contains("awaiting provider receipts 20"),
        "it waited for them: {stdout}"
    );
}

/// A deliver_sm the ESME never answers is delivered again when it binds again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_deliver_sm_is_redelivered_on_the_next_bind() {
    let smsc = TestSmsc::start(SmscConfig::default()).await;
    let config = durable_config(DLR_FILE).replace("[smpp]\n", "[smpp]\ndeliver-timeout = \"1s\"\n");
    let gw = gateway(&config, &smsc).await;
    let opts = EsmeOptions {
        dlr_reply: DlrReply::NoAnswer,
        ..EsmeOptions::default()
    };
    let mute = TestEsme::bind_with(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver, opts)
        .await
        .unwrap();
    let r = mute
        .submit(&SubmitSpec::gsm("1", "443300", "answer me").dlr())
        .await
        .unwrap();
    assert!(!mute.wait_receipts(1, WAIT).await.is_empty(), "the receipt was sent");
    mute.close().await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Receiver)
        .await
        .unwrap();
    let receipts = esme.wait_receipts(1, WAIT).await;
    assert_eq!(receipts[0].message_id(), Some(r.message_id.as_str()));
}

// ---- postgresql: the same guarantees, a database shared by several processes, and a
// database that goes away.

use sendium_storage::postgresql::test_cluster::TestCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql_dlr_delivers_receipts_that_arrive_after_a_restart() {
    let url = TestCluster::shared().fresh_database();
    receipts_after_restart_are_delivered(&pg_dlr(&url), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql_dlr_keeps_receipts_held_for_an_unbound_esme() {
    let url = TestCluster::shared().fresh_database();
    held_receipts_survive_restart(&pg_dlr(&url), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql_dlr_keeps_undelivered_callbacks() {
    let url = TestCluster::shared().fresh_database();
    // A restarted process cannot release claims in a shared database: the attempt in
    // flight at the kill comes back after claim-lease, kept short here.
    let dlr = pg_dlr(&url).replace("[storage.postgresql]", "claim-lease = \"10s\"\n[storage.postgresql]");
    failing_callbacks_survive_restart(&dlr).await;
}

/// Two gateways (each its own data directory) share one postgresql DLR database and
/// one provider, which hands receipts to any bound session of the account: a receipt
/// reaching the gateway that did not submit the message is still correlated, and every
/// receipt reaches the ESME exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_share_a_postgresql_dlr_store() {
    let url = TestCluster::shared().fresh_database();
    let smsc = TestSmsc::start(SmscConfig::default()).await;
    let a = gateway(&durable_config(&pg_dlr(&url)), &smsc).await;
    let b = gateway(&durable_config(&pg_dlr(&url)), &smsc).await;
    assert!(smsc.wait_bound(2, WAIT).await);
    let rx_a = TestEsme::bind(a.smpp_addr(), "esme1", "secret", BindKind::Receiver)
        .await
        .unwrap();
    let rx_b = TestEsme::bind(b.smpp_addr(), "esme1", "secret", BindKind::Receiver)
        .await
        .unwrap();
    let tx = TestEsme::bind(a.smpp_addr(), "esme1", "secret", BindKind::Transmitter)
        .await
        .unwrap();
    let specs: Vec<SubmitSpec> = (0..60)
        .map(|i| SubmitSpec::gsm("1", &format!("4434{i:03}"), "shared").dlr())
        .collect();
    let ids: HashSet<String> = tx
        .submit_pipelined(&specs, 20)
        .await
        .into_iter()
        .map(|o| o.message_id)
        .collect();
    assert!(smsc.wait_receipts_acked(60, WAIT).await);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    loop {
        let n = rx_a.receipts().len() + rx_b.receipts().len();
        if n >= 60 || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut all = rx_a.receipts();
    all.extend(rx_b.receipts());
    one_receipt_per_id(&all, &ids);
}

/// The DLR database goes away: handoffs fail, sources are kept (nothing completes
/// without its handoff), readiness turns false; when it comes back every receipt is
/// delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_dlr_database_keeps_the_sources_and_recovers() {
    let cluster = TestCluster::start();
    let url = cluster.fresh_database();
    // The provider is not up yet: the messages are admitted (the database is up, so
    // receipt requests are accepted) and wait in the pending stage.
    let provider_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let gw = GatewayProcess::builder(&durable_config(&pg_dlr(&url)))
        .smsc_port(provider_port)
        .start()
        .await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let specs: Vec<SubmitSpec> = (0..20)
        .map(|i| SubmitSpec::gsm("1", &format!("4435{i:03}"), "db down").dlr())
        .collect();
    // Admitted while the database is up.
    let ids = submit_all_ok(&esme, &specs).await;
    // Then the database goes away and the provider comes: submitted, but no handoff.
    cluster.stop_server().unwrap();
    let smsc = TestSmsc::start(SmscConfig {
        port: provider_port,
        ..SmscConfig::default()
    })
    .await;
    assert!(
        smsc.wait_accepted(20, WAIT).await,
        "the provider still gets the messages"
    );
    let (status, body) = gw.admin_get("/readyz").await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut ready = (status, body);
    while ready.0 == 200 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        ready = gw.admin_get("/readyz").await;
    }
    assert_eq!(ready.0, 503, "{}", ready.1);
    assert!(ready.1.contains("dlr"), "{}", ready.1);
    assert!(
        wait_metric(&gw, "sendium_stage_records", "stage=\"pending\"", |v| v == 20.0).await,
        "sources stay until their handoff is accepted"
    );
    // While the DLR store fails, a new submission asking for a receipt is refused
    // (retryable) instead of piling up; one without a receipt request still goes through.
    let refused = esme
        .submit(&SubmitSpec::gsm("1", "4435900", "wants a receipt").dlr())
        .await
        .unwrap();
    assert_eq!(refused.status, CommandStatus::EsmeRmsgqful);
    let plain = esme
        .submit(&SubmitSpec::gsm("1", "4435901", "no receipt wanted"))
        .await
        .unwrap();
    assert!(plain.is_ok());
    cluster.start_server().unwrap();
    let receipts = esme.wait_receipts(20, Duration::from_secs(90)).await;
    one_receipt_per_id(&receipts, &ids);
    assert!(wait_metric(&gw, "sendium_stage_records", "stage=\"pending\"", |v| v == 0.0).await);
    assert!(wait_metric(&gw, "sendium_ready", "", |v| v == 1.0).await);
}
