//! The command line and the admin endpoints of the real binary: `check-config`, startup
//! refusal of unsupported profiles and invalid keys, environment overrides, and the
//! admin views with and without a token.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use sendium_integration_tests::loadgen::{self, LoadConfig, Mix};
use sendium_integration_tests::{GatewayProcess, SmscConfig, TestSmsc, render_template, sendium_command};
use serde_json::Value;
use support::*;

fn write_config(dir: &tempfile::TempDir, body: &str) -> std::path::PathBuf {
    let path = dir.path().join("sendium.toml");
    std::fs::write(&path, body).unwrap();
    path
}

fn config_with_ports(extra: &str) -> String {
    let vars = [
        ("smpp_port", sendium_integration_tests::free_port().to_string()),
        ("http_port", sendium_integration_tests::free_port().to_string()),
        ("admin_port", sendium_integration_tests::free_port().to_string()),
        ("smsc_port", "1".to_string()),
        ("data_dir", "/tmp".to_string()),
    ];
    let vars: Vec<(&str, String)> = vars.iter().map(|(k, v)| (*k, v.clone())).collect();
    render_template(&format!("{extra}{}", memory_config()), &vars).unwrap()
}

/// Submit one message with a receipt request over SMPP and wait for the receipt.
/// Returns the message id.
async fn one_message_and_its_receipt(gw: &GatewayProcess, body: &str) -> String {
    let esme = sendium_integration_tests::TestEsme::bind(
        gw.smpp_addr(),
        "esme1",
        "secret",
        sendium_integration_tests::BindKind::Transceiver,
    )
    .await
    .unwrap();
    let resp = esme
        .submit(&sendium_integration_tests::SubmitSpec::gsm("1", "447700900777", body).dlr())
        .await
        .unwrap();
    esme.wait_receipts(1, WAIT).await;
    resp.message_id
}

#[test]
fn check_config_prints_the_profile_and_its_restart_guarantee() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(&dir, &config_with_ports(""));
    let out = sendium_command().arg("check-config").arg(&path).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("storage profile: memory/memory/memory + dlr memory"),
        "{stdout}"
    );
    assert!(stdout.contains("nothing survives"), "{stdout}");
    assert!(
        stdout.contains("acknowledged messages survive a restart: NO"),
        "{stdout}"
    );
}

#[test]
fn check_config_lists_outbox_sources_and_warns_about_a_memory_pending_stage() {
    let dir = tempfile::tempdir().unwrap();
    let source = "[[outbox.sources]]\nname = \"shop\"\nurl = \"postgres://app:pw@127.0.0.1/shop\"\npartitions = 4\n";
    let path = write_config(&dir, &config_with_ports(source));
    let out = sendium_command().arg("check-config").arg(&path).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("shop (postgresql, table sendium_outbox, 4 partition(s), batch 500)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("NOTE: a relayed row leaves the outbox once admitted"),
        "{stdout}"
    );
    assert!(!stdout.contains("pw@"), "the URL is not printed: {stdout}");
}

#[test]
fn unsupported_profile_is_refused_naming_keys_and_supported_choices() {
    let dir = tempfile::tempdir().unwrap();
    let body = config_with_ports(
        "[sms.pending]\nbackend = \"postgresql\"\n[storage.postgresql]\nurl = \"postgres://x@127.0.0.1/x\"\n",
    );
    let path = write_config(&dir, &body);
    for cmd in [vec!["check-config"], vec!["serve", "--config"]] {
        let out = sendium_command().args(&cmd).arg(&path).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {stderr}");
        assert!(stderr.contains("sms.pending.backend"), "{stderr}");
        assert!(
            stderr.contains("memory/memory/memory")
                && stderr.contains("file/file/file")
                && stderr.contains("dlr.backend memory, file, postgresql or disabled"),
            "lists the supported choices: {stderr}"
        );
    }
}

#[test]
fn invalid_values_and_unknown_keys_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(&dir, &config_with_ports("[sms.router-queue]\nbackend = \"fil\"\n"));
    let out = sendium_command().arg("check-config").arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr.contains("sms.router-queue.backend"), "{stderr}");
    assert!(stderr.contains("memory, file, postgresql"), "{stderr}");

    let path = write_config(&dir, &config_with_ports("[sms]\nmultipart-expiri = \"1m\"\n"));
    let out = sendium_command().arg("check-config").arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr.contains("sms.multipart-expiri"), "{stderr}");
}

#[test]
fn environment_overrides_kebab_case_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(&dir, &config_with_ports(""));
    let out = sendium_command()
        .arg("check-config")
        .arg(&path)
        .env("SENDIUM__SMS__ROUTER_QUEUE__BACKEND", "postgresql")
        .env("SENDIUM__STORAGE__POSTGRESQL__URL", "postgres://x@127.0.0.1/x")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "the override reached sms.router-queue.backend: {stderr}"
    );
    assert!(stderr.contains("sms.router-queue.backend = \"postgresql\""), "{stderr}");
}

#[tokio::test]
async fn admin_endpoints_report_readiness_actors_profile_and_metrics() {
    let smsc = smsc().await;
    let gw = gateway(&memory_config(), &smsc).await;
    let (status, body) = gw.admin_get("/healthz").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = gw.admin_get("/readyz").await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["ready"], true);
    assert_eq!(v["profile"]["pending"], "memory");
    assert_eq!(v["profile"]["router-queue"], "memory");
    assert_eq!(v["profile"]["routed-work"], "memory");
    assert_eq!(v["profile"]["dlr"], "memory");

    let (_, body) = gw.admin_get("/admin/actors").await;
    let actors: Vec<Value> = serde_json::from_str(&body).unwrap();
    let kinds: Vec<&str> = actors.iter().map(|a| a["kind"].as_str().unwrap()).collect();
    for k in [
        "supervisor",
        "ingress",
        "selector",
        "router",
        "destination-worker",
        "dlr-correlator",
    ] {
        assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
    }
    for a in &actors {
        for field in ["name", "kind", "status", "restarts", "mailbox", "queued"] {
            assert!(a.get(field).is_some(), "{field} missing in {a}");
        }
    }

    let (_, body) = gw.admin_get("/admin/profile").await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["durable"], false);
    assert!(
        v["restart_guarantee"]["outbound"]
            .as_str()
            .unwrap()
            .contains("nothing survives")
    );

    // A message through, then the metrics show it — without per-message labels.
    let message_id = one_message_and_its_receipt(&gw, "secret body").await;
    assert!(wait_metric(&gw, "sendium_receipts_delivered_total", "", |v| v >= 1.0).await);
    let (_, metrics) = gw.admin_get("/metrics").await;
    for name in [
        "sendium_admitted_total",
        "sendium_stage_records",
        "sendium_pending_oldest_age_seconds",
        "sendium_actor_restarts",
        "sendium_smpp_pdus_total",
        "sendium_destination_submits_total",
        // The admission latency histogram, with its configured fine buckets.
        "sendium_admission_seconds_bucket{le=\"0.005\"}",
        "sendium_admission_seconds_count",
    ] {
        assert!(metrics.contains(name), "{name} missing");
    }
    assert!(!metrics.contains(&message_id), "no per-message ids in metrics");
    assert!(!metrics.contains("secret body"), "no bodies in metrics");
    assert!(!gw.log().contains("secret body"), "no bodies in logs");
    assert!(!gw.log().contains(&message_id), "no message ids in logs");
}

/// Every durable acknowledgement waits for a disk sync: `/metrics` shows how long each
/// store file's syncs take, so an operator can tell a slow disk from a slow gateway.
#[tokio::test]
async fn file_profiles_show_each_store_files_sync_times_in_metrics() {
    let smsc = smsc().await;
    let gw = gateway(&durable_config(DLR_FILE), &smsc).await;
    one_message_and_its_receipt(&gw, "hello").await;
    for file in ["journal", "router-queue.redb", "routed-work.redb", "dlr.redb"] {
        let labels = format!("file=\"{file}\"");
        assert!(
            wait_metric(&gw, "sendium_storage_fsync_seconds_count", &labels, |v| v >= 1.0).await,
            "no sync of {file} in /metrics"
        );
    }
    let (_, metrics) = gw.admin_get("/metrics").await;
    // The configured fine buckets, not a summary's quantiles.
    assert!(
        metrics.contains("sendium_storage_fsync_seconds_bucket{file=\"journal\",le=\"0.001\"}"),
        "{metrics}"
    );
    assert!(metric(&metrics, "sendium_storage_fsyncs_total", "") >= 4.0);
}

/// `sendium_admission_seconds` observes every submission once, however the sessions'
/// reads batched them: its count is the number of submissions answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_latency_is_observed_once_per_submission() {
    use sendium_integration_tests::loadgen::{self, LoadConfig, Mix};
    let smsc = smsc().await;
    let gw = gateway(&memory_config(), &smsc).await;
    let report = loadgen::run(LoadConfig {
        addr: gw.smpp_addr(),
        system_id: "esme1".into(),
        password: "secret".into(),
        sessions: 2,
        count: 400,
        window: 64,
        mix: Mix::parse("gsm=1").unwrap(),
        receipt_timeout: Duration::from_secs(20),
        ..LoadConfig::default()
    })
    .await
    .unwrap();
    assert_eq!(report.submits_ok, 400, "{report}");
    let (_, metrics) = gw.admin_get("/metrics").await;
    assert_eq!(metric(&metrics, "sendium_admission_seconds_count", ""), 400.0);
}

#[tokio::test]
async fn admin_token_is_required_when_configured() {
    let smsc = smsc().await;
    let config = memory_config().replace(
        "listen = \"127.0.0.1:{admin_port}\"",
        "listen = \"127.0.0.1:{admin_port}\"\ntoken = \"t0ken\"",
    );
    let gw = GatewayProcess::builder(&config)
        .smsc_port(smsc.port())
        .ready_timeout(Duration::from_secs(30))
        .start()
        .await;
    let (status, _) = gw.admin_get("/admin/actors").await;
    assert_eq!(status, 401);
    let (status, _) = gw.admin_get("/metrics").await;
    assert_eq!(status, 401);
    let (status, _) = gw.admin_get_with_token("/admin/actors", "wrong").await;
    assert_eq!(status, 401);
    let (status, _) = gw.admin_get_with_token("/admin/actors", "t0ken").await;
    assert_eq!(status, 200);
    let (status, _) = gw.admin_get("/readyz").await;
    assert_eq!(status, 200, "probes stay open");
}

#[test]
fn non_loopback_admin_without_token_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let body = config_with_ports("").replace("listen = \"127.0.0.1:", "listen = \"0.0.0.0:");
    let path = write_config(&dir, &body);
    let out = sendium_command().arg("check-config").arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("admin.token"), "{stderr}");
}

#[test]
fn outbox_schema_prints_the_shipped_sql_for_the_chosen_table() {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for (dialect, file) in [("postgresql", "postgresql.sql"), ("sqlite", "sqlite.sql")] {
        let shipped = std::fs::read_to_string(manifest.join("../outbox/sql").join(file)).unwrap();
        let out = sendium_command()
            .args(["outbox", "schema", "--dialect", dialect])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout), shipped, "{dialect}");
    }
    let out = sendium_command()
        .args(["outbox", "schema", "--table", "order_sms"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(stdout.contains("CREATE TABLE order_sms ("), "{stdout}");
    assert!(!stdout.contains("sendium_outbox"), "{stdout}");

    for (args, key) in [
        (&["outbox", "schema", "--table", "Order-SMS"][..], "--table"),
        (&["outbox", "schema", "--dialect", "mysql"][..], "--dialect"),
        (&["outbox", "schema", "--table"][..], "--table needs a value"),
        (&["outbox", "purge"][..], "unknown outbox command"),
    ] {
        let out = sendium_command().args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(key), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

/// `THP_enabled` of a running process, as the kernel reports it (Linux 5.0 and later).
fn transparent_huge_pages(gw: &GatewayProcess) -> String {
    let pid = gw.pid().expect("the gateway runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .map(|v| v.trim().to_owned())
        .expect("/proc/PID/status reports THP_enabled")
}

#[tokio::test]
async fn transparent_huge_pages_are_off_unless_sendium_allow_thp_is_set() {
    assert!(
        std::env::var_os("SENDIUM_ALLOW_THP").is_none(),
        "run this test without SENDIUM_ALLOW_THP in the environment"
    );
    let smsc = smsc().await;
    let gw = gateway(&memory_config(), &smsc).await;
    assert_eq!(transparent_huge_pages(&gw), "0");
    drop(gw);
    let gw = GatewayProcess::builder(&memory_config())
        .smsc_port(smsc.port())
        .env("SENDIUM_ALLOW_THP", "1")
        .start()
        .await;
    assert_eq!(transparent_huge_pages(&gw), "1");
}

fn resident_mib(gw: &GatewayProcess) -> f64 {
    let pid = gw.pid().expect("the gateway runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("/proc/PID/status reports VmRSS");
    kib / 1024.0
}

/// The README's promise that the heap shrinks with the pending backlog: messages held
/// while the destination is down take memory, and once they have gone out the
/// allocator's background thread gives it back to the kernel, without further traffic
/// to trigger it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_backlog_took_is_given_back_once_it_drains() {
    const MESSAGES: u64 = 60_000;
    let smsc_port = sendium_integration_tests::free_port();
    let gw = GatewayProcess::builder(&memory_config())
        .smsc_port(smsc_port)
        .start()
        .await;
    let before = resident_mib(&gw);
    let report = loadgen::run(LoadConfig {
        addr: gw.smpp_addr(),
        count: MESSAGES,
        window: 256,
        mix: Mix::parse("gsm=1").unwrap(),
        receipts: false,
        ..LoadConfig::default()
    })
    .await
    .unwrap();
    assert_eq!(report.submits_ok, MESSAGES, "{report}");
    let with_backlog = resident_mib(&gw);
    assert!(
        with_backlog - before >= 20.0,
        "the backlog should take memory: {before:.1} MiB before, {with_backlog:.1} with it"
    );
    let smsc = TestSmsc::start(SmscConfig {
        port: smsc_port,
        ..SmscConfig::default()
    })
    .await;
    assert!(
        smsc.wait_messages(MESSAGES, Duration::from_secs(120)).await,
        "the backlog drains"
    );
    let given_back = before + (with_backlog - before) / 2.0;
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    let mut now = resident_mib(&gw);
    while now > given_back && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        now = resident_mib(&gw);
    }
    assert!(
        now <= given_back,
        "{before:.1} MiB before the backlog, {with_backlog:.1} with it, still {now:.1} 40 s after it drained"
    );
}
