//! Fail closed: a held lock, a corrupt store, a full disk, and a profile change with
//! outstanding durable records all stop or refuse instead of acknowledging falsely, and
//! name what is wrong. `sendium drain` and `sendium inspect` finish and show the work.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashSet;
use std::time::Duration;

use sendium_integration_tests::{BindKind, CommandStatus, GatewayProcess, SubmitSpec, TestEsme, sendium_command};
use support::*;

fn file_config(profile: (&str, &str, &str)) -> String {
    format!(
        "[sms.pending]\nbackend = \"{}\"\n[sms.router-queue]\nbackend = \"{}\"\n[sms.routed-work]\nbackend = \"{}\"\n\
         [storage.file]\ndir = \"{{shared_dir}}\"\n{}",
        profile.0,
        profile.1,
        profile.2,
        memory_config()
    )
}

const FFF: (&str, &str, &str) = ("file", "file", "file");
const FMM: (&str, &str, &str) = ("file", "memory", "memory");

fn builder(config: &str, smsc_port: u16, dir: &std::path::Path) -> sendium_integration_tests::GatewayBuilder {
    GatewayProcess::builder(config)
        .smsc_port(smsc_port)
        .var("shared_dir", &dir.display().to_string())
}

#[tokio::test]
async fn a_second_process_on_the_same_data_directory_refuses_to_start() {
    let smsc = smsc().await;
    let dir = tempfile::tempdir().unwrap();
    let _first = builder(&file_config(FFF), smsc.port(), dir.path()).start().await;
    let mut second = builder(&file_config(FFF), smsc.port(), dir.path()).spawn();
    let status = second
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("the second gateway exits");
    assert!(!status.success());
    let log = second.log();
    assert!(log.contains("is locked by another Sendium process (pid"), "{log}");
    assert!(
        log.contains(&dir.path().display().to_string()),
        "names the directory: {log}"
    );
}

#[tokio::test]
async fn a_corrupt_or_truncated_store_stops_startup_naming_the_file() {
    let smsc = smsc().await;
    let dir = tempfile::tempdir().unwrap();
    let mut gw = builder(&file_config(FFF), smsc.port(), dir.path()).start().await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    smsc.faults().stop_answering(true);
    for i in 0..20 {
        assert!(
            esme.submit(&SubmitSpec::gsm("1", &format!("4450{i}"), "x"))
                .await
                .unwrap()
                .is_ok()
        );
    }
    gw.kill();
    let pending = dir.path().join("pending.redb");
    let bytes = std::fs::read(&pending).unwrap();
    for damage in ["header", "truncate"] {
        let mut b = bytes.clone();
        match damage {
            "header" => b[..64].iter_mut().for_each(|x| *x ^= 0x5A),
            // Into the file's first page: how much of a longer file is in use depends on
            // how far the killed process got, and a cut through unused space is no damage.
            _ => b.truncate(bytes.len().min(4096) / 3),
        }
        std::fs::write(&pending, &b).unwrap();
        let mut again = builder(&file_config(FFF), smsc.port(), dir.path()).spawn();
        let status = again
            .wait_exit(Duration::from_secs(20))
            .await
            .expect("refuses to start");
        assert!(!status.success(), "{damage}");
        let log = again.log();
        assert!(log.contains("pending.redb"), "{damage}: names the file: {log}");
        assert!(log.contains("corrupt"), "{damage}: {log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_admission_and_readiness_without_false_acknowledgements() {
    let smsc = smsc().await;
    let dir = tempfile::tempdir().unwrap();
    let mut gw = builder(&file_config(FFF), smsc.port(), dir.path())
        .env("SENDIUM_FAILPOINT", "disk-full=error@400")
        .start()
        .await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let mut acked = HashSet::new();
    let mut refused = 0;
    for i in 0..400 {
        let dest = format!("4451{i:04}");
        let r = esme.submit(&SubmitSpec::gsm("1", &dest, "disk")).await.unwrap();
        if r.is_ok() {
            acked.insert(dest);
        } else {
            assert!(
                [CommandStatus::EsmeRsyserr, CommandStatus::EsmeRmsgqful].contains(&r.status),
                "{:?}",
                r.status
            );
            refused += 1;
        }
    }
    assert!(refused > 0, "the disk filled up during the run");
    let (status, body) = gw.admin_get("/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("storage full"), "{body}");
    assert!(
        body.contains(".redb") || body.contains("journal."),
        "names the file: {body}"
    );
    // Restart with space again: everything that was acknowledged is delivered.
    gw.restart().await;
    let ok = smsc
        .wait_for(Duration::from_secs(60), |s| {
            let got: HashSet<String> = s.messages().into_iter().map(|m| m.destination).collect();
            acked.is_subset(&got)
        })
        .await;
    assert!(ok, "an acknowledged message was lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_change_with_outstanding_records_needs_a_drain() {
    let smsc = smsc().await;
    let dir = tempfile::tempdir().unwrap();
    let mut gw = builder(&file_config(FFF), smsc.port(), dir.path()).start().await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    // The provider is down: the work stays staged and routed.
    smsc.faults().stop_answering(true);
    let mut dests = HashSet::new();
    for i in 0..30 {
        let dest = format!("4452{i:03}");
        assert!(
            esme.submit(&SubmitSpec::gsm("1", &dest, "drain me"))
                .await
                .unwrap()
                .is_ok()
        );
        dests.insert(dest);
    }
    assert!(smsc.wait_submits(1, WAIT).await);
    gw.kill();
    smsc.faults().stop_answering(false);
    smsc.clear_records();

    // inspect shows the outstanding work.
    let config_path = gw.config_path().to_path_buf();
    let out = sendium_command()
        .args(["inspect", "--config"])
        .arg(&config_path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("pending:      30 records"), "{text}");
    // Killed before its next checkpoint: inspect applied the journal's frames.
    assert!(text.contains("pending journal frames applied"), "{text}");
    assert!(text.contains("written by storage profile file/file/file"), "{text}");

    // The new profile would abandon routed work: refused, naming the way out.
    let mut changed = builder(&file_config(FMM), smsc.port(), dir.path()).spawn();
    let status = changed
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("refuses to start");
    assert!(!status.success());
    let log = changed.log();
    assert!(log.contains("sendium drain"), "{log}");
    assert!(log.contains("file/file/file"), "{log}");
    assert!(log.contains("routed-work:"), "{log}");

    // Drain with the new configuration: it runs the recorded profile to the end.
    let out = sendium_command()
        .args(["drain", "--timeout", "60s", "--config"])
        .arg(changed.config_path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("drain: done"), "{stdout}");
    let got: HashSet<String> = smsc.messages().into_iter().map(|m| m.destination).collect();
    assert!(dests.is_subset(&got), "drain delivered everything");

    // Now the new profile starts.
    let mut fresh = builder(&file_config(FMM), smsc.port(), dir.path()).spawn();
    fresh.wait_ready().await;
    let (_, ready) = fresh.admin_get("/readyz").await;
    assert!(ready.contains("\"router-queue\":\"memory\""), "{ready}");
}

/// The storage engine fails (here: panics) while applying a pending commit whose clients
/// already have their answers. The journal frame is the truth: the store file is
/// reopened and the frame replayed before anything reads it, so every acknowledged
/// message is delivered once with its receipt, nothing stays pending, and the gateway
/// is ready again without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_failure_after_the_answer_loses_no_acknowledged_message() {
    let smsc = smsc().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = builder(&file_config(FFF), smsc.port(), dir.path())
        .env("SENDIUM_FAILPOINT", "pending-apply=panic@3")
        .start()
        .await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let specs: Vec<SubmitSpec> = (0..60)
        .map(|i| SubmitSpec::gsm("1", &format!("4452{i:04}"), "apply fails").dlr())
        .collect();
    let mut acked = HashSet::new();
    // One at a time, so the third commit holds exactly one answered admission.
    for spec in &specs {
        let r = esme.submit(spec).await.unwrap();
        assert!(r.is_ok(), "answered before the apply, so never refused: {:?}", r.status);
        assert!(acked.insert(r.message_id.clone()), "two submits got one id");
    }
    assert!(
        gw.log().contains("FAILPOINT pending-apply fired"),
        "the apply failed after an answer"
    );
    assert!(
        eventually(WAIT, || esme.receipts().len() >= acked.len()).await,
        "receipts for every acknowledged message ({} of {})",
        esme.receipts().len(),
        acked.len()
    );
    one_receipt_per_id(&esme.receipts(), &acked);
    let destinations: HashSet<String> = smsc.messages().into_iter().map(|m| m.destination).collect();
    assert_eq!(destinations.len(), specs.len(), "every message reached the SMSC");
    assert_eq!(smsc.messages().len(), specs.len(), "and none twice");
    assert!(
        wait_metric(&gw, "sendium_stage_records", "stage=\"pending\"", |v| v == 0.0).await,
        "nothing left pending"
    );
    let (status, body) = gw.admin_get("/readyz").await;
    assert_eq!(status, 200, "ready again after the reopen: {body}");
}
