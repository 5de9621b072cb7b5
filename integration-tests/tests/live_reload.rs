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
