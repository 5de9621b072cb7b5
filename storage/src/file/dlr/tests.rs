//! Test-only module: compiled under `#[cfg(test)]` (see its `mod` declaration).
//!
//! File DLR store tests beyond the conformance suite: everything surviving a clean
//! reopen and SIGKILL (in a child process), a large handoff/receipt round, damaged
//! values, a full disk, and (ignored) benchmarks.
//!
//! Child processes re-run this test binary on [`child_process`] with
//! `SENDIUM_DLR_CHILD` set; without it that test returns at once.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redb::{Durability, ReadableTable};

use super::records::{corr_key, track_key};
use super::tx::{
    CORRELATIONS, DELIVERIES, DUE, INBOUND_DUE, INBOUND_GROUPS, INBOUND_OPEN, INBOUND_PARTS, NEXT_GROUP, ORPHAN_EXPIRY,
    ORPHANS, SMPP_BY_ACCOUNT, TRACK_EXPIRY, TRACKS,
};
use super::{FileDlrStore, WAKE_BATCH};
use crate::conformance::fixtures::{handoff, outcome_of, receipt, retention, target};
use crate::conformance::ops::DlrOps as _;
use crate::dlr::{
    ClaimScope, DeliveryFinish, DeliveryId, DeliveryResult, DlrRetention, DlrState, DlrStore, Handoff, HandoffOutcome,
    ProviderReceipt, ReceiptMatch, ReceiptOutcome, ReplyPath,
};
use crate::error::FailureKind;
use crate::file::engine::db::META;
use crate::file::engine::journaled::JOURNAL_LSN;
use crate::file::{DataDir, FileOptions};
use crate::ids::{MessageId, Timestamp};

const CHILD_VAR: &str = "SENDIUM_DLR_CHILD";
const CHILD_DIR: &str = "SENDIUM_DLR_DIR";
const LEASE: Duration = Duration::from_secs(30);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn open(path: &Path) -> (Arc<DataDir>, FileDlrStore) {
    let dir = Arc::new(DataDir::open(path).unwrap());
    let store = FileDlrStore::open(&dir, retention()).unwrap();
    (dir, store)
}

fn http() -> ReplyPath {
    ReplyPath::Http {
        url: "http://127.0.0.1:1/cb".into(),
    }
}

fn done(id: DeliveryId, attempt: u32, result: DeliveryResult) -> DeliveryFinish {
    DeliveryFinish { id, attempt, result }
}

/// Every table of the file, entry by entry, as text: two dumps are equal exactly when
/// the stores hold the same state.
fn dump(store: &FileDlrStore) -> String {
    macro_rules! table {
        ($out:ident, $txn:ident, $def:expr, $k:ident => $kf:expr, $v:ident => $vf:expr) => {{
            let t = $txn.open_table($def)?;
            writeln!($out, "[{}] {}", $def, redb::ReadableTableMetadata::len(&t)?).ok();
            for item in t.iter()? {
                let (k, v) = item?;
                let $k = k.value();
                let $v = v.value();
                writeln!($out, "{:?} => {:?}", $kf, $vf).ok();
            }
        }};
    }
    store
        .file()
        .read(|txn| {
            let mut out = String::new();
            table!(out, txn, TRACKS, k => k, v => v);
            table!(out, txn, TRACK_EXPIRY, k => k, v => v);
            table!(out, txn, CORRELATIONS, k => k, v => v);
            table!(out, txn, ORPHANS, k => k, v => v);
            table!(out, txn, ORPHAN_EXPIRY, k => k, v => v);
            table!(out, txn, DELIVERIES, k => k, v => v);
            table!(out, txn, DUE, k => k, v => v);
            table!(out, txn, SMPP_BY_ACCOUNT, k => k, v => v);
            table!(out, txn, INBOUND_GROUPS, k => k, v => v);
            table!(out, txn, INBOUND_OPEN, k => k, v => v);
            table!(out, txn, INBOUND_DUE, k => k, v => v);
            // The journal LSN is where the file stands in the journal, not the store's state.
            let meta = txn.open_table(META)?;
            for item in meta.iter()? {
                let (k, v) = item?;
                if k.value() != JOURNAL_LSN {
                    writeln!(out, "{:?} => {:?}", k.value(), v.value()).ok();
                }
            }
            Ok(out)
        })
        .unwrap()
}

/// What [`populate`] wrote, for the checks after a restart.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Written {
    /// Three parts, the first delivered.
    multi: MessageId,
    /// Resolved (DELIVRD) with an SMPP and an HTTP target.
    resolved: MessageId,
    /// Resubmitted: "r-old" replaced by "r-new".
    resubmitted: MessageId,
    /// A retried HTTP delivery: id, attempt, retry time.
    retried: (u64, u32, u64),
    /// A parked SMPP delivery: id, attempt.
    parked: (u64, u32),
    /// A failure receipt claimed and still leased: id, attempt, lease end.
    leased: (u64, u32, u64),
    /// A delivery created last and never claimed before the dump: id.
    fresh: u64,
    /// Time the claims were made at.
    now: u64,
}

/// Fill the store with every kind of state: awaiting tracks (one partly received, one
/// resubmitted), resolved tracks, an orphan, deliveries retried, parked, leased and due.
async fn populate(s: &FileDlrStore) -> Written {
    let multi = handoff(&["m1", "m2", "m3"], vec![target(ReplyPath::Smpp), target(http())]);
    let resolved = handoff(&["d1"], vec![target(ReplyPath::Smpp), target(http())]);
    let resubmitted = handoff(&["r-old"], vec![target(http())]);
    let mut failed = handoff(&[], vec![target(http())]);
    failed.outcome = HandoffOutcome::Failed(ReceiptOutcome {
        state: DlrState::Undeliverable,
        error: "001".into(),
        done_at: Timestamp::now(),
    });
    s.hand_off(vec![multi.clone(), resolved.clone(), resubmitted.clone(), failed])
        .await
        .unwrap();
    let mut again = resubmitted.clone();
    again.outcome = HandoffOutcome::Submitted {
        provider_keys: vec!["r-new".into()],
    };
    s.hand_off(vec![again]).await.unwrap();
    let m = s
        .record_receipts(vec![
            receipt("m1", DlrState::Delivered),
            receipt("d1", DlrState::Delivered),
            receipt("o1", DlrState::Delivered),
        ])
        .await
        .unwrap();
    assert_eq!(
        m,
        vec![
            ReceiptMatch::Matched {
                unit: multi.unit,
                resolved: false
            },
            ReceiptMatch::Matched {
                unit: resolved.unit,
                resolved: true
            },
            ReceiptMatch::Orphaned
        ]
    );
    let now = Timestamp::now().saturating_add(Duration::from_secs(1));
    let mut due = s.claim_due(now, LEASE, 10, ClaimScope::All).await.unwrap();
    due.sort_by_key(|d| d.id);
    assert_eq!(due.len(), 3, "two for the resolved branch, one failure receipt");
    let smpp = due.iter().find(|d| d.target.reply == ReplyPath::Smpp).unwrap();
    let https: Vec<_> = due.iter().filter(|d| d.target.reply != ReplyPath::Smpp).collect();
    let retry_at = now.saturating_add(Duration::from_secs(5));
    let park_until = now.saturating_add(Duration::from_secs(3000));
    s.finish(vec![
        done(https[0].id, https[0].attempt, DeliveryResult::Retry { at: retry_at }),
        done(smpp.id, smpp.attempt, DeliveryResult::Retry { at: park_until }),
    ])
    .await
    .unwrap();
    // A branch resolved last, by a failure: its delivery is due and never claimed.
    let last = handoff(&["f1"], vec![target(http())]);
    s.hand_off(vec![last]).await.unwrap();
    s.record_receipts(vec![receipt("f1", DlrState::Rejected)])
        .await
        .unwrap();
    let st = s.stats().await.unwrap();
    assert_eq!(
        (st.awaiting_receipts, st.pending_deliveries, st.orphans),
        (2, 4, 1),
        "{st:?}"
    );
    Written {
        multi: multi.unit,
        resolved: resolved.unit,
        resubmitted: resubmitted.unit,
        retried: (https[0].id.0, https[0].attempt, retry_at.0),
        parked: (smpp.id.0, smpp.attempt),
        leased: (https[1].id.0, https[1].attempt, now.saturating_add(LEASE).0),
        fresh: 4,
        now: now.0,
    }
}

/// Checks that hold after any restart of a store [`populate`] filled. `claimed_fresh`:
/// the fresh delivery's claim (attempt 1) survived.
async fn check_after_restart(s: &FileDlrStore, w: &Written, claimed_fresh: bool) {
    let now = Timestamp(w.now);
    let st = s.stats().await.unwrap();
    assert_eq!((st.awaiting_receipts, st.pending_deliveries, st.orphans), (2, 4, 1));
    assert_eq!(st.correlations, 7, "m1-3, d1, r-old, r-new, f1");
    // The fresh delivery: claimed again with attempt 1 if its claim was lost, else hidden
    // by its lease and next claimed with attempt 2.
    let c = s.claim_due(now, LEASE, 10, ClaimScope::All).await.unwrap();
    if claimed_fresh {
        assert!(c.is_empty(), "{c:?}");
    } else {
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!((c[0].id.0, c[0].attempt), (w.fresh, 1));
        assert_eq!(outcome_of(&c[0]).state, DlrState::Rejected);
    }
    // The retried delivery waits for its saved retry time, then continues its attempts.
    let retry_at = Timestamp(w.retried.2);
    let c = s.claim_due(retry_at, LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!((c[0].id.0, c[0].attempt), (w.retried.0, w.retried.1 + 1));
    // The leased one comes back when its saved lease ends.
    let lease_end = Timestamp(w.leased.2);
    let c = s.claim_due(lease_end, LEASE, 10, ClaimScope::All).await.unwrap();
    let leased: Vec<_> = c.iter().filter(|d| d.id.0 == w.leased.0).collect();
    assert_eq!(leased.len(), 1, "{c:?}");
    assert_eq!(leased[0].attempt, w.leased.1 + 1);
    s.finish(vec![done(leased[0].id, leased[0].attempt, DeliveryResult::Delivered)])
        .await
        .unwrap();
    // The parked SMPP receipt waits for its account to bind.
    assert_eq!(s.wake_account("esme1", lease_end).await.unwrap(), 1);
    let c = s.claim_due(lease_end, LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!((c[0].id.0, c[0].attempt), (w.parked.0, w.parked.1 + 1));
    // Resolved branches stay resolved: a repeated receipt is a duplicate, a repeated
    // handoff changes nothing.
    let m = s
        .record_receipts(vec![
            receipt("d1", DlrState::Delivered),
            receipt("r-old", DlrState::Delivered),
        ])
        .await
        .unwrap();
    assert_eq!(
        m,
        vec![
            ReceiptMatch::Duplicate { unit: w.resolved },
            ReceiptMatch::Duplicate { unit: w.resubmitted }
        ]
    );
    let mut repeat = handoff(&["d1"], vec![target(http())]);
    repeat.unit = w.resolved;
    s.hand_off(vec![repeat]).await.unwrap();
    assert_eq!(s.stats().await.unwrap().pending_deliveries, 3);
    // The partly received message completes with receipts that arrive after the restart;
    // new delivery ids continue after the stored counter.
    let m = s
        .record_receipts(vec![
            receipt("m2", DlrState::Delivered),
            receipt("m3", DlrState::Delivered),
            receipt("r-new", DlrState::Delivered),
        ])
        .await
        .unwrap();
    assert_eq!(
        m[1],
        ReceiptMatch::Matched {
            unit: w.multi,
            resolved: true
        }
    );
    // The orphan is matched by its handoff now.
    s.hand_off(vec![handoff(&["o1"], vec![target(http())])]).await.unwrap();
    let st = s.stats().await.unwrap();
    assert_eq!((st.awaiting_receipts, st.orphans, st.pending_deliveries), (0, 0, 7));
    let far = lease_end.saturating_add(Duration::from_secs(60));
    let mut c = s.claim_due(far, LEASE, 100, ClaimScope::All).await.unwrap();
    c.sort_by_key(|d| d.id);
    let new_ids: Vec<u64> = c.iter().map(|d| d.id.0).filter(|id| *id > w.fresh).collect();
    assert_eq!(
        new_ids,
        vec![5, 6, 7, 8],
        "2 for multi, 1 resubmitted, 1 orphan-resolved"
    );
}

/// A receipt owed to a Kannel `dlr-url` keeps its URL and mask across a reopen, from the
/// handoff to the delivery it resolves into.
#[test]
fn a_kannel_target_survives_a_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let kannel = ReplyPath::Kannel {
            url: "http://127.0.0.1:1/dlr?t=%d".into(),
            mask: 3,
        };
        let (dir, s) = open(tmp.path());
        s.hand_off(vec![handoff(&["k1"], vec![target(kannel.clone())])])
            .await
            .unwrap();
        drop(s);
        drop(dir);
        let (_dir, s) = open(tmp.path());
        s.record_receipts(vec![receipt("k1", DlrState::Delivered)])
            .await
            .unwrap();
        let due = s.claim_due(Timestamp::now(), LEASE, 10, ClaimScope::All).await.unwrap();
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].target.reply, kannel);
        assert_eq!(outcome_of(&due[0]).state, DlrState::Delivered);
    });
}

#[test]
fn everything_survives_a_clean_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (dir, s) = open(tmp.path());
        let w = populate(&s).await;
        // Claimed with Durability::None: a clean close keeps it.
        let c = s.claim_due(Timestamp(w.now), LEASE, 10, ClaimScope::All).await.unwrap();
        assert_eq!((c.len(), c[0].id.0, c[0].attempt), (1, w.fresh, 1));
        let before = dump(&s);
        drop(s);
        drop(dir);
        let (_dir, s) = open(tmp.path());
        assert_eq!(dump(&s), before, "every table, entry by entry");
        check_after_restart(&s, &w, true).await;
    });
}

fn child_mode() -> Option<(String, PathBuf)> {
    let mode = std::env::var(CHILD_VAR).ok()?;
    let dir = PathBuf::from(std::env::var(CHILD_DIR).ok()?);
    Some((mode, dir))
}

fn sigkill_self() -> ! {
    let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    std::process::abort()
}

fn killed(status: std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(9)
}

/// Re-run this test binary on [`child_process`] in `mode`; `BENCH` lines are passed on,
/// the rest shown when the child did not die by SIGKILL.
fn run_child(mode: &str, dir: &Path, extra_env: &[(&str, &str)]) {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args([
        "file::dlr::tests::child_process",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_VAR, mode)
    .env(CHILD_DIR, dir)
    .env_remove("SENDIUM_FAILPOINT");
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in stdout.lines().filter(|l| l.contains("BENCH")) {
        println!("{}", line.trim_start_matches(|c| c != 'B'));
    }
    assert!(
        killed(out.status),
        "child {mode} ended with {:?}\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The child side of the SIGKILL tests (ignored: only runs when a parent starts it).
#[test]
#[ignore = "child process of the SIGKILL tests"]
fn child_process() {
    let Some((mode, dir)) = child_mode() else {
        return;
    };
    let rt = runtime();
    match mode.as_str() {
        "populate-then-kill" => rt.block_on(async {
            let (_dir, s) = open(&dir);
            let w = populate(&s).await;
            std::fs::write(dir.join("expected.txt"), dump(&s)).unwrap();
            std::fs::write(dir.join("written.json"), serde_json::to_string(&w).unwrap()).unwrap();
            // A claim (its journal frame not waited for) after the last synced write, then
            // death before anything flushes it.
            s.journal().pause_ticks();
            let c = s.claim_due(Timestamp(w.now), LEASE, 10, ClaimScope::All).await.unwrap();
            assert_eq!(c.len(), 1);
            sigkill_self();
        }),
        "fill-then-kill" => rt.block_on(async {
            let n: usize = std::env::var("SENDIUM_TEST_RECORDS").unwrap().parse().unwrap();
            let quick_repair = std::env::var("SENDIUM_TEST_QUICK_REPAIR").is_ok();
            let dir = Arc::new(DataDir::open(&dir).unwrap());
            let options = FileOptions {
                quick_repair,
                ..FileDlrStore::default_options()
            };
            let s = FileDlrStore::open_with(&dir, retention(), options).unwrap();
            let started = Instant::now();
            let batch = 1000;
            let mut i = 0;
            while i < n {
                let hs: Vec<_> = (i..i + batch).map(|j| bench_handoff(j, 1)).collect();
                s.hand_off(hs).await.unwrap();
                i += batch;
            }
            let secs = started.elapsed().as_secs_f64();
            println!(
                "BENCH fill (quick repair {quick_repair}): {n} handoffs in {secs:.1} s ({:.0}/s, batches of {batch})",
                n as f64 / secs
            );
            sigkill_self();
        }),
        other => panic!("unknown child mode {other}"),
    }
}

#[test]
fn everything_survives_sigkill_and_a_lost_claim_is_claimed_again() {
    let tmp = tempfile::tempdir().unwrap();
    run_child("populate-then-kill", tmp.path(), &[]);
    let expected = std::fs::read_to_string(tmp.path().join("expected.txt")).unwrap();
    let w: Written = serde_json::from_str(&std::fs::read_to_string(tmp.path().join("written.json")).unwrap()).unwrap();
    runtime().block_on(async {
        // The lock died with the child; redb repairs the file (quick repair) and the
        // journal's frames are applied.
        let (_dir, s) = open(tmp.path());
        // Every durable commit survived; the claim after them (no fsync) did not: the
        // delivery is due again with the same attempt, so it goes again (at least once).
        assert_eq!(dump(&s), expected);
        check_after_restart(&s, &w, false).await;
    });
}

#[test]
fn ten_thousand_handoffs_then_ten_thousand_receipts_resolve_all() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (_dir, s) = open(tmp.path());
        let n = 10_000;
        let started = Instant::now();
        for chunk in (0..n).collect::<Vec<_>>().chunks(100) {
            s.hand_off(chunk.iter().map(|&i| bench_handoff(i, 1)).collect())
                .await
                .unwrap();
        }
        let handed = started.elapsed();
        assert_eq!(s.stats().await.unwrap().correlations, n as u64);
        let started = Instant::now();
        let mut resolved = 0;
        for chunk in (0..n).collect::<Vec<_>>().chunks(100) {
            let m = s
                .record_receipts(chunk.iter().map(|&i| bench_receipt(i, 0)).collect())
                .await
                .unwrap();
            resolved += m
                .iter()
                .filter(|m| matches!(m, ReceiptMatch::Matched { resolved: true, .. }))
                .count();
        }
        let received = started.elapsed();
        assert_eq!(resolved, n);
        let st = s.stats().await.unwrap();
        assert_eq!((st.awaiting_receipts, st.pending_deliveries), (0, n as u64));
        assert_eq!(st.correlations, n as u64, "kept until retention");
        let started = Instant::now();
        let mut claimed = 0;
        let now = Timestamp::now().saturating_add(Duration::from_secs(1));
        loop {
            let c = s.claim_due(now, LEASE, 1000, ClaimScope::All).await.unwrap();
            if c.is_empty() {
                break;
            }
            claimed += c.len();
            s.finish(c.iter().map(|d| done(d.id, d.attempt, DeliveryResult::Delivered)).collect())
                .await
                .unwrap();
        }
        let delivered = started.elapsed();
        assert_eq!(claimed, n);
        assert_eq!(s.stats().await.unwrap().pending_deliveries, 0);
        println!(
            "10k branches (batches of 100, durable): handoffs {:.0} ms, receipts {:.0} ms, claim+finish (batches of 1000) {:.0} ms",
            handed.as_secs_f64() * 1e3,
            received.as_secs_f64() * 1e3,
            delivered.as_secs_f64() * 1e3
        );
        // Indexed lookups: a scan per receipt would make this quadratic (10^8 steps).
        assert!(received < Duration::from_secs(60), "{received:?}");
    });
}

#[test]
fn multipart_receipts_in_one_batch_and_candidate_keys() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (_dir, s) = open(tmp.path());
        let mut t = target(ReplyPath::Smpp);
        t.failure_only = true;
        let h = handoff(&["a", "b"], vec![t, target(http())]);
        s.hand_off(vec![h.clone()]).await.unwrap();
        // Both parts in one batch, the second found by its second candidate key, then a
        // duplicate of the first in the same batch.
        let mut second = receipt("B-hex", DlrState::Delivered);
        second.keys.push("b".into());
        let m = s
            .record_receipts(vec![
                receipt("a", DlrState::Delivered),
                second,
                receipt("a", DlrState::Delivered),
            ])
            .await
            .unwrap();
        assert_eq!(
            m,
            vec![
                ReceiptMatch::Matched {
                    unit: h.unit,
                    resolved: false
                },
                ReceiptMatch::Matched {
                    unit: h.unit,
                    resolved: true
                },
                ReceiptMatch::Duplicate { unit: h.unit },
            ]
        );
        let c = s.claim_due(Timestamp::now(), LEASE, 10, ClaimScope::All).await.unwrap();
        assert_eq!(c.len(), 1, "the failure-only target is skipped on success");
        assert_eq!(c[0].target.reply, http());
        // A batch of duplicates changes nothing and commits nothing.
        let before = dump(&s);
        let m = s
            .record_receipts(vec![receipt("b", DlrState::Delivered)])
            .await
            .unwrap();
        assert_eq!(m, vec![ReceiptMatch::Duplicate { unit: h.unit }]);
        assert_eq!(dump(&s), before);
        // Ids are per destination: the same id at another destination is not this one.
        let mut other = receipt("a", DlrState::Delivered);
        other.destination = "other".into();
        assert_eq!(
            s.record_receipts(vec![other]).await.unwrap(),
            vec![ReceiptMatch::Orphaned]
        );
    });
}

#[test]
fn wake_account_walks_every_parked_receipt_in_bounded_transactions() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (_dir, s) = open(tmp.path());
        let n = WAKE_BATCH * 2 + 3;
        let hs: Vec<_> = (0..n).map(|i| bench_handoff(i, 1)).collect();
        s.hand_off(hs).await.unwrap();
        s.record_receipts((0..n).map(|i| bench_receipt(i, 0)).collect())
            .await
            .unwrap();
        let now = Timestamp::now().saturating_add(Duration::from_secs(1));
        let c = s.claim_due(now, LEASE, 100, ClaimScope::All).await.unwrap();
        assert_eq!(c.len(), n);
        let park = now.saturating_add(Duration::from_secs(3600));
        // All parked but one, which stays leased (in flight): a wake leaves it alone.
        s.finish(
            c.iter()
                .skip(1)
                .map(|d| done(d.id, d.attempt, DeliveryResult::Retry { at: park }))
                .collect(),
        )
        .await
        .unwrap();
        assert_eq!(s.wake_account("esme1", now).await.unwrap(), (n - 1) as u64);
        assert_eq!(s.wake_account("esme1", now).await.unwrap(), 0, "already due");
        assert_eq!(
            s.claim_due(now, LEASE, 100, ClaimScope::All).await.unwrap().len(),
            n - 1
        );
        // A stale result (the leased one's first attempt, after it was claimed again at
        // lease end) is ignored.
        let again = s
            .claim_due(now.saturating_add(LEASE), LEASE, 100, ClaimScope::All)
            .await
            .unwrap();
        let first = c[0].clone();
        let second = again.iter().find(|d| d.id == first.id).unwrap();
        assert_eq!(second.attempt, 2);
        s.finish(vec![done(first.id, first.attempt, DeliveryResult::Delivered)])
            .await
            .unwrap();
        assert_eq!(s.stats().await.unwrap().pending_deliveries, n as u64);
    });
}

#[test]
fn expiry_drops_resolved_tracks_with_their_correlations_in_bounded_batches() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let dir = Arc::new(DataDir::open(tmp.path()).unwrap());
        let short = DlrRetention {
            retention: Duration::from_secs(60),
            orphan_retention: Duration::from_secs(10),
        };
        let s = FileDlrStore::open(&dir, short).unwrap();
        let hs: Vec<_> = (0..5).map(|i| bench_handoff(i, 2)).collect();
        s.hand_off(hs).await.unwrap();
        // Two resolved, three awaiting; three orphans.
        s.record_receipts(
            [0, 1]
                .iter()
                .flat_map(|&i| [bench_receipt(i, 0), bench_receipt(i, 1)])
                .chain((100..103).map(|i| bench_receipt(i, 0)))
                .collect(),
        )
        .await
        .unwrap();
        let st = s.stats().await.unwrap();
        assert_eq!((st.awaiting_receipts, st.correlations, st.orphans), (3, 10, 3));
        let past = Timestamp::now().saturating_add(Duration::from_secs(120));
        let r = s.expire(past, 2).await.unwrap();
        assert_eq!(r.orphans, 2);
        assert_eq!(r.dead_deliveries, 2);
        let r2 = s.expire(past, 100).await.unwrap();
        assert_eq!(
            r.unresolved + r2.unresolved,
            3,
            "resolved tracks are not reported unresolved"
        );
        assert_eq!(r2.orphans, 1);
        let st = s.stats().await.unwrap();
        assert_eq!(
            (st.awaiting_receipts, st.correlations, st.orphans, st.pending_deliveries),
            (0, 0, 0, 0)
        );
        let d = dump(&s);
        assert!(
            d.lines()
                .filter(|l| l.starts_with('[') && !l.starts_with("[meta"))
                .all(|l| l.ends_with(" 0")),
            "every table but meta is empty:\n{d}"
        );
        // A receipt for an expired branch is an orphan now, not a second delivery.
        let m = s.record_receipts(vec![bench_receipt(0, 0)]).await.unwrap();
        assert_eq!(m, vec![ReceiptMatch::Orphaned]);
    });
}

/// Replace one stored value with garbage (through the open store's handle).
fn garble<K: redb::Key + 'static>(
    s: &FileDlrStore,
    def: redb::TableDefinition<K, &'static [u8]>,
    key: K::SelfType<'_>,
) {
    s.file()
        .write(Durability::Immediate, |txn| {
            let mut t = txn.open_table(def)?;
            t.insert(key, b"not an envelope, just garbage".as_slice())?;
            Ok(((), true))
        })
        .unwrap();
}

#[test]
fn a_corrupt_value_is_a_corrupt_error_naming_dlr_redb_and_its_table_only() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (dir, s) = open(tmp.path());
        let hs: Vec<_> = (0..3).map(|i| bench_handoff(i, 1)).collect();
        let middle = hs[1].clone();
        s.hand_off(hs).await.unwrap();
        s.record_receipts(vec![bench_receipt(0, 0), bench_receipt(2, 0)])
            .await
            .unwrap();
        // A track in the middle (the open's spot checks read first and last only): the
        // receipt that needs it fails, naming the file and table, not the message (store
        // errors are logged).
        garble(&s, TRACKS, &track_key(middle.unit, middle.branch));
        let err = s.record_receipts(vec![bench_receipt(1, 0)]).await.unwrap_err();
        let f = crate::StorageError::from(err).failure().clone();
        assert_eq!(f.kind, FailureKind::Corrupt, "{f}");
        assert!(f.location.starts_with(&dir.dlr_path().display().to_string()), "{f}");
        assert!(f.location.contains("table tracks"), "{f}");
        assert!(!f.to_string().contains(&middle.unit.to_string()), "{f}");
        assert!(!f.to_string().contains(" key "), "{f}");
        // One flipped byte in a delivery's record: the envelope's CRC catches it, and
        // claiming it fails closed.
        s.file()
            .write(Durability::Immediate, |txn| {
                let mut t = txn.open_table(DELIVERIES)?;
                let mut v = t.get(1u64)?.unwrap().value().to_vec();
                let at = v.len() - 10;
                v[at] ^= 0x01;
                t.insert(1u64, v.as_slice())?;
                Ok(((), true))
            })
            .unwrap();
        let err = s
            .claim_due(Timestamp::now(), LEASE, 10, ClaimScope::All)
            .await
            .unwrap_err();
        let f = crate::StorageError::from(err).failure().clone();
        assert_eq!(f.kind, FailureKind::Corrupt, "{f}");
        assert!(f.location.ends_with("dlr.redb table deliveries"), "{f}");
        assert!(f.detail.contains("checksum mismatch"), "{f}");
        // A garbled delivery header: also corrupt, naming the table.
        garble(&s, DELIVERIES, 1u64);
        let err = s
            .claim_due(Timestamp::now(), LEASE, 10, ClaimScope::All)
            .await
            .unwrap_err();
        let f = crate::StorageError::from(err).failure().clone();
        assert_eq!(f.kind, FailureKind::Corrupt, "{f}");
        assert!(
            f.to_string()
                .contains("dlr.redb table deliveries: malformed delivery header"),
            "{f}"
        );
        // An orphan, then the first track: the open's spot checks refuse the file.
        s.record_receipts(vec![bench_receipt(9, 0)]).await.unwrap();
        garble(&s, ORPHANS, corr_key("up", &bench_key(9, 0)).as_slice());
        assert!(s.record_receipts(vec![bench_receipt(9, 0)]).await.is_err());
        drop(s);
        let err = FileDlrStore::open(&dir, retention()).unwrap_err();
        assert_eq!(err.kind, FailureKind::Corrupt, "{err}");
        assert!(err.location.contains("dlr.redb table "), "{err}");
    });
}

#[test]
fn a_full_disk_fails_closed_and_recovers() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (dir, s) = open(tmp.path());
        s.hand_off(vec![bench_handoff(0, 1)]).await.unwrap();
        s.faults().full.store(true, std::sync::atomic::Ordering::Relaxed);
        let err = s.hand_off(vec![bench_handoff(1, 1)]).await.unwrap_err();
        let f = crate::StorageError::from(err).failure().clone();
        assert_eq!(f.kind, FailureKind::Full, "{f}");
        // The write failed where the store makes it durable: the journal, in the same
        // directory.
        assert!(
            f.location
                .starts_with(&dir.path().join("journal.").display().to_string()),
            "{f}"
        );
        assert!(s.record_receipts(vec![bench_receipt(0, 0)]).await.is_err());
        s.faults().full.store(false, std::sync::atomic::Ordering::Relaxed);
        let st = s.stats().await.unwrap();
        assert_eq!(st.awaiting_receipts, 1, "the refused handoff left nothing behind");
        let m = s.record_receipts(vec![bench_receipt(0, 0)]).await.unwrap();
        assert!(matches!(m[0], ReceiptMatch::Matched { resolved: true, .. }));
    });
}

/// Held parts (an open group, a closed one and the group its conflicting part opened),
/// an inbound delivery due and one claimed by its step survive a reopen as they were;
/// group numbers continue after the stored counter.
#[test]
fn inbound_parts_and_messages_survive_a_reopen() {
    use crate::conformance::dlr::{mo_http, mo_key, mo_message, mo_part, routed, store_parts};
    use crate::dlr::{ClaimCreated, DeliveryContent, DlrWrite};

    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (dir, s) = open(tmp.path());
        let deadline = Timestamp::now().saturating_add(Duration::from_secs(3600));
        let (open_key, conflict_key) = (mo_key(1, 3), mo_key(2, 2));
        store_parts(
            &s,
            vec![
                mo_part(&open_key, 1, "one ", deadline),
                mo_part(&open_key, 3, "three", deadline),
                mo_part(&conflict_key, 1, "old", deadline),
            ],
        )
        .await;
        let closed = store_parts(&s, vec![mo_part(&conflict_key, 1, "new", deadline)]).await;
        assert_eq!(closed.len(), 1);
        let due_smpp = routed("esme1", ReplyPath::Smpp, mo_message("due"), None);
        let out = s
            .apply(DlrWrite {
                inbound: vec![due_smpp.clone()],
                ..DlrWrite::default()
            })
            .await;
        out.inbound.unwrap();
        let claimed_http = routed("web", mo_http(), mo_message("claimed"), None);
        let out = s
            .apply(DlrWrite {
                inbound: vec![claimed_http.clone()],
                claim_created: Some(ClaimCreated { lease: LEASE, limit: 1 }),
                ..DlrWrite::default()
            })
            .await;
        out.inbound.unwrap();
        assert_eq!(out.claimed.len(), 1);
        let stats = s.stats().await.unwrap();
        assert_eq!((stats.inbound_parts, stats.pending_deliveries), (4, 2));
        let before = dump(&s);
        drop(s);
        drop(dir);

        let (_dir, s) = open(tmp.path());
        assert_eq!(dump(&s), before, "every table, entry by entry");
        assert_eq!(s.stats().await.unwrap(), stats);
        let later = Timestamp::now().saturating_add(Duration::from_secs(1));
        assert_eq!(s.due_inbound_groups(later, 10).await.unwrap(), closed);
        let c = s.claim_due(later, LEASE, 10, ClaimScope::All).await.unwrap();
        assert_eq!(c.len(), 1, "the claimed one is still leased: {c:?}");
        assert_eq!(
            c[0].content,
            DeliveryContent::Inbound(Box::new(due_smpp.message.clone()))
        );
        assert_eq!(c[0].target, due_smpp.target());
        s.finish(vec![done(c[0].id, c[0].attempt, DeliveryResult::Delivered)])
            .await
            .unwrap();
        let after_lease = later.saturating_add(LEASE).saturating_add(Duration::from_secs(1));
        let c = s.claim_due(after_lease, LEASE, 10, ClaimScope::All).await.unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].attempt, &c[0].content),
            (2, &DeliveryContent::Inbound(Box::new(claimed_http.message)))
        );
        // The open group takes its last part; the conflict's group another.
        let complete = store_parts(&s, vec![mo_part(&open_key, 2, "two ", deadline)]).await;
        assert_eq!(complete.len(), 1);
        assert_eq!(complete[0].assemble("").unwrap().payload, b"one two three");
        let next = store_parts(&s, vec![mo_part(&mo_key(3, 2), 1, "x", deadline)]).await;
        assert!(next.is_empty());
        let highest = s
            .file()
            .read(|txn| Ok(txn.open_table(INBOUND_GROUPS)?.last()?.map(|(k, _)| k.value())))
            .unwrap();
        assert_eq!(
            highest,
            Some(4),
            "numbers continue after the three groups before the reopen"
        );
    });
}

/// A `dlr.redb` of the build before inbound messages (no inbound tables or counters,
/// delivery records of minor version 0) opens, and its deliveries are receipts.
#[test]
fn a_file_of_the_earlier_build_opens_and_its_deliveries_are_receipts() {
    use super::records::{DeliveryRecord, StoredOutcome, StoredTarget, parse_delivery};
    use super::tx::decode_delivery;

    #[derive(serde::Serialize)]
    struct EarlierDeliveryRecord {
        #[serde(rename = "t")]
        target: StoredTarget,
        #[serde(rename = "o")]
        outcome: StoredOutcome,
        #[serde(rename = "c")]
        created_at: Timestamp,
        #[serde(rename = "e")]
        expires_at: Timestamp,
    }

    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (dir, s) = open(tmp.path());
        s.hand_off(vec![handoff(&["e1"], vec![target(ReplyPath::Smpp)])])
            .await
            .unwrap();
        s.record_receipts(vec![receipt("e1", DlrState::Delivered)])
            .await
            .unwrap();
        // Make it the earlier build's file.
        s.file()
            .write(Durability::Immediate, |txn| {
                let mut t = txn.open_table(DELIVERIES)?;
                let value = t.get(1u64)?.unwrap().value().to_vec();
                let (_, rec): (_, DeliveryRecord) = decode_delivery(&value)?;
                let p = parse_delivery(&value).unwrap();
                let earlier = super::records::tests::earlier_envelope(&EarlierDeliveryRecord {
                    target: rec.target,
                    outcome: rec.outcome.unwrap(),
                    created_at: rec.created_at,
                    expires_at: rec.expires_at,
                });
                let mut rewritten = value[..value.len() - p.record.len()].to_vec();
                rewritten.extend_from_slice(&earlier);
                t.insert(1u64, rewritten.as_slice())?;
                drop(t);
                txn.delete_table(INBOUND_GROUPS)?;
                txn.delete_table(INBOUND_OPEN)?;
                txn.delete_table(INBOUND_DUE)?;
                let mut meta = txn.open_table(META)?;
                meta.remove(NEXT_GROUP)?;
                meta.remove(INBOUND_PARTS)?;
                Ok(((), true))
            })
            .unwrap();
        drop(s);
        drop(dir);

        let (_dir, s) = open(tmp.path());
        let st = s.stats().await.unwrap();
        assert_eq!((st.pending_deliveries, st.inbound_parts), (1, 0));
        let c = s
            .claim_due(
                Timestamp::now().saturating_add(Duration::from_secs(1)),
                LEASE,
                10,
                ClaimScope::All,
            )
            .await
            .unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(outcome_of(&c[0]).state, DlrState::Delivered);
        // And it takes inbound parts from now on.
        let key = crate::conformance::dlr::mo_key(1, 2);
        let part = crate::conformance::dlr::mo_part(&key, 1, "a", Timestamp::now());
        crate::conformance::dlr::store_parts(&s, vec![part]).await;
        assert_eq!(s.stats().await.unwrap().inbound_parts, 1);
    });
}

// ---------------------------------------------------------------------------------------
// Benchmarks: `cargo test --release -p sendium-storage dlr::tests::bench_ -- --ignored
// --nocapture --test-threads=1`. They print `BENCH` lines.

fn bench_key(i: usize, part: usize) -> String {
    format!("{:016X}", (i as u64) << 8 | part as u64)
}

/// Branch `i`: `parts` provider ids, one SMPP target, a fresh unit id.
fn bench_handoff(i: usize, parts: usize) -> Handoff {
    Handoff {
        unit: MessageId::generate(),
        branch: 0,
        destination: "up".into(),
        outcome: HandoffOutcome::Submitted {
            provider_keys: (0..parts).map(|p| bench_key(i, p)).collect(),
        },
        targets: vec![target(ReplyPath::Smpp)],
        handed_off_at: Timestamp::now(),
    }
}

fn bench_receipt(i: usize, part: usize) -> ProviderReceipt {
    receipt(&bench_key(i, part), DlrState::Delivered)
}

/// CPU time of the whole process so far (user + system), from `/proc/self/stat`.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may contain spaces) start after ") ".
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the line (the 12th and 13th of `rest`),
    // in ticks of 10 ms.
    let field = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    let ticks = field(11) + field(12);
    Duration::from_millis(ticks * 10)
}

/// Bytes this process has written so far (`/proc/self/io` wchar).
fn written_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("wchar: ").and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
}

/// One full round per message: handoff, receipt, claim, finish, each in batches of
/// `batch`, over `n` messages; returns the rates.
async fn round(s: &FileDlrStore, n: usize, batch: usize) -> (f64, f64, f64) {
    // Inputs are built before the clock starts: id generation and formatting are the
    // caller's cost, not the store's.
    let handoffs: Vec<Vec<Handoff>> = (0..n)
        .step_by(batch)
        .map(|start| (start..start + batch).map(|i| bench_handoff(i, 1)).collect())
        .collect();
    let receipts: Vec<Vec<ProviderReceipt>> = (0..n)
        .step_by(batch)
        .map(|start| (start..start + batch).map(|i| bench_receipt(i, 0)).collect())
        .collect();
    let cpu = cpu_time();
    let wchar = written_bytes();
    let wall = Instant::now();
    let t = Instant::now();
    for b in handoffs {
        s.hand_off(b).await.unwrap();
    }
    let handoffs = n as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    for b in receipts {
        s.record_receipts(b).await.unwrap();
    }
    let receipts = n as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    let now = Timestamp::now().saturating_add(Duration::from_secs(1));
    let mut left = n;
    while left > 0 {
        let c = s.claim_due(now, LEASE, batch, ClaimScope::All).await.unwrap();
        assert!(!c.is_empty());
        left -= c.len();
        s.finish(
            c.iter()
                .map(|d| done(d.id, d.attempt, DeliveryResult::Delivered))
                .collect(),
        )
        .await
        .unwrap();
    }
    let deliveries = n as f64 / t.elapsed().as_secs_f64();
    let cpu = cpu_time().saturating_sub(cpu);
    let wchar = written_bytes().saturating_sub(wchar);
    println!(
        "BENCH   process CPU {:.1} µs per message over the round ({:.0}% of one core while it ran); {:.0} bytes written per message",
        cpu.as_secs_f64() * 1e6 / n as f64,
        cpu.as_secs_f64() * 100.0 / wall.elapsed().as_secs_f64(),
        wchar as f64 / n as f64
    );
    (handoffs, receipts, deliveries)
}

#[test]
#[ignore = "benchmark"]
fn bench_dlr_throughput() {
    runtime().block_on(async {
        // SENDIUM_BENCH_ONE=1: only the first configuration (for profiling).
        let one = std::env::var("SENDIUM_BENCH_ONE").is_ok();
        for quick_repair in [false, true].into_iter().take(if one { 1 } else { 2 }) {
            for (batch, backlog) in [(100, 0), (1000, 0), (100, 200_000)]
                .into_iter()
                .take(if one { 1 } else { 3 })
            {
                let tmp = tempfile::tempdir().unwrap();
                let dir = Arc::new(DataDir::open(tmp.path()).unwrap());
                let options = FileOptions {
                    quick_repair,
                    ..FileDlrStore::default_options()
                };
                let s = FileDlrStore::open_with(&dir, retention(), options).unwrap();
                // Resolved tracks kept for retention: the file a busy gateway really has.
                for start in (0..backlog).step_by(1000) {
                    let off = 10_000_000 + start;
                    s.hand_off((off..off + 1000).map(|i| bench_handoff(i, 1)).collect())
                        .await
                        .unwrap();
                    s.record_receipts((off..off + 1000).map(|i| bench_receipt(i, 0)).collect())
                        .await
                        .unwrap();
                }
                if backlog > 0 {
                    let now = Timestamp::now().saturating_add(Duration::from_secs(1));
                    loop {
                        let c = s.claim_due(now, LEASE, 5000, ClaimScope::All).await.unwrap();
                        if c.is_empty() {
                            break;
                        }
                        s.finish(
                            c.iter()
                                .map(|d| done(d.id, d.attempt, DeliveryResult::Delivered))
                                .collect(),
                        )
                        .await
                        .unwrap();
                    }
                }
                let n = if one { 500 * batch } else { 50 * batch };
                let (h, r, d) = round(&s, n, batch).await;
                println!(
                    "BENCH dlr (quick repair {quick_repair}, {backlog} resolved tracks kept): batches of {batch}: \
                     {h:.0} handoffs/s, {r:.0} receipts/s, {d:.0} claim+finish/s; one message costs {:.1} µs \
                     (= {:.0} messages/s on the DLR store alone)",
                    1e6 / h + 1e6 / r + 1e6 / d,
                    1.0 / (1.0 / h + 1.0 / r + 1.0 / d)
                );
            }
        }
    });
}

#[test]
#[ignore = "benchmark (slow: writes ~1 GB twice)"]
fn bench_dlr_reopen_after_sigkill() {
    // SENDIUM_BENCH_RECORDS: handoffs written (default 1M); SENDIUM_BENCH_QUICK_REPAIR=
    // off|on|both (default both); SENDIUM_BENCH_DROP_CACHES=1 (root): reopen with a cold
    // page cache, as after a reboot.
    let n = std::env::var("SENDIUM_BENCH_RECORDS").unwrap_or_else(|_| "1000000".into());
    let modes: Vec<bool> = match std::env::var("SENDIUM_BENCH_QUICK_REPAIR").as_deref() {
        Ok("off") => vec![false],
        Ok("on") => vec![true],
        _ => vec![false, true],
    };
    let cold = std::env::var("SENDIUM_BENCH_DROP_CACHES").is_ok();
    let drop_caches = || {
        if cold {
            std::fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
        }
    };
    for quick_repair in modes {
        let tmp = tempfile::tempdir().unwrap();
        let mut env = vec![("SENDIUM_TEST_RECORDS", n.as_str())];
        if quick_repair {
            env.push(("SENDIUM_TEST_QUICK_REPAIR", "1"));
        }
        run_child("fill-then-kill", tmp.path(), &env);
        let size = std::fs::metadata(tmp.path().join("dlr.redb")).unwrap().len();
        drop_caches();
        runtime().block_on(async {
            let started = Instant::now();
            let dir = Arc::new(DataDir::open(tmp.path()).unwrap());
            let options = FileOptions {
                quick_repair,
                ..FileDlrStore::default_options()
            };
            let s = FileDlrStore::open_with(&dir, retention(), options).unwrap();
            let opened = started.elapsed();
            let st = s.stats().await.unwrap();
            assert_eq!(st.correlations, n.parse::<u64>().unwrap());
            println!(
                "BENCH reopen after SIGKILL (quick repair {quick_repair}, cold cache {cold}): {n} correlations, {:.0} MiB: open {:.0} ms",
                size as f64 / (1 << 20) as f64,
                opened.as_secs_f64() * 1e3
            );
            drop(s);
            let started = Instant::now();
            let s = FileDlrStore::open_with(&dir, retention(), options).unwrap();
            println!(
                "BENCH clean reopen (quick repair {quick_repair}): {:.0} ms",
                started.elapsed().as_secs_f64() * 1e3
            );
            drop(s);
        });
    }
}

#[test]
fn claims_left_by_a_previous_process_are_released_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (dir, s) = open(tmp.path());
        let smpp_parked = handoff(&["p1"], vec![target(ReplyPath::Smpp)]);
        let claimed = handoff(&["c1"], vec![target(http())]);
        s.hand_off(vec![smpp_parked, claimed]).await.unwrap();
        s.record_receipts(vec![
            receipt("p1", DlrState::Delivered),
            receipt("c1", DlrState::Delivered),
        ])
        .await
        .unwrap();
        let now = Timestamp::now();
        let first = s.claim_due(now, LEASE, 10, ClaimScope::All).await.unwrap();
        assert_eq!(first.len(), 2);
        // The SMPP one is parked far beyond the lease (nobody bound); the HTTP one stays
        // claimed when the process goes.
        let smpp = first.iter().find(|d| d.target.reply == ReplyPath::Smpp).unwrap();
        s.finish(vec![done(
            smpp.id,
            smpp.attempt,
            DeliveryResult::Retry { at: smpp.expires_at },
        )])
        .await
        .unwrap();
        let http_claim = first
            .iter()
            .find(|d| d.target.reply != ReplyPath::Smpp)
            .unwrap()
            .clone();
        drop(s);
        drop(dir);

        let (_dir, s) = open(tmp.path());
        assert!(
            s.claim_due(Timestamp::now(), LEASE, 10, ClaimScope::All)
                .await
                .unwrap()
                .is_empty(),
            "still leased"
        );
        assert_eq!(
            s.release_claims(LEASE).await.unwrap(),
            1,
            "only the claim, not the parked one"
        );
        let again = s.claim_due(Timestamp::now(), LEASE, 10, ClaimScope::All).await.unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].id, http_claim.id);
        assert_eq!(
            again[0].attempt,
            http_claim.attempt + 1,
            "a new attempt fences the old one"
        );
        assert_eq!(s.release_claims(LEASE).await.unwrap(), 1);
        assert_eq!(s.release_claims(LEASE).await.unwrap(), 0, "idempotent");
    });
}

/// A delivery claimed by the write that created it is as durable as the receipt: after a
/// reopen it is still leased (not sent twice while its sender may still be at it), and
/// released like any claim of a process that is gone, with a new attempt.
#[test]
fn deliveries_claimed_by_their_receipt_write_survive_a_reopen_as_claims() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (dir, s) = open(tmp.path());
        let claimed = {
            s.hand_off(vec![
                handoff(&["w1"], vec![target(http())]),
                handoff(&["w2"], vec![target(http())]),
            ])
            .await
            .unwrap();
            let out = s
                .apply(crate::dlr::DlrWrite {
                    receipts: vec![receipt("w1", DlrState::Delivered), receipt("w2", DlrState::Delivered)],
                    claim_created: Some(crate::dlr::ClaimCreated { lease: LEASE, limit: 1 }),
                    ..Default::default()
                })
                .await;
            assert_eq!(out.receipts.unwrap().len(), 2);
            out.claimed
        };
        assert_eq!(claimed.len(), 1, "the limit holds: {claimed:?}");
        assert_eq!(claimed[0].attempt, 1);
        drop(s);
        drop(dir);

        let (_dir, s) = open(tmp.path());
        let due = s.claim_due(Timestamp::now(), LEASE, 10, ClaimScope::All).await.unwrap();
        assert_eq!(due.len(), 1, "only the unclaimed one is due: {due:?}");
        assert_ne!(due[0].id, claimed[0].id);
        assert_eq!(s.release_claims(LEASE).await.unwrap(), 2, "both claims are released");
        let again = s.claim_due(Timestamp::now(), LEASE, 10, ClaimScope::All).await.unwrap();
        let mine = again.iter().find(|d| d.id == claimed[0].id).unwrap();
        assert_eq!(mine.attempt, 2, "a new attempt fences the write's claim");
    });
}

/// A store whose redb engine panicked (in the fuzzer's input one byte of `dlr.redb` was damaged: redb
/// panics inside `claim_due`, an index out of bounds in its allocator) fails closed, and
/// dropping it does not panic although the panic poisoned redb's mutexes and redb's
/// `Drop` unwraps one: closing a handle contains that panic. Regression input for the
/// `data_dir_recovery` fuzz target: `fuzz/corpus/data_dir_recovery/crash-engine-drop`.
#[test]
fn a_store_whose_engine_panicked_drops_without_panicking() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("data");
    let rt = runtime();
    let retention = DlrRetention {
        retention: Duration::from_secs(86_400),
        orphan_retention: Duration::from_secs(3_600),
    };
    let target = |submit_id| crate::dlr::ReceiptTarget {
        submit_id,
        account: "esme1".into(),
        reply: ReplyPath::Smpp,
        source: crate::record::Address::new(5, 0, "Sendium"),
        destination: crate::record::Address::new(1, 1, "46700000001"),
        submitted_at: Timestamp::now(),
        failure_only: false,
    };
    let delivered = |key: &str| ProviderReceipt {
        destination: "up-a".into(),
        keys: vec![key.to_string()],
        outcome: ReceiptOutcome {
            state: DlrState::Delivered,
            error: "000".into(),
            done_at: Timestamp::now(),
        },
    };
    // The state the fuzz target builds: a handoff with a matched receipt, a failed
    // handoff (a pending delivery), an orphan receipt.
    rt.block_on(async {
        let dir = Arc::new(DataDir::open(&path).unwrap());
        let s = FileDlrStore::open(&dir, retention).unwrap();
        let (a, b) = (MessageId::generate(), MessageId::generate());
        let out = s
            .apply(crate::dlr::DlrWrite {
                handoffs: vec![
                    Handoff {
                        unit: a,
                        branch: 0,
                        destination: "up-a".into(),
                        outcome: HandoffOutcome::Submitted {
                            provider_keys: vec!["af1".into(), "af2".into()],
                        },
                        targets: vec![target(a)],
                        handed_off_at: Timestamp::now(),
                    },
                    Handoff {
                        unit: b,
                        branch: 0,
                        destination: "up-b".into(),
                        outcome: HandoffOutcome::Failed(ReceiptOutcome {
                            state: DlrState::Rejected,
                            error: "045".into(),
                            done_at: Timestamp::now(),
                        }),
                        targets: vec![target(b)],
                        handed_off_at: Timestamp::now(),
                    },
                ],
                receipts: vec![delivered("af1"), delivered("unknown")],
                ..crate::dlr::DlrWrite::default()
            })
            .await;
        out.handoffs.unwrap();
        out.receipts.unwrap();
    });

    rt.block_on(async {
        let dir = Arc::new(DataDir::open(&path).unwrap());
        let s = FileDlrStore::open(&dir, retention).unwrap();
        // The engine panics inside a claim's write transaction; the store fails closed ...
        s.panic_in_next_write();
        let err = s
            .claim_due(Timestamp::now(), LEASE, 1_000, ClaimScope::All)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("panicked"), "{err}");
        // ... reopens the file for the next call, which sees everything written ...
        let claimed = s
            .claim_due(Timestamp::now(), LEASE, 1_000, ClaimScope::All)
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1, "the failed handoff's delivery");
        s.panic_in_next_write();
        s.release_claims(LEASE).await.unwrap_err();
        // ... and dropping the store (its handle poisoned by the panic) does not panic.
        drop(s);
    });
}
