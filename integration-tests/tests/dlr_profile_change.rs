//! Moving a gateway's DLR store out of PostgreSQL while that database still owes
//! receipts for its messages: the new profile is refused at startup (the data directory's
//! manifest says the DLR store was postgresql, and the database is asked what it still
//! holds), a configuration that no longer names the database is refused too (Sendium
//! cannot check it), and `sendium drain` runs the recorded postgresql profile until every
//! receipt was correlated and delivered. Then the new profile starts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use sendium_integration_tests::{BindKind, SmscConfig, TestEsme, TestSmsc};
use sendium_storage::postgresql::test_cluster::TestCluster;
use support::*;

const N: usize = 20;

/// `sendium serve` with this configuration, expected to refuse at startup: its stderr.
/// One still running after a while started, which fails the test (and is killed).
fn refused(config: &std::path::Path) -> String {
    let mut child = sendium_integration_tests::sendium_command()
        .args(["serve", "--config"])
        .arg(config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!("it started: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "it exited without an error: {stderr}");
    stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaving_a_postgresql_dlr_store_that_owes_receipts_needs_a_drain() {
    let url = TestCluster::shared().fresh_database();
    let smsc = TestSmsc::start(SmscConfig {
        receipt_delay: Duration::from_secs(2),
        ..SmscConfig::default()
    })
    .await;
    let mut gw = gateway(&durable_config(&pg_dlr(&url)), &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let ids = submit_and_hand_off(&gw, &esme, N, "38").await;
    gw.kill();
    drop(esme);
    assert_eq!(smsc.stats().receipts_sent, 0, "killed before any receipt was due");

    let recorded = std::fs::read_to_string(gw.config_path()).unwrap();
    // The new profile: file DLR, the database still configured (for the check and drain).
    let to_file = recorded.replacen("[dlr]\nbackend = \"postgresql\"", "[dlr]\nbackend = \"file\"", 1);
    assert_ne!(to_file, recorded);
    let to_file_path = gw.config_path().with_extension("file-dlr.toml");
    std::fs::write(&to_file_path, &to_file).unwrap();
    let stderr = refused(&to_file_path);
    assert!(
        stderr.contains("sendium drain") && stderr.contains(&format!("dlr (postgresql): {N}")),
        "{stderr}"
    );

    // The same without the database's address: Sendium cannot check, so it refuses.
    let start = to_file.find("[storage.postgresql]").unwrap();
    let end = start + to_file[start..].find("\n[").unwrap() + 1;
    let no_url = format!("{}{}", &to_file[..start], &to_file[end..]);
    assert!(!no_url.contains(&url), "{no_url}");
    let no_url_path = gw.config_path().with_extension("no-url.toml");
    std::fs::write(&no_url_path, &no_url).unwrap();
    let stderr = refused(&no_url_path);
    assert!(stderr.contains("storage.postgresql.url"), "{stderr}");

    // Drain runs the recorded profile: the receipts arrive, are matched in the database
    // and delivered to the account's ESME, which binds to the draining gateway.
    // Its first progress line finds the N receipts owed: still awaited from the provider,
    // or (when the provider's held receipts arrived as soon as the drain bound) matched
    // and waiting for delivery.
    let stdout = drain_delivering_receipts(&gw, &to_file_path, &ids).await;
    assert!(
        stdout.contains(&format!("awaiting provider receipts {N}"))
            || stdout.contains(&format!("receipts to deliver {N}")),
        "it waited for the receipts the database owed: {stdout}"
    );

    // Nothing is owed any more: the file DLR profile starts.
    std::fs::write(gw.config_path(), &to_file).unwrap();
    gw.restart().await;
    let (status, profile) = gw.admin_get("/admin/profile").await;
    assert_eq!(status, 200);
    assert!(profile.contains("file"), "{profile}");
}
