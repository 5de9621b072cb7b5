//! Shared pieces of the gateway tests: configuration templates and waiting helpers.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sendium_integration_tests::{BindKind, GatewayProcess, Receipt, SmscConfig, SubmitSpec, TestEsme, TestSmsc};

pub const WAIT: Duration = Duration::from_secs(30);

/// The SMPP listener and accounts (`esme1`/`secret`, `esme2`/`secret2`).
pub const SMPP: &str = r#"
[smpp]
listen = "127.0.0.1:{smpp_port}"
window = 1000
[[smpp.accounts]]
system-id = "esme1"
password = "secret"
max-binds = 8
[[smpp.accounts]]
system-id = "esme2"
password = "secret2"
max-binds = 2
"#;

/// The HTTP ingress with key `key-1` for `esme1`.
pub const HTTP: &str = r#"
[http]
listen = "127.0.0.1:{http_port}"
callback-allow = ["127.0.0.0/8", "::1/128"]
[[http.api-keys]]
key = "key-1"
account = "esme1"
"#;

/// Kannel's user guide's sendsms user (`tester`/`foobar`), for `esme1`.
pub const SENDSMS_USERS: &str = r#"
[[http.sendsms-users]]
username = "tester"
password = "foobar"
account = "esme1"
"#;

pub const ADMIN: &str = r#"
[admin]
listen = "127.0.0.1:{admin_port}"
[log]
level = "info"
"#;

/// One destination `upstream` at the test SMSC and a default route to it.
pub const UPSTREAM: &str = r#"
[[destinations]]
name = "upstream"
kind = "smpp"
host = "127.0.0.1"
port = {smsc_port}
system-id = "sendium"
password = "pw"
window = 200
reconnect-min = "50ms"
reconnect-max = "500ms"
response-timeout = "2s"
enquire-link-interval = "5s"
"#;

pub const DEFAULT_ROUTE: &str = r#"
[[routes]]
name = "default"
to = ["upstream"]
"#;

/// The memory profile gateway with everything: SMPP, HTTP, admin, one upstream.
pub fn memory_config() -> String {
    [SMPP, HTTP, ADMIN, UPSTREAM, DEFAULT_ROUTE].concat()
}

pub async fn smsc() -> TestSmsc {
    TestSmsc::start(SmscConfig::default()).await
}

pub async fn gateway(config: &str, smsc: &TestSmsc) -> GatewayProcess {
    GatewayProcess::builder(config).smsc_port(smsc.port()).start().await
}

/// Check the receipts an ESME got: exactly one per expected id, each with a final state.
/// Returns the receipts by id.
pub fn one_receipt_per_id<'a>(receipts: &'a [Receipt], expected: &HashSet<String>) -> HashMap<String, &'a Receipt> {
    let mut by_id: HashMap<String, &Receipt> = HashMap::new();
    for r in receipts {
        let id = r.message_id().expect("a receipt without an id").to_string();
        assert!(expected.contains(&id), "a receipt for an id nobody was given: {id}");
        assert!(by_id.insert(id.clone(), r).is_none(), "two receipts for {id}");
    }
    let missing: Vec<_> = expected.iter().filter(|id| !by_id.contains_key(*id)).take(5).collect();
    assert!(
        missing.is_empty(),
        "{} receipts missing, e.g. {missing:?}",
        expected.len() - by_id.len()
    );
    by_id
}

/// Poll until `f` is true or the timeout passes.
pub async fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A metric's value from the Prometheus text (sum over label sets matching `labels`).
pub fn metric(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            let key = l.split_whitespace().next().unwrap_or("");
            key == name || (key.starts_with(&format!("{name}{{")) && key.contains(labels))
        })
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .sum()
}

/// The gateway's DLR, receipt and stage metrics, for a failure message.
pub async fn dlr_metrics(gw: &GatewayProcess) -> String {
    let (_, metrics) = gw.admin_get("/metrics").await;
    metrics
        .lines()
        .filter(|l| !l.starts_with('#') && (l.contains("dlr") || l.contains("receipt") || l.contains("stage")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Wait until a metric satisfies `ok` (scraping `/metrics`).
pub async fn wait_metric(gw: &GatewayProcess, name: &str, labels: &str, ok: impl Fn(f64) -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (_, text) = gw.admin_get("/metrics").await;
        if ok(metric(&text, name, labels)) {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            eprintln!("{name}{{{labels}}} = {}", metric(&text, name, labels));
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// file/file/file with the given DLR section (and the memory profile's listeners,
/// destination and route).
pub fn durable_config(dlr: &str) -> String {
    durable_config_with(dlr, &memory_config())
}

/// file/file/file with the given DLR section over `base` (listeners, destinations,
/// routes).
pub fn durable_config_with(dlr: &str, base: &str) -> String {
    format!(
        "[sms.pending]\nbackend = \"file\"\n[sms.router-queue]\nbackend = \"file\"\n[sms.routed-work]\nbackend = \"file\"\n\
         [storage.file]\ndir = \"{{data_dir}}\"\n{dlr}\n{base}"
    )
}

pub const DLR_FILE: &str = "[dlr]\nbackend = \"file\"";
pub const DLR_MEMORY: &str = "[dlr]\nbackend = \"memory\"";

/// The DLR section of a postgresql DLR store at `url`.
pub fn pg_dlr(url: &str) -> String {
    format!("[dlr]\nbackend = \"postgresql\"\n[storage.postgresql]\nurl = \"{url}\"")
}

/// SIGKILL the gateway, drop the old session, restart on the same data and bind anew.
pub async fn kill_and_rebind(gw: &mut GatewayProcess, old: TestEsme, kind: BindKind) -> TestEsme {
    gw.kill();
    drop(old);
    gw.restart().await;
    TestEsme::bind(gw.smpp_addr(), "esme1", "secret", kind).await.unwrap()
}

/// Submit `specs` (20 in flight) and return their message ids: every one acknowledged,
/// each under an id of its own.
pub async fn submit_all_ok(esme: &TestEsme, specs: &[SubmitSpec]) -> HashSet<String> {
    let mut ids = HashSet::new();
    for o in esme.submit_pipelined(specs, 20).await {
        assert!(o.is_ok(), "a submit was not acknowledged: {:?}", o.status);
        assert!(ids.insert(o.message_id.clone()), "two submits got id {}", o.message_id);
    }
    ids
}

/// Submit `n` receipt-requesting messages (destinations `44{tag}{i:04}`) and wait until
/// their sources completed: the DLR store alone owns the receipts now.
pub async fn submit_and_hand_off(gw: &GatewayProcess, esme: &TestEsme, n: usize, tag: &str) -> HashSet<String> {
    let specs: Vec<SubmitSpec> = (0..n)
        .map(|i| SubmitSpec::gsm("1", &format!("44{tag}{i:04}"), "receipt later").dlr())
        .collect();
    let ids = submit_all_ok(esme, &specs).await;
    assert!(
        wait_metric(gw, "sendium_stage_records", "stage=\"pending\"", |v| v == 0.0).await,
        "sources completed after handoff"
    );
    ids
}

/// Run `sendium drain --config CONFIG` against the stopped `gw`'s data directory: bind a
/// receiver for esme1 to the draining gateway, check it gets exactly one receipt per id,
/// and wait for the drain to finish successfully. Its stdout.
pub async fn drain_delivering_receipts(gw: &GatewayProcess, config: &std::path::Path, ids: &HashSet<String>) -> String {
    let drain = sendium_integration_tests::sendium_command()
        .args(["drain", "--timeout", "60s", "--config"])
        .arg(config)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The receipts go to the account's ESME, which binds to the draining gateway.
    let deadline = tokio::time::Instant::now() + WAIT;
    let rx = loop {
        match TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Receiver).await {
            Ok(rx) => break rx,
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no draining gateway to bind: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let receipts = rx.wait_receipts(ids.len(), WAIT).await;
    one_receipt_per_id(&receipts, ids);
    let out = tokio::task::spawn_blocking(move || drain.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("drain: done"), "{stdout}");
    stdout
}

/// Bind `esme1` and [`stream_with_receipts`] in a task, 10 ms apart; set the flag to stop.
pub async fn bind_and_stream(
    gw: &GatewayProcess,
    prefix: &'static str,
) -> (
    Arc<AtomicBool>,
    tokio::task::JoinHandle<(TestEsme, HashMap<String, String>)>,
) {
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let streaming = tokio::spawn(stream_with_receipts(
        esme,
        prefix,
        Duration::from_millis(10),
        stop.clone(),
    ));
    (stop, streaming)
}

/// Submit with receipts — 20 pipelined, then `pause`, fresh destinations
/// `<prefix><6 digits>` — until `stop` or the session is gone; the acknowledged
/// destinations and their message ids.
pub async fn stream_with_receipts(
    esme: TestEsme,
    prefix: &'static str,
    pause: Duration,
    stop: Arc<AtomicBool>,
) -> (TestEsme, HashMap<String, String>) {
    let mut acked = HashMap::new();
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) && !esme.is_closed() {
        let specs: Vec<SubmitSpec> = (0..20)
            .map(|i| SubmitSpec::gsm("Shop", &format!("{prefix}{:06}", n + i), "streamed").dlr())
            .collect();
        n += specs.len();
        for (spec, o) in specs.iter().zip(esme.submit_pipelined(&specs, 20).await) {
            if o.is_ok() {
                acked.insert(spec.destination.clone(), o.message_id.clone());
            }
        }
        tokio::time::sleep(pause).await;
    }
    (esme, acked)
}
