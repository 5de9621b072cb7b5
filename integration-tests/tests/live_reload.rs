//! Live reconfiguration of the real gateway: SIGHUP adds an account (a bind with it
//! succeeds) and a route (new traffic goes there) while another ESME keeps submitting
//! without a single error; `POST /admin/reload` removes an account (its session is
//! unbound) and refuses a changed storage backend whole, naming the key, with the old
//! configuration serving on; `/admin/config` and the reload counter follow.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sendium_integration_tests::{BindKind, GatewayProcess, SmscConfig, SubmitSpec, TestEsme, TestSmsc, http};
use support::*;

/// A second destination at the same SMSC, under its own system id.
const SECOND: &str = r#"
[[destinations]]
name = "second"
kind = "smpp"
host = "127.0.0.1"
port = {smsc_port}
system-id = "second"
password = "pw"
reconnect-min = "50ms"
reconnect-max = "500ms"
"#;

async fn start() -> (GatewayProcess, TestSmsc) {
    // The SMSC takes any credentials: both destinations bind.
    let smsc = TestSmsc::start(SmscConfig {
        accounts: Vec::new(),
        ..SmscConfig::default()
    })
    .await;
    let gw = gateway(&format!("{}{SECOND}", memory_config()), &smsc).await;
    assert!(smsc.wait_bound(2, WAIT).await, "both destinations bound");
    (gw, smsc)
}

fn rewrite(gw: &GatewayProcess, edit: impl Fn(String) -> String) {
    let text = std::fs::read_to_string(gw.config_path()).unwrap();
    let new = edit(text.clone());
    assert_ne!(new, text, "the edit changed nothing");
    std::fs::write(gw.config_path(), new).unwrap();
}

async fn post_reload(gw: &GatewayProcess) -> (u16, serde_json::Value) {
    let r = http::request(gw.admin_addr(), "POST", "/admin/reload", &[], None)
        .await
        .unwrap();
    (r.status, serde_json::from_slice(&r.body).unwrap_or_default())
}

async fn config_view(gw: &GatewayProcess) -> serde_json::Value {
    let (status, body) = gw.admin_get("/admin/config").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_adds_an_account_and_a_route_while_another_esme_submits_without_an_error() {
    let (gw, smsc) = start().await;
    let before = config_view(&gw).await;
    assert_eq!(before["routes"], 1);
    assert!(before["digest"].as_str().unwrap().starts_with("sha256:"));
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let streaming = tokio::spawn(async move {
        let (mut ok, mut failed, mut n) = (0usize, 0usize, 0usize);
        while !flag.load(Ordering::Relaxed) {
            let specs: Vec<SubmitSpec> = (0..10)
                .map(|i| SubmitSpec::gsm("Shop", &format!("4477{:07}", n + i), "during the reload"))
                .collect();
            n += specs.len();
            for o in esme.submit_pipelined(&specs, 10).await {
                if o.is_ok() { ok += 1 } else { failed += 1 }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        (esme, ok, failed)
    });
    assert!(smsc.wait_messages(100, WAIT).await);
    assert!(
        TestEsme::bind(gw.smpp_addr(), "esme3", "secret3", BindKind::Transceiver)
            .await
            .is_err(),
        "not an account yet"
    );

    rewrite(&gw, |t| {
        t.replace(
            "[[routes]]\nname = \"default\"",
            "[[routes]]\nname = \"uk-second\"\ndestination-prefix = \"4479\"\nto = [\"second\"]\n\n[[routes]]\nname = \"default\"",
        ) + "\n[[smpp.accounts]]\nsystem-id = \"esme3\"\npassword = \"secret3\"\n"
    });
    let pid = gw.pid().unwrap().to_string();
    assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    assert!(
        eventually(WAIT, || gw.log().contains("configuration reloaded")).await,
        "{}",
        gw.log()
    );
    let after = config_view(&gw).await;
    assert_eq!(after["routes"], 2);
    assert_eq!(after["accounts"], 3);
    assert_ne!(after["digest"], before["digest"]);

    let esme3 = TestEsme::bind(gw.smpp_addr(), "esme3", "secret3", BindKind::Transceiver)
        .await
        .expect("the new account binds");
    let resp = esme3
        .submit(&SubmitSpec::gsm("Shop", "447900000001", "new route"))
        .await
        .unwrap();
    assert!(resp.is_ok());
    assert!(smsc.wait_for(WAIT, |s| !s.messages_to("447900000001").is_empty()).await);
    assert_eq!(
        smsc.messages_to("447900000001")[0].system_id,
        "second",
        "the new route's destination"
    );

    let seen = smsc.messages().len();
    assert!(
        smsc.wait_for(WAIT, |s| s.messages().len() > seen + 100).await,
        "traffic goes on"
    );
    stop.store(true, Ordering::Relaxed);
    let (esme, ok, failed) = streaming.await.unwrap();
    assert_eq!(failed, 0, "{ok} accepted, {failed} refused across the reload");
    assert!(!esme.is_closed(), "the unchanged account's session stayed bound");
    assert!(
        smsc.messages()
            .iter()
            .filter(|m| m.destination.starts_with("4477"))
            .all(|m| m.system_id == "sendium"),
        "the default route's traffic stays on its destination"
    );
    assert!(wait_metric(&gw, "sendium_config_reloads_total", "outcome=\"ok\"", |n| n == 1.0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_reload_removes_an_account_and_refuses_what_cannot_change_live() {
    let (gw, smsc) = start().await;
    let esme2 = TestEsme::bind(gw.smpp_addr(), "esme2", "secret2", BindKind::Transceiver)
        .await
        .unwrap();
    let digest = config_view(&gw).await["digest"].clone();

    // A storage backend cannot change live: refused whole, naming the key.
    rewrite(&gw, |t| {
        format!(
            "[sms.pending]\nbackend = \"file\"\n[storage.file]\ndir = \"{}\"\n{t}",
            gw.data_dir().display()
        )
    });
    let (status, body) = post_reload(&gw).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("sms.pending cannot change while Sendium runs"),
        "{body}"
    );
    assert_eq!(
        config_view(&gw).await["digest"],
        digest,
        "the running configuration is unchanged"
    );
    let r = gw
        .post_message("key-1", r#"{"from":"Shop","to":"447700900901","text":"still serving"}"#)
        .await
        .unwrap();
    assert_eq!(r.status, 202, "{}", r.text());
    assert!(smsc.wait_for(WAIT, |s| !s.messages_to("447700900901").is_empty()).await);

    // A file that does not load: 400, nothing changes.
    std::fs::write(gw.config_path(), "[smpp\n").unwrap();
    let (status, body) = post_reload(&gw).await;
    assert_eq!(status, 400, "{body}");

    // Removing esme2 unbinds its session; esme1 stays.
    let original = gw.config().to_owned();
    std::fs::write(
        gw.config_path(),
        original.replace(
            "[[smpp.accounts]]\nsystem-id = \"esme2\"\npassword = \"secret2\"\nmax-binds = 2\n",
            "",
        ),
    )
    .unwrap();
    let (status, body) = post_reload(&gw).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["changes"]["accounts_removed"],
        serde_json::json!(["esme2"]),
        "{body}"
    );
    assert_eq!(body["changes"]["sessions_unbound"], 1, "{body}");
    assert!(eventually(WAIT, || esme2.is_closed()).await, "esme2 was unbound");
    assert!(
        TestEsme::bind(gw.smpp_addr(), "esme2", "secret2", BindKind::Transceiver)
            .await
            .is_err(),
        "esme2 is gone"
    );
    assert!(
        TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
            .await
            .is_ok()
    );
    assert!(wait_metric(&gw, "sendium_config_reloads_total", "outcome=\"refused\"", |n| n == 1.0).await);
    assert!(wait_metric(&gw, "sendium_config_reloads_total", "outcome=\"invalid\"", |n| n == 1.0).await);
}

/// A destination at a second SMSC (`{smsc2_port}`), under its own system id.
const AT_SMSC2: &str = r#"
[[destinations]]
name = "other"
kind = "smpp"
host = "127.0.0.1"
port = {smsc2_port}
system-id = "other"
password = "pw"
window = 200
reconnect-min = "50ms"
reconnect-max = "500ms"
response-timeout = "2s"
"#;

async fn any_credentials_smsc() -> TestSmsc {
    TestSmsc::start(SmscConfig {
        accounts: Vec::new(),
        ..SmscConfig::default()
    })
    .await
}

async fn reload_ok(gw: &GatewayProcess) -> serde_json::Value {
    let (status, body) = post_reload(gw).await;
    assert_eq!(status, 200, "{body}\n{}", gw.log());
    body["changes"]["destinations"].clone()
}

fn destination_names(body: &str) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destinations_are_added_changed_and_removed_live_while_an_esme_submits_and_nothing_is_lost() {
    let smsc = any_credentials_smsc().await;
    let smsc2 = any_credentials_smsc().await;
    let gw = GatewayProcess::builder(&memory_config())
        .smsc_port(smsc.port())
        .start()
        .await;
    assert!(smsc.wait_bound(1, WAIT).await);
    let (stop, streaming) = bind_and_stream(&gw, "4477").await;
    assert!(smsc.wait_messages(100, WAIT).await);

    // Add a destination and send the default route there.
    let other = AT_SMSC2.replace("{smsc2_port}", &smsc2.port().to_string());
    rewrite(&gw, |t| t.replace("to = [\"upstream\"]", "to = [\"other\"]") + &other);
    let changes = reload_ok(&gw).await;
    assert_eq!(changes["added"], serde_json::json!(["other"]), "{changes}");
    assert!(smsc2.wait_bound(1, WAIT).await, "the new destination binds");
    assert!(smsc2.wait_messages(100, WAIT).await, "new traffic goes there");
    assert!(
        smsc.wait_for(WAIT, |s| s.stats().receipts_acked >= s.messages().len() as u64)
            .await,
        "the old destination sent every receipt it owed"
    );

    // Change it: its session is re-established with the new settings.
    let binds = smsc2.stats().binds;
    rewrite(&gw, |t| {
        let at = t.rfind("window = 200").unwrap();
        format!("{}window = 50{}", &t[..at], &t[at + "window = 200".len()..])
    });
    let changes = reload_ok(&gw).await;
    assert_eq!(changes["changed"], serde_json::json!(["other"]), "{changes}");
    assert!(
        smsc2.wait_for(WAIT, |s| s.stats().binds > binds).await,
        "the changed destination bound again"
    );
    let seen = smsc2.messages().len();
    assert!(
        smsc2.wait_for(WAIT, |s| s.messages().len() > seen + 100).await,
        "traffic goes on over the new session"
    );

    // Remove the destination nothing routes to any more: its session ends.
    rewrite(&gw, |t| {
        let start = t.find("[[destinations]]\nname = \"upstream\"").unwrap();
        let end = start + t[start..].find("\n\n").unwrap_or(t.len() - start);
        format!("{}{}", &t[..start], &t[end..])
    });
    let changes = reload_ok(&gw).await;
    assert_eq!(changes["removed"], serde_json::json!(["upstream"]), "{changes}");
    assert!(
        smsc.wait_for(WAIT, |s| s.bound_sessions().is_empty()).await,
        "the removed destination unbound"
    );
    let (status, body) = gw.admin_get("/admin/destinations").await;
    assert_eq!(status, 200);
    assert_eq!(destination_names(&body), vec!["other".to_string()]);

    let seen = smsc2.messages().len();
    assert!(smsc2.wait_for(WAIT, |s| s.messages().len() > seen + 50).await);
    stop.store(true, Ordering::Relaxed);
    let (esme, acked) = streaming.await.unwrap();
    assert!(!esme.is_closed(), "the ESME stayed bound through three reloads");

    // Every acknowledged message reached exactly one SMSC exactly once, and its
    // receipt came back.
    let delivered = || -> Vec<String> {
        smsc.messages()
            .into_iter()
            .chain(smsc2.messages())
            .map(|m| m.destination)
            .collect()
    };
    assert!(
        eventually(WAIT, || {
            let all: std::collections::HashSet<String> = delivered().into_iter().collect();
            acked.keys().all(|d| all.contains(d))
        })
        .await,
        "every acknowledged message was delivered"
    );
    let mut per_destination = std::collections::HashMap::new();
    for d in delivered() {
        *per_destination.entry(d).or_insert(0usize) += 1;
    }
    let twice: Vec<_> = per_destination.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "sent twice: {twice:?}");
    let ids: std::collections::HashSet<String> = acked.values().cloned().collect();
    let receipts = esme.wait_receipts(ids.len(), WAIT).await;
    one_receipt_per_id(&receipts, &ids);
    assert!(gw.log().contains("destination worker retired"), "{}", gw.log());
    // Its series left /metrics with it (a stale sendium_destination_up would keep an
    // alert on it firing until a restart); the remaining destination's stay.
    let (status, metrics) = gw.admin_get("/metrics").await;
    assert_eq!(status, 200);
    assert!(
        !metrics.contains("destination=\"upstream\"") && !metrics.contains("destination-worker:upstream"),
        "{metrics}"
    );
    assert!(
        metrics.contains("sendium_destination_up{destination=\"other\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_waiting_for_a_removed_destination_is_routed_again_or_fails_with_a_receipt() {
    // `upstream` never binds: its work waits for it.
    let smsc = any_credentials_smsc().await;
    smsc.faults().reject_binds(Some(rusmpp::CommandStatus::EsmeRbindfail));
    let smsc2 = any_credentials_smsc().await;
    let other = AT_SMSC2.replace("{smsc2_port}", &smsc2.port().to_string());
    let config = format!(
        "{SMPP}{HTTP}{ADMIN}{UPSTREAM}{other}\n\
         [[routes]]\nname = \"uk\"\ndestination-prefix = \"44\"\nto = [\"upstream\"]\n\n\
         [[routes]]\nname = \"fr\"\ndestination-prefix = \"33\"\nto = [\"upstream\"]\n"
    );
    let gw = GatewayProcess::builder(&config).smsc_port(smsc.port()).start().await;
    assert!(smsc2.wait_bound(1, WAIT).await);
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let specs: Vec<SubmitSpec> = (0..10)
        .map(|i| {
            let to = if i % 2 == 0 {
                format!("4470000000{i}")
            } else {
                format!("3360000000{i}")
            };
            SubmitSpec::gsm("Shop", &to, "waiting").dlr()
        })
        .collect();
    let ids = submit_all_ok(&esme, &specs).await;
    let (_, body) = gw.admin_get("/admin/destinations").await;
    assert!(
        body.contains("\"waiting\":10"),
        "the messages wait for upstream: {body}"
    );

    // Remove `upstream`: the UK messages now route to `other`, the French ones match
    // no route any more.
    rewrite(&gw, |t| {
        let start = t.find("[[destinations]]\nname = \"upstream\"").unwrap();
        let end = start + t[start..].find("\n\n").unwrap();
        let routes = t.find("[[routes]]").unwrap();
        format!(
            "{}{}[[routes]]\nname = \"uk\"\ndestination-prefix = \"44\"\nto = [\"other\"]\n",
            &t[..start],
            &t[end..routes]
        )
    });
    let changes = reload_ok(&gw).await;
    assert_eq!(changes["removed"], serde_json::json!(["upstream"]), "{changes}");

    assert!(
        smsc2.wait_messages(5, WAIT).await,
        "the UK messages went to the current route"
    );
    assert!(smsc2.messages().iter().all(|m| m.destination.starts_with("44")));
    let receipts = esme.wait_receipts(ids.len(), WAIT).await;
    let by_id = one_receipt_per_id(&receipts, &ids);
    let failed: Vec<_> = by_id.values().filter(|r| r.err.as_deref() == Some("001")).collect();
    assert_eq!(
        failed.len(),
        5,
        "the French messages failed as unroutable: {receipts:?}"
    );
    assert!(failed.iter().all(|r| r.source.starts_with("33")), "{failed:?}");
    assert!(
        by_id
            .values()
            .filter(|r| r.source.starts_with("44"))
            .all(|r| r.state() == Some(sendium_integration_tests::ReceiptState::Delivered)),
        "{receipts:?}"
    );
}
