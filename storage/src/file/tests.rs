//! Test-only module: compiled under `#[cfg(test)]` (see its `mod` declaration).
//!
//! File-backend tests beyond the conformance suite: state surviving a reopen (clean, and
//! SIGKILL in a child process), fail-closed behaviour on a full or failing disk, damaged
//! and truncated files, and (ignored) benchmarks.
//!
//! Child processes re-run this test binary on one ignored test with
//! `SENDIUM_TEST_CHILD` set; without the variable those tests return at once, so
//! `cargo test -- --ignored` does not misfire them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{DataDir, FileOptions, FilePendingStore, FileRoutedWorkStore, FileRouterQueueStore};
use crate::conformance::ops::{PendingOps as _, RoutedWorkOps as _, RouterQueueOps as _};
use crate::conformance::{part, record};
use crate::error::FailureKind;
use crate::ids::{MessageId, ReadySeq, Timestamp};
use crate::memory::PendingLimits;
use crate::pending::{AdmitOutcome, Disposition, PendingStore};
use crate::routed_work::{Branch, BranchDone, BranchFailure, BranchKind, BranchOutcome, RoutedUnit, RoutedWorkStore};
use crate::router_queue::{RouterQueueStore, StagedUnit};

const LONG: Duration = Duration::from_secs(3600);
const CHILD_VAR: &str = "SENDIUM_TEST_CHILD";
const CHILD_DIR: &str = "SENDIUM_TEST_DIR";

fn limits() -> PendingLimits {
    PendingLimits::default()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

struct Stores {
    dir: Arc<DataDir>,
    pending: FilePendingStore,
    rq: FileRouterQueueStore,
    rw: FileRoutedWorkStore,
}

fn open_all(path: &Path) -> Stores {
    let dir = Arc::new(DataDir::open(path).unwrap());
    Stores {
        pending: FilePendingStore::open(&dir, limits()).unwrap(),
        rq: FileRouterQueueStore::open(&dir).unwrap(),
        rw: FileRoutedWorkStore::open(&dir).unwrap(),
        dir,
    }
}

/// [`open_all`] with the journal's checkpointer paused: checkpoints happen when a test
/// makes them.
fn open_paused(path: &Path) -> Stores {
    let s = open_all(path);
    s.pending.journal().pause_ticks();
    s
}

/// `n` plain single-part records of one account.
fn plain(n: usize) -> Vec<crate::PendingRecord> {
    (0..n)
        .map(|i| record("esme1", "447700900001", &format!("m{i}")))
        .collect()
}

fn routed(id: MessageId, branches: u16) -> RoutedUnit {
    RoutedUnit {
        id,
        members: vec![id],
        route: "default".into(),
        routed_at: Timestamp::now(),
        branches: (0..branches)
            .map(|no| Branch {
                no,
                kind: if no == 0 { BranchKind::Primary } else { BranchKind::Copy },
                targets: vec!["up-a".into(), "up-b".into()],
                outcome: None,
                failed_over_from: Vec::new(),
            })
            .collect(),
    }
}

/// Everything observable through the three stores, as text (stored timestamps make it
/// deterministic).
async fn snapshot(s: &Stores) -> String {
    let ready = s
        .pending
        .ready_after(crate::ReadyCursor::START, usize::MAX)
        .await
        .unwrap();
    let ids: Vec<_> = ready.iter().map(|u| u.unit.id).collect();
    let units = s.pending.units(&ids).await.unwrap();
    assert_eq!(units, ready, "units() and ready_after() agree");
    format!(
        "ready={ready:?}\npending={:?}\nstaged={:?}\nrq={:?}\nrouted={:?}\nrw={:?}\n",
        s.pending.stats().await.unwrap(),
        s.rq.staged_after(ReadySeq(0), usize::MAX).await.unwrap(),
        s.rq.stats().await.unwrap(),
        s.rw.load_after(None, usize::MAX).await.unwrap(),
        s.rw.stats().await.unwrap(),
    )
}

/// What [`populate`] wrote, for the checks after a restart.
struct Written {
    idem: crate::record::PendingRecord,
    soon_part: crate::record::PendingRecord,
    late_part1: crate::record::PendingRecord,
    released: MessageId,
    removed: MessageId,
}

/// Write state into every stage: single messages (with and without receipts and
/// idempotency keys), a complete group, two incomplete groups (one about to expire),
/// staged batches with a cursor, routed units with a completed branch and a failover.
/// Then a released
/// staged unit and a removed routed unit (both `Durability::None`).
async fn populate(s: &Stores) -> Written {
    let mut idem = record("esme1", "447700900001", "with key");
    idem.idempotency_key = Some("key-1".into());
    let mut quiet = record("esme1", "447700900002", "no receipt");
    quiet.registered_delivery = 0;
    let plain = record("esme2", "447700900003", "plain");
    let g1 = part("esme1", "447700900004", 77, 2, 1, LONG);
    let g2 = part("esme1", "447700900004", 77, 2, 2, LONG);
    let soon_part = part("esme1", "447700900005", 5, 3, 1, Duration::from_millis(1));
    let late_part1 = part("esme1", "447700900006", 6, 2, 1, LONG);
    let out = s
        .pending
        .admit(vec![
            idem.clone(),
            quiet,
            plain,
            g1,
            g2,
            soon_part.clone(),
            late_part1.clone(),
        ])
        .await
        .unwrap();
    assert!(out.iter().all(|o| *o == AdmitOutcome::Admitted));

    let ready = s.pending.ready_after(crate::ReadyCursor::START, 100).await.unwrap();
    assert_eq!(ready.len(), 4, "3 singles + 1 complete group");
    let staged: Vec<_> = ready.iter().map(StagedUnit::from).collect();
    s.rq.stage(&staged[..2], staged[1].seq).await.unwrap();
    s.rq.stage(&staged[2..], staged[3].seq).await.unwrap();
    // A cursor in priority lane 9 beside lane 0's (journaled in the frame's `lanes`).
    s.rq.stage(&[], LANE_9_CURSOR).await.unwrap();

    let units: Vec<_> = ready.iter().take(3).map(|u| routed(u.unit.id, 2)).collect();
    s.rw.record(units.clone()).await.unwrap();
    s.rw.complete(vec![BranchDone {
        unit: units[0].id,
        branch: 1,
        outcome: BranchOutcome::Submitted {
            destination: "up-a".into(),
            provider_ids: vec!["0AF1".into(), "0AF2".into()],
        },
    }])
    .await
    .unwrap();
    s.rw.complete(vec![BranchDone {
        unit: units[1].id,
        branch: 0,
        outcome: BranchOutcome::Failed {
            destination: Some("up-b".into()),
            failure: BranchFailure::Rejected { status: 0x45 },
        },
    }])
    .await
    .unwrap();
    s.rw.move_branches(vec![crate::routed_work::BranchMove {
        unit: units[0].id,
        branch: 0,
        from: "up-a".into(),
    }])
    .await
    .unwrap();
    Written {
        idem,
        soon_part,
        late_part1,
        released: staged[0].id,
        removed: units[2].id,
    }
}

/// Where [`populate`] leaves selection in priority lane 9.
const LANE_9_CURSOR: ReadySeq = ReadySeq(9 << 56 | 2);

/// Checks that hold after any restart of a store [`populate`] filled.
async fn check_after_restart(s: &Stores, w: &Written) {
    let st = s.pending.stats().await.unwrap();
    assert_eq!(st.records, 7);
    assert_eq!(st.ready_units, 4);
    assert_eq!(st.incomplete_groups, 2);
    assert_eq!(st.receipt_requests, 6);
    let mut cursor = crate::ReadyCursor::from(ReadySeq(4));
    cursor.advance(LANE_9_CURSOR);
    assert_eq!(s.rq.cursor().await.unwrap(), cursor);
    // The idempotency key still deduplicates.
    let mut again = record("esme1", "447700900001", "with key");
    again.idempotency_key = Some("key-1".into());
    assert_eq!(
        s.pending.admit(vec![again]).await.unwrap(),
        vec![AdmitOutcome::Duplicate { existing: w.idem.id }]
    );
    // The saved deadline did not move: the short group expires, the long one waits.
    let now = Timestamp::now().saturating_add(Duration::from_secs(1));
    assert_eq!(s.pending.expire_groups(now, 10).await.unwrap(), 1);
    let ready = s.pending.ready_after(ReadySeq(4).into(), 10).await.unwrap();
    assert_eq!(ready.len(), 1);
    assert_eq!(ready[0].seq, ReadySeq(5), "the ready seq continues after the restart");
    assert_eq!(ready[0].unit.disposition, Disposition::Expired);
    assert_eq!(ready[0].unit.member_ids(), vec![w.soon_part.id]);
    // The other group completes with a part that arrives after the restart.
    let late2 = part("esme1", "447700900006", 6, 2, 2, LONG);
    s.pending.admit(vec![late2.clone()]).await.unwrap();
    let ready = s.pending.ready_after(ReadySeq(5).into(), 10).await.unwrap();
    assert_eq!(ready.len(), 1);
    assert_eq!(ready[0].unit.member_ids(), vec![w.late_part1.id, late2.id]);
    assert_eq!(s.pending.stats().await.unwrap().incomplete_groups, 0);
}

#[test]
fn every_stage_survives_a_clean_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let s = open_all(tmp.path());
        let w = populate(&s).await;
        s.rq.release(&[w.released]).await.unwrap();
        s.rw.remove(&[w.removed]).await.unwrap();
        let before = snapshot(&s).await;
        s.dir
            .write_manifest(&super::Manifest::new("file", "file", "file", "postgresql"))
            .unwrap();
        drop(s);
        let s = open_all(tmp.path());
        assert_eq!(
            snapshot(&s).await,
            before,
            "a clean close keeps every commit, Durability::None ones too"
        );
        assert_eq!(s.dir.manifest().unwrap().unwrap().routed_work, "file");
        assert_eq!(s.rq.stats().await.unwrap().staged, 3);
        assert_eq!(s.rw.stats().await.unwrap().units, 2);
        check_after_restart(&s, &w).await;
    });
}

/// A Kannel `dlr-url` and `dlr-mask` stored with a message come back after a reopen:
/// the receipt a restart owes still goes where and as the client asked.
#[test]
fn a_kannel_dlr_url_survives_a_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let s = open_all(tmp.path());
        let mut r = record("esme1", "447700900009", "kannel");
        r.channel = crate::record::Channel::Http;
        r.callback_url = Some("http://127.0.0.1:9/dlr?type=%d&id=%I".into());
        r.dlr_mask = Some(31);
        s.pending.admit(vec![r.clone()]).await.unwrap();
        drop(s);
        let s = open_all(tmp.path());
        let units = s.pending.ready_after(crate::ReadyCursor::START, 10).await.unwrap();
        let back: Vec<_> = units.iter().flat_map(|u| u.unit.parts.iter()).collect();
        assert_eq!(back, vec![&r]);
    });
}

/// Re-run this test binary on `test` with the child variables set; returns its status.
/// The child's output is captured and shown when it did not end as `expect` says, and
/// `BENCH` lines are always passed on.
fn run_child(
    test: &str,
    mode: &str,
    dir: &Path,
    extra_env: &[(&str, &str)],
    expect: fn(std::process::ExitStatus) -> bool,
) -> std::process::ExitStatus {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args([test, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
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
    if !expect(out.status) {
        eprintln!(
            "child {mode} ended with {:?}\n--- stdout\n{stdout}\n--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out.status
}

/// Run a child mode that writes `expected.txt` and SIGKILLs itself; returns the file.
fn run_child_until_killed(mode: &str, dir: &Path) -> String {
    let status = run_child("file::tests::child_process", mode, dir, &[], killed);
    assert!(killed(status), "child should die by SIGKILL: {status:?}");
    std::fs::read_to_string(dir.join("expected.txt")).unwrap()
}

fn succeeded(status: std::process::ExitStatus) -> bool {
    status.success()
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
            let s = open_all(&dir);
            let w = populate(&s).await;
            let expected = snapshot(&s).await;
            std::fs::write(dir.join("expected.txt"), &expected).unwrap();
            std::fs::write(
                dir.join("ids.txt"),
                format!(
                    "{}\n{}\n{}\n{}\n{}\n",
                    w.idem.id, w.soon_part.id, w.late_part1.id, w.released, w.removed
                ),
            )
            .unwrap();
            // Cleanup, whose journal frames nobody waits for, then die before anything
            // flushes them.
            s.dir.journal().unwrap().pause_ticks();
            s.rq.release(&[w.released]).await.unwrap();
            s.rw.remove(&[w.removed]).await.unwrap();
            sigkill_self();
        }),
        "journal-then-kill" => rt.block_on(async {
            let dir = Arc::new(DataDir::open(&dir).unwrap());
            let store = FilePendingStore::open(&dir, small_limits(40)).unwrap();
            // No segment switch, so no checkpoint but the one the test asks for.
            store.set_checkpoints(u64::MAX, LONG);
            let commits = journaled_commits(&store).await;
            std::fs::write(dir.path().join("expected.txt"), pending_snapshot(&store).await).unwrap();
            std::fs::write(dir.path().join("after-checkpoint.txt"), commits.to_string()).unwrap();
            sigkill_self();
        }),
        "idle-then-kill" => rt.block_on(async {
            use crate::pending::BlockingPendingWriter;
            let dir = Arc::new(DataDir::open(&dir).unwrap());
            let store = FilePendingStore::open(&dir, limits()).unwrap();
            store.set_checkpoints(u64::MAX, LONG);
            BlockingPendingWriter::commit(&store, msg_batch(10), &[], &mut |_| {}).unwrap();
            assert!(store.journal_uncovered(), "journaled, not yet durable in redb");
            store.idle();
            assert!(
                !store.journal_uncovered(),
                "the idle checkpoint made it durable in redb"
            );
            let body = "x".repeat(1024);
            for _ in 0..8 {
                let batch: Vec<_> = (0..50).map(|i| record("a", &i.to_string(), &body)).collect();
                BlockingPendingWriter::commit(&store, batch, &[], &mut |_| {}).unwrap();
            }
            store.idle();
            assert!(!store.journal_uncovered());
            std::fs::write(dir.path().join("expected.txt"), pending_snapshot(&store).await).unwrap();
            sigkill_self();
        }),
        "checkpoint-then-kill" => rt.block_on(async {
            let dir = Arc::new(DataDir::open(&dir).unwrap());
            let store = FilePendingStore::open(&dir, limits()).unwrap();
            // Commits of ~100 KiB (2 KiB bodies), a segment switch due after 256 KiB:
            // the checkpointer switches about every third commit and then checkpoints
            // the store, so both segments are reused many times over.
            store.set_checkpoints(256 << 10, LONG);
            let journal = store.journal().clone();
            let body = "x".repeat(2048);
            let (mut commits, mut checkpoints, mut switches) = (0, 0, 0);
            let mut cycle = journal.active_segment().1;
            while commits < 40 {
                let batch: Vec<_> = (0..50).map(|i| record("a", &i.to_string(), &body)).collect();
                store.admit(batch).await.unwrap();
                commits += 1;
                journal.tick_now();
                if !store.journal_uncovered() {
                    checkpoints += 1;
                }
                let now = journal.active_segment().1;
                if now != cycle {
                    switches += 1;
                    cycle = now;
                }
            }
            // Two commits only the journal holds: no switch (so no checkpoint) after them,
            // and no background checkpoint either, however late the checkpointer runs.
            crate::pending::BlockingPendingWriter::idle(&store);
            store.set_checkpoints(u64::MAX, LONG);
            journal.pause_ticks();
            for _ in 0..2 {
                let batch: Vec<_> = (0..50).map(|i| record("a", &i.to_string(), &body)).collect();
                store.admit(batch).await.unwrap();
                commits += 1;
            }
            std::fs::write(dir.path().join("expected.txt"), pending_snapshot(&store).await).unwrap();
            std::fs::write(
                dir.path().join("counts.txt"),
                format!("{commits} {checkpoints} {switches}"),
            )
            .unwrap();
            sigkill_self();
        }),
        "disk-full-failpoint" => rt.block_on(async {
            crate::failpoint::init_from_env().unwrap();
            let dir = Arc::new(DataDir::open(&dir).unwrap());
            let store = match FilePendingStore::open(&dir, limits()) {
                Ok(s) => s,
                Err(e) => {
                    assert_eq!(e.kind, FailureKind::Full, "{e}");
                    return;
                }
            };
            let mut admitted = 0u64;
            let err = loop {
                let batch: Vec<_> = (0..10).map(|i| record("a", &i.to_string(), "x")).collect();
                match store.admit(batch).await {
                    Ok(_) => admitted += 10,
                    Err(e) => break e,
                }
            };
            let f = crate::StorageError::from(err.clone());
            assert_eq!(f.failure().kind, FailureKind::Full, "{err}");
            let location = &f.failure().location;
            assert!(
                location.contains("journal.") || location.ends_with("pending.redb"),
                "{err}"
            );
            // The disk stays full: admission keeps failing closed.
            assert!(store.admit(vec![record("a", "1", "x")]).await.is_err());
            std::fs::write(dir.path().join("admitted.txt"), admitted.to_string()).unwrap();
        }),
        "fill-then-kill" => rt.block_on(async {
            let n: u64 = std::env::var("SENDIUM_TEST_RECORDS").unwrap().parse().unwrap();
            let dir = Arc::new(DataDir::open(&dir).unwrap());
            let store = FilePendingStore::open(
                &dir,
                PendingLimits {
                    max_records: u64::MAX,
                    ..limits()
                },
            )
            .unwrap();
            let started = Instant::now();
            let batch = 1000;
            let mut done = 0;
            while done < n {
                let recs: Vec<_> = (0..batch)
                    .map(|i| record("esme1", &format!("4477{i:08}"), &"m".repeat(160)))
                    .collect();
                store.admit(recs).await.unwrap();
                done += batch;
            }
            let secs = started.elapsed().as_secs_f64();
            println!(
                "BENCH fill: {n} records in {secs:.1} s ({:.0} records/s, batches of {batch}); child {}",
                n as f64 / secs,
                rss()
            );
            sigkill_self();
        }),
        other => panic!("unknown child mode {other}"),
    }
}

#[test]
fn every_stage_survives_sigkill_and_lost_cleanup_is_harmless() {
    let tmp = tempfile::tempdir().unwrap();
    let expected = run_child_until_killed("populate-then-kill", tmp.path());
    let ids = std::fs::read_to_string(tmp.path().join("ids.txt")).unwrap();
    let ids: Vec<MessageId> = ids.lines().map(|l| l.parse().unwrap()).collect();
    let rt = runtime();
    rt.block_on(async {
        // The lock died with the child.
        let s = open_all(tmp.path());
        // Every durable commit survived; the release and remove after them, whose
        // frames were not flushed, were lost with the process: the unit is still staged,
        // the routed unit still recorded. That is the documented, harmless outcome (reconciliation
        // drops them by stable id).
        assert_eq!(snapshot(&s).await, expected);
        let staged = s.rq.staged_after(ReadySeq(0), 10).await.unwrap();
        assert!(staged.iter().any(|u| u.id == ids[3]), "lost release: still staged");
        let routed = s.rw.load_after(None, 10).await.unwrap();
        assert!(routed.iter().any(|u| u.id == ids[4]), "lost remove: still recorded");
        assert_eq!(
            routed[0].branches[1].outcome.as_ref().map(|_| ()),
            Some(()),
            "branch outcome kept"
        );
        let w = Written {
            idem: {
                let mut r = record("esme1", "447700900001", "with key");
                r.id = ids[0];
                r
            },
            soon_part: {
                let mut r = record("x", "1", "");
                r.id = ids[1];
                r
            },
            late_part1: {
                let mut r = record("x", "1", "");
                r.id = ids[2];
                r
            },
            released: ids[3],
            removed: ids[4],
        };
        check_after_restart(&s, &w).await;
        // Cleanup repeated after the restart works (idempotent).
        s.rq.release(&[w.released]).await.unwrap();
        s.rw.remove(&[w.removed]).await.unwrap();
        assert_eq!(s.rq.stats().await.unwrap().staged, 3);
        assert_eq!(s.rw.stats().await.unwrap().units, 2);
    });
}

fn small_limits(max_records: u64) -> PendingLimits {
    PendingLimits {
        max_records,
        ..PendingLimits::default()
    }
}

/// Everything observable through the pending store, as text.
async fn pending_snapshot(s: &FilePendingStore) -> String {
    let ready = s.ready_after(crate::ReadyCursor::START, usize::MAX).await.unwrap();
    format!("ready={ready:?}\nstats={:?}\n", s.stats().await.unwrap())
}

/// Commits of every kind the journal records — admissions with and without
/// idempotency keys (and their duplicates), multipart parts completing a group and
/// leaving one open, source completions, admissions refused by a full store — then a
/// checkpoint, then more of them. Returns how many commits followed the checkpoint (all
/// journaled, none durable in redb).
async fn journaled_commits(s: &FilePendingStore) -> usize {
    let mut keyed = record("esme1", "447700900001", "with key");
    keyed.idempotency_key = Some("key-1".into());
    // The same message again (a client's retry) under its key.
    let mut again = record("esme1", "447700900001", "with key");
    again.idempotency_key = Some("key-1".into());
    let out = s.admit(vec![keyed.clone(), again]).await.unwrap();
    assert_eq!(out[1], AdmitOutcome::Duplicate { existing: keyed.id });
    s.admit(vec![part("esme1", "447700900004", 77, 2, 1, LONG)])
        .await
        .unwrap();
    s.admit(vec![part("esme1", "447700900004", 77, 2, 2, LONG)])
        .await
        .unwrap();
    s.admit(vec![part("esme1", "447700900005", 78, 3, 1, LONG)])
        .await
        .unwrap();
    for i in 0..5 {
        s.admit(msg_batch(3 + i)).await.unwrap();
    }
    let first = s.ready_after(crate::ReadyCursor::START, 2).await.unwrap();
    s.complete(&[first[0].unit.id]).await.unwrap();
    s.admit(msg_batch(2)).await.unwrap();
    // A checkpoint: everything so far is durable in redb, the rest only in the journal.
    crate::pending::BlockingPendingWriter::idle(s);
    assert!(!s.journal_uncovered());
    let mut after = 0;
    let ready = s.ready_after(crate::ReadyCursor::START, 3).await.unwrap();
    s.complete(&[ready[1].unit.id]).await.unwrap();
    after += 1;
    s.admit(vec![part("esme1", "447700900005", 78, 3, 2, LONG)])
        .await
        .unwrap();
    after += 1;
    let mut late = record("esme1", "447700900009", "late key");
    late.idempotency_key = Some("key-2".into());
    s.admit(vec![late]).await.unwrap();
    after += 1;
    // A new message with the open group's reference supersedes it.
    let mut new1 = part("esme1", "447700900005", 78, 3, 1, LONG);
    new1.payload = b"a new message".to_vec();
    assert_eq!(s.admit(vec![new1]).await.unwrap(), vec![AdmitOutcome::Superseding]);
    after += 1;
    // A group completed in one commit, and remembered: the reopened store answers its
    // part 2 sent again as a retransmission.
    let out = s
        .admit(vec![
            part("esme1", "447700900006", 79, 2, 1, LONG),
            part("esme1", "447700900006", 79, 2, 2, LONG),
        ])
        .await
        .unwrap();
    assert_eq!(out, vec![AdmitOutcome::Admitted; 2]);
    after += 1;
    // Fills the store to its limit of 40: some admitted, the rest refused as full.
    let out = s.admit(msg_batch(30)).await.unwrap();
    assert!(
        out.contains(&AdmitOutcome::Full) && out.contains(&AdmitOutcome::Admitted),
        "{out:?}"
    );
    after += 1;
    after
}

#[test]
fn journaled_commits_survive_sigkill_with_the_live_process_decisions() {
    let tmp = tempfile::tempdir().unwrap();
    let expected = run_child_until_killed("journal-then-kill", tmp.path());
    let after: usize = std::fs::read_to_string(tmp.path().join("after-checkpoint.txt"))
        .unwrap()
        .parse()
        .unwrap();
    runtime().block_on(async {
        let dir = Arc::new(DataDir::open(tmp.path()).unwrap());
        // A smaller limit than the child's: the replay applies what was admitted, it
        // does not decide again.
        let s = FilePendingStore::open(&dir, small_limits(5)).unwrap();
        assert_eq!(
            s.replayed_frames(),
            after,
            "exactly the commits after the checkpoint came from the journal"
        );
        assert_eq!(pending_snapshot(&s).await, expected);
        // A clean reopen replays nothing again: the recovery checkpointed.
        drop(s);
        let s = FilePendingStore::open(&dir, small_limits(5)).unwrap();
        assert_eq!(s.replayed_frames(), 0);
        assert_eq!(pending_snapshot(&s).await, expected);
        // The replayed completion is remembered like the live one.
        let ready = s.ready_after(crate::ReadyCursor::START, usize::MAX).await.unwrap();
        let completed = ready
            .iter()
            .find(|u| u.unit.parts[0].destination.addr == "447700900006")
            .unwrap();
        let again = part("esme1", "447700900006", 79, 2, 2, LONG);
        assert_eq!(
            s.admit(vec![again]).await.unwrap(),
            vec![AdmitOutcome::Duplicate {
                existing: completed.unit.parts[1].id
            }]
        );
    });
}

#[test]
fn a_journal_past_its_size_limit_is_checkpointed_and_nothing_is_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let expected = run_child_until_killed("checkpoint-then-kill", tmp.path());
    runtime().block_on(async {
        let dir = Arc::new(DataDir::open(tmp.path()).unwrap());
        let counts = std::fs::read_to_string(tmp.path().join("counts.txt")).unwrap();
        let [commits, checkpoints, switches]: [usize; 3] = counts
            .split(' ')
            .map(|n| n.parse().unwrap())
            .collect::<Vec<_>>()
            .try_into()
            .unwrap();
        assert!(checkpoints >= 5, "checkpoints ran: {counts}");
        assert!(switches >= 5, "both segments were reused: {counts}");
        let s = FilePendingStore::open(&dir, limits()).unwrap();
        assert_eq!(s.stats().await.unwrap().records, commits as u64 * 50);
        assert_eq!(
            s.replayed_frames(),
            2,
            "exactly the commits after the last checkpoint came from the journal"
        );
        assert_eq!(pending_snapshot(&s).await, expected);
    });
}

#[test]
fn an_idle_checkpoint_makes_the_journaled_commits_durable_in_redb() {
    let tmp = tempfile::tempdir().unwrap();
    let expected = run_child_until_killed("idle-then-kill", tmp.path());
    runtime().block_on(async {
        let dir = Arc::new(DataDir::open(tmp.path()).unwrap());
        let s = FilePendingStore::open(&dir, limits()).unwrap();
        assert_eq!(s.replayed_frames(), 0, "nothing was left to replay");
        assert_eq!(s.stats().await.unwrap().records, 410);
        assert_eq!(pending_snapshot(&s).await, expected);
    });
}

#[test]
fn a_reopen_after_a_failure_replays_the_journal_before_anyone_reads() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let dir = Arc::new(DataDir::open(tmp.path()).unwrap());
        let s = FilePendingStore::open(&dir, limits()).unwrap();
        s.admit(msg_batch(10)).await.unwrap();
        s.admit(msg_batch(10)).await.unwrap();
        let before = pending_snapshot(&s).await;
        s.invalidate();
        // This read reopens the file: what redb had only in memory must be back.
        assert_eq!(pending_snapshot(&s).await, before);
        s.admit(msg_batch(1)).await.unwrap();
        assert_eq!(s.stats().await.unwrap().records, 21);
    });
}

#[test]
fn a_failed_journal_write_acknowledges_nothing_and_the_next_commit_is_durable() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let dir = Arc::new(DataDir::open(tmp.path()).unwrap());
        let s = FilePendingStore::open(&dir, limits()).unwrap();
        s.admit(msg_batch(10)).await.unwrap();
        s.faults().io.store(true, std::sync::atomic::Ordering::Relaxed);
        let err = s.admit(msg_batch(5)).await.unwrap_err();
        let f = crate::StorageError::from(err).failure().clone();
        assert!(f.location.contains("journal."), "{f}");
        s.faults().io.store(false, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(s.stats().await.unwrap().records, 10, "the refused batch is not stored");
        let (segment, ..) = s.journal().active_segment();
        s.admit(msg_batch(3)).await.unwrap();
        assert_ne!(
            s.journal().active_segment().0,
            segment,
            "the commit after a journal failure starts a new cycle in the other segment"
        );
        s.admit(msg_batch(2)).await.unwrap();
        drop(s);
        let s = FilePendingStore::open(&dir, limits()).unwrap();
        assert_eq!(s.stats().await.unwrap().records, 15);
    });
}

#[test]
fn clients_are_answered_once_the_frame_is_synced_and_before_it_is_applied() {
    use crate::pending::BlockingPendingWriter;
    let tmp = tempfile::tempdir().unwrap();
    let dir = Arc::new(DataDir::open(tmp.path()).unwrap());
    let s = FilePendingStore::open(&dir, limits()).unwrap();
    let mut early = Vec::new();
    let mut reader = None;
    let out = BlockingPendingWriter::commit(&s, msg_batch(10), &[], &mut |outcomes| {
        let (segment, ..) = s.journal().active_segment();
        let header = std::fs::read(&dir.journal_paths()[segment]).unwrap()[16..36].to_vec();
        early.push((outcomes.to_vec(), s.records_in_file(), header));
        // A reader asking now sees what was acknowledged: it waits for the apply.
        let s = s.clone();
        reader = Some(std::thread::spawn(move || s.records_for_readers()));
        std::thread::sleep(Duration::from_millis(50));
    })
    .unwrap();
    assert_eq!(
        reader.unwrap().join().unwrap(),
        10,
        "a read sees every acknowledged admission"
    );
    assert_eq!(early.len(), 1, "answered exactly once");
    let (outcomes, readable, header) = &early[0];
    assert_eq!(outcomes, &out, "the early answer is the commit's outcome");
    assert_eq!(*readable, 0, "answered before the records were applied to the file");
    assert!(
        header.iter().any(|b| *b != 0),
        "the frame was in the journal when answered"
    );
    assert_eq!(s.records_in_file(), 10, "applied when the commit returns");

    // A commit that admits nothing, or that is a checkpoint, answers when it returns.
    let mut called = 0;
    let completion_only = BlockingPendingWriter::commit(&s, Vec::new(), &[MessageId::generate()], &mut |_| called += 1);
    assert!(completion_only.unwrap().is_empty());
    s.journal().refuse_frames(true);
    let out = BlockingPendingWriter::commit(&s, msg_batch(2), &[], &mut |_| called += 1).unwrap();
    assert_eq!(out, vec![AdmitOutcome::Admitted; 2]);
    assert_eq!(called, 0);
    assert!(!s.journal_uncovered(), "that commit was a checkpoint");
    drop(s);
    let s = FilePendingStore::open(&dir, limits()).unwrap();
    assert_eq!(s.records_in_file(), 12);
}

#[test]
fn a_second_process_on_the_same_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let s = open_all(tmp.path());
    let err = DataDir::open(tmp.path()).unwrap_err();
    assert_eq!(err.kind, FailureKind::Locked);
    drop(s);
}

#[test]
fn a_store_file_of_another_table_layout_is_refused_naming_it() {
    use super::engine::db::{LAYOUT_KEY, META};
    let tmp = tempfile::tempdir().unwrap();
    let dir = Arc::new(DataDir::open(tmp.path()).unwrap());
    drop(FilePendingStore::open(&dir, limits()).unwrap());
    drop(FileRouterQueueStore::open(&dir).unwrap());
    drop(FileRoutedWorkStore::open(&dir).unwrap());
    let paths = [dir.pending_path(), dir.router_queue_path(), dir.routed_work_path()];
    for path in &paths {
        let db = redb::Database::create(path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META).unwrap().insert(LAYOUT_KEY, 1).unwrap();
        txn.commit().unwrap();
    }
    let errors = [
        FilePendingStore::open(&dir, limits()).err(),
        FileRouterQueueStore::open(&dir).err(),
        FileRoutedWorkStore::open(&dir).err(),
    ];
    for (path, err) in paths.iter().zip(errors) {
        let err = err.expect("a layout-1 file must not open");
        assert_eq!(err.kind, FailureKind::Corrupt, "{err}");
        assert!(err.location.starts_with(&path.display().to_string()), "{err}");
        assert!(err.to_string().contains("cannot read the file"), "{err}");
    }
}

fn rss() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .filter(|l| l.starts_with("VmRSS") || l.starts_with("VmHWM"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A pending.redb with 2,000 records of 200-byte payloads, cleanly closed.
async fn written_pending(path: &Path) -> (Arc<DataDir>, Vec<u8>) {
    let dir = Arc::new(DataDir::open(path).unwrap());
    let s = FilePendingStore::open(&dir, limits()).unwrap();
    for _ in 0..20 {
        let batch: Vec<_> = (0..100)
            .map(|i| record("a", &i.to_string(), &"p".repeat(200)))
            .collect();
        s.admit(batch).await.unwrap();
    }
    drop(s);
    let bytes = std::fs::read(dir.pending_path()).unwrap();
    (dir, bytes)
}

/// Open the damaged file and read everything; `Err` with the failure if any step failed.
async fn open_and_read_all(dir: &Arc<DataDir>, verify: bool) -> Result<usize, crate::BackendFailure> {
    let options = FileOptions {
        verify_on_open: verify,
        ..FileOptions::pending()
    };
    let s = FilePendingStore::open_with(dir, limits(), options)?;
    let mut cursor = ReadySeq(0);
    let mut n = 0;
    loop {
        let page = s
            .ready_after(cursor.into(), 100)
            .await
            .map_err(|e| crate::StorageError::from(e).failure().clone())?;
        let Some(last) = page.last() else {
            return Ok(n);
        };
        cursor = last.seq;
        n += page.len();
    }
}

#[test]
fn a_truncated_pending_file_fails_to_open_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (dir, bytes) = written_pending(tmp.path()).await;
        for keep in [bytes.len() / 2, 4096, 100] {
            std::fs::write(dir.pending_path(), &bytes[..keep]).unwrap();
            let err = FilePendingStore::open(&dir, limits())
                .err()
                .expect("truncated file must not open");
            assert_eq!(err.kind, FailureKind::Corrupt, "kept {keep}: {err}");
            assert_eq!(err.location, dir.pending_path().display().to_string());
        }
    });
}

#[test]
fn a_garbled_pending_file_fails_closed() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (dir, bytes) = written_pending(tmp.path()).await;
        // A whole page in the middle, and 100 bytes inside the next one: redb trips over
        // the damaged page (it panics; we turn that into Corrupt) at open or at the read.
        // Damage a few pages spread over the file (some are surely in use whatever the
        // record layout), whole, then 100 bytes inside each.
        // Every page holding stored payloads ("ppp…"), 100 bytes in each.
        let holding: Vec<usize> = (0..bytes.len() / 4096)
            .map(|p| p * 4096)
            .filter(|&p| bytes[p..p + 4096].windows(32).any(|w| w.iter().all(|&b| b == b'p')))
            .collect();
        assert!(holding.len() >= 4, "the test file holds records");
        // All of them: copy-on-write leaves freed pages with old copies of the same bytes.
        let pages = holding;
        {
            let len = 100;
            let mut damaged = bytes.clone();
            for &page in &pages {
                for b in &mut damaged[page + 16..(page + 16 + len).min(page + 4096)] {
                    *b ^= 0xA5;
                }
            }
            std::fs::write(dir.pending_path(), &damaged).unwrap();
            for verify in [false, true] {
                let err = open_and_read_all(&dir, verify)
                    .await
                    .expect_err("damage must be noticed");
                assert_eq!(err.kind, FailureKind::Corrupt, "{err}");
                assert!(
                    err.location.starts_with(&dir.pending_path().display().to_string()),
                    "{err}"
                );
            }
        }
        // The header: "not a redb database".
        let mut damaged = bytes.clone();
        for b in &mut damaged[..64] {
            *b ^= 0x5A;
        }
        std::fs::write(dir.pending_path(), &damaged).unwrap();
        let err = FilePendingStore::open(&dir, limits()).err().unwrap();
        assert_eq!(err.kind, FailureKind::Corrupt, "{err}");
        // One flipped payload byte passes redb's unchecked reads; the integrity check on
        // open (page checksums) refuses the file.
        let mut damaged = bytes.clone();
        let run = [b'p'; 100];
        let at = damaged.windows(100).position(|w| w == run).unwrap();
        damaged[at + 10] = b'q';
        std::fs::write(dir.pending_path(), &damaged).unwrap();
        let err = open_and_read_all(&dir, true)
            .await
            .expect_err("checksums catch a flipped byte");
        assert_eq!(err.kind, FailureKind::Corrupt, "{err}");
        // The original file is fine again.
        std::fs::write(dir.pending_path(), &bytes).unwrap();
        assert_eq!(open_and_read_all(&dir, true).await.unwrap(), 2000);
    });
}

#[test]
fn a_full_disk_fails_closed_and_recovers_when_space_returns() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let dir = Arc::new(DataDir::open(tmp.path()).unwrap());
        let s = FilePendingStore::open(&dir, limits()).unwrap();
        let first: Vec<_> = (0..10).map(|i| record("a", &i.to_string(), "x")).collect();
        s.admit(first).await.unwrap();
        s.faults().full.store(true, std::sync::atomic::Ordering::Relaxed);
        for _ in 0..3 {
            let err = s.admit(vec![record("a", "1", "refused")]).await.unwrap_err();
            let f = crate::StorageError::from(err).failure().clone();
            assert_eq!(f.kind, FailureKind::Full, "{f}");
            // The journal's append or a checkpoint's redb commit, whichever met the disk.
            let [a, b] = dir.journal_paths().map(|p| p.display().to_string());
            let files = [a, b, dir.pending_path().display().to_string()];
            assert!(files.contains(&f.location), "{f}");
        }
        s.faults().full.store(false, std::sync::atomic::Ordering::Relaxed);
        let st = s.stats().await.unwrap();
        assert_eq!(st.records, 10, "refused batches left nothing behind");
        s.admit(vec![record("a", "2", "after")]).await.unwrap();
        // A generic I/O error is Unavailable, and recovers the same way.
        s.faults().io.store(true, std::sync::atomic::Ordering::Relaxed);
        let err = s.admit(vec![record("a", "3", "x")]).await.unwrap_err();
        assert_eq!(crate::StorageError::from(err).failure().kind, FailureKind::Unavailable);
        s.faults().io.store(false, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(s.stats().await.unwrap().records, 11);
        drop(s);
        let s = FilePendingStore::open(&dir, limits()).unwrap();
        assert_eq!(s.stats().await.unwrap().records, 11);
    });
}

#[test]
fn the_disk_full_failpoint_makes_admission_fail_closed() {
    let tmp = tempfile::tempdir().unwrap();
    let status = run_child(
        "file::tests::child_process",
        "disk-full-failpoint",
        tmp.path(),
        &[("SENDIUM_FAILPOINT", "disk-full=error@40")],
        succeeded,
    );
    assert!(status.success(), "child failed: {status:?}");
    let admitted: u64 = std::fs::read_to_string(tmp.path().join("admitted.txt"))
        .map(|s| s.parse().unwrap())
        .unwrap_or(0);
    assert!(admitted > 0, "the fault should hit an admission, not the open");
    runtime().block_on(async {
        let dir = Arc::new(DataDir::open(tmp.path()).unwrap());
        let s = FilePendingStore::open(&dir, limits()).unwrap();
        assert_eq!(
            s.stats().await.unwrap().records,
            admitted,
            "exactly the acknowledged batches"
        );
    });
}

// ---------------------------------------------------------------------------------------
// Benchmarks: `cargo test --release -p sendium-storage bench_ -- --ignored --nocapture
// --test-threads=1`. They print `BENCH` lines.

fn msg_batch(n: usize) -> Vec<crate::record::PendingRecord> {
    (0..n)
        .map(|i| record("esme1", &format!("4477{i:08}"), &"m".repeat(160)))
        .collect()
}

#[test]
#[ignore = "benchmark"]
fn bench_durable_admits() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let s = open_all(tmp.path());
        let batches = 300;
        let started = Instant::now();
        for _ in 0..batches {
            s.pending.admit(msg_batch(100)).await.unwrap();
        }
        let secs = started.elapsed().as_secs_f64();
        println!(
            "BENCH admit: {batches} durable commits of 100 records in {secs:.2} s: {:.0} commits/s, {:.0} records/s",
            batches as f64 / secs,
            (batches * 100) as f64 / secs
        );

        // The whole per-batch pipeline: admit, select, stage, record routes, complete
        // branches, complete sources (5 durable commits) plus release/remove (no fsync).
        // Several lanes in parallel, as the actors run concurrently.
        for size in [1000, 10] {
            let n = 30_000 / size;
            let started = Instant::now();
            for _ in 0..n {
                s.pending.admit(msg_batch(size)).await.unwrap();
            }
            let secs = started.elapsed().as_secs_f64();
            println!(
                "BENCH admit: {n} durable commits of {size} records: {:.0} commits/s, {:.0} records/s",
                n as f64 / secs,
                (n * size) as f64 / secs
            );
        }
    });
}

/// The whole per-batch pipeline: admit, select, stage, record routes, complete
/// branches, complete sources (5 durable commits) plus release/remove (no fsync), in
/// `lanes` concurrent lanes (the actors run concurrently), over a store that already
/// holds `backlog` records.
async fn pipeline(path: &Path, backlog: usize, lanes: usize, per_lane: usize) {
    let s = open_all(path);
    for _ in 0..backlog / 1000 {
        s.pending.admit(msg_batch(1000)).await.unwrap();
    }
    let admitted = s.pending.stats().await.unwrap().records;
    let s = Arc::new(s);
    let started = Instant::now();
    let mut tasks = Vec::new();
    let times = Arc::new(parking_lot::Mutex::new([Duration::ZERO; 8]));
    for _ in 0..lanes {
        let s = s.clone();
        let times = times.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..per_lane {
                let batch = msg_batch(100);
                let ids: Vec<_> = batch.iter().map(|r| r.id).collect();
                let mut t = Instant::now();
                let mut lap = |i: usize| {
                    times.lock()[i] += t.elapsed();
                    t = Instant::now();
                };
                s.pending.admit(batch).await.unwrap();
                lap(0);
                let units = s.pending.units(&ids).await.unwrap();
                lap(1);
                let staged: Vec<_> = units.iter().map(StagedUnit::from).collect();
                let cursor = staged.last().unwrap().seq;
                s.rq.stage(&staged, cursor).await.unwrap();
                lap(2);
                s.rw.record(ids.iter().map(|id| routed(*id, 1)).collect())
                    .await
                    .unwrap();
                lap(3);
                s.rq.release(&ids).await.unwrap();
                lap(4);
                s.rw.complete(
                    ids.iter()
                        .map(|id| BranchDone {
                            unit: *id,
                            branch: 0,
                            outcome: BranchOutcome::Submitted {
                                destination: "up-a".into(),
                                provider_ids: vec!["1".into()],
                            },
                        })
                        .collect(),
                )
                .await
                .unwrap();
                lap(5);
                s.pending.complete(&ids).await.unwrap();
                lap(6);
                s.rw.remove(&ids).await.unwrap();
                lap(7);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    let msgs = (lanes * per_lane * 100) as f64;
    let calls = (lanes * per_lane) as f64;
    let names = [
        "admit",
        "units",
        "stage",
        "record",
        "release",
        "rw-complete",
        "complete",
        "remove",
    ];
    let per: Vec<String> = names
        .iter()
        .zip(times.lock().iter())
        .map(|(n, d)| format!("{n} {:.2}", d.as_secs_f64() * 1e3 / calls))
        .collect();
    println!("BENCH pipeline ms per call (100 units): {}", per.join(", "));
    println!(
        "BENCH pipeline: backlog {backlog}, {lanes} lanes x {per_lane} batches of 100, 5 durable commits per batch: {:.0} messages/s ({secs:.2} s)",
        msgs / secs
    );
    assert_eq!(s.pending.stats().await.unwrap().records, admitted);
}

#[test]
#[ignore = "benchmark"]
fn bench_pipeline() {
    runtime().block_on(async {
        for (backlog, lanes) in [(0, 1), (0, 4), (100_000, 4)] {
            let tmp = tempfile::tempdir().unwrap();
            pipeline(tmp.path(), backlog, lanes, 400 / lanes).await;
        }
    });
}

#[test]
#[ignore = "benchmark"]
fn bench_ready_after_paging_100k() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let dir = Arc::new(DataDir::open(tmp.path()).unwrap());
        let s = FilePendingStore::open(&dir, limits()).unwrap();
        for _ in 0..100 {
            s.admit(msg_batch(1000)).await.unwrap();
        }
        for limit in [256, 1000] {
            let started = Instant::now();
            let mut cursor = ReadySeq(0);
            let mut n = 0;
            loop {
                let page = s.ready_after(cursor.into(), limit).await.unwrap();
                let Some(last) = page.last() else { break };
                cursor = last.seq;
                n += page.len();
            }
            let secs = started.elapsed().as_secs_f64();
            assert_eq!(n, 100_000);
            println!(
                "BENCH ready_after: 100k units in pages of {limit}: {secs:.2} s ({:.0} units/s, {:.2} ms/page)",
                n as f64 / secs,
                secs * 1000.0 / (n as f64 / limit as f64)
            );
        }
        let started = Instant::now();
        for _ in 0..1000 {
            s.stats().await.unwrap();
        }
        println!(
            "BENCH stats: {:.1} µs per call at 100k records",
            started.elapsed().as_secs_f64() * 1e3
        );
    });
}

#[test]
#[ignore = "benchmark (slow: writes ~1 GB)"]
fn bench_reopen_after_sigkill_with_1m_records() {
    let n = std::env::var("SENDIUM_BENCH_RECORDS").unwrap_or_else(|_| "1000000".into());
    let tmp = tempfile::tempdir().unwrap();
    let status = run_child(
        "file::tests::child_process",
        "fill-then-kill",
        tmp.path(),
        &[("SENDIUM_TEST_RECORDS", &n)],
        killed,
    );
    assert!(killed(status), "{status:?}");
    let size = std::fs::metadata(tmp.path().join("pending.redb")).unwrap().len();
    println!(
        "BENCH file size: {:.0} MiB for {n} records",
        size as f64 / (1 << 20) as f64
    );
    // SENDIUM_BENCH_DROP_CACHES=1 (root): measure with a cold page cache, as after a reboot.
    let cold = std::env::var("SENDIUM_BENCH_DROP_CACHES").is_ok();
    let drop_caches = || {
        if cold {
            std::fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
        }
    };
    drop_caches();
    runtime().block_on(async {
        let started = Instant::now();
        let dir = Arc::new(DataDir::open(tmp.path()).unwrap());
        let s = FilePendingStore::open(&dir, limits()).unwrap();
        let opened = started.elapsed();
        let st = s.stats().await.unwrap();
        let page = s.ready_after(crate::ReadyCursor::START, 256).await.unwrap();
        let ready = started.elapsed();
        assert_eq!(st.records, n.parse::<u64>().unwrap());
        assert_eq!(page.len(), 256);
        println!(
            "BENCH reopen after SIGKILL (cold cache: {cold}): open {:.1} ms, ready (stats + first page) {:.1} ms; {}",
            opened.as_secs_f64() * 1e3,
            ready.as_secs_f64() * 1e3,
            rss()
        );
        // Walk the whole backlog: RSS must stay flat (bounded cache).
        let started = Instant::now();
        let mut cursor = ReadySeq(0);
        let mut seen = 0;
        loop {
            let page = s.ready_after(cursor.into(), 1000).await.unwrap();
            let Some(last) = page.last() else { break };
            cursor = last.seq;
            seen += page.len();
        }
        println!(
            "BENCH walked {seen} ready units in {:.1} s; {}",
            started.elapsed().as_secs_f64(),
            rss()
        );
        drop(s);
        drop_caches();
        let started = Instant::now();
        let options = FileOptions {
            verify_on_open: true,
            ..FileOptions::pending()
        };
        let s = FilePendingStore::open_with(&dir, limits(), options).unwrap();
        println!(
            "BENCH open with verify_on_open (checksum of every page, cold cache: {cold}): {:.0} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        drop(s);
    });
}

/// A unit whose records are still in `pending.redb` but which is missing from the
/// `unit_seq` index (plain bytes, outside the sealed records) is not taken for completed
/// by `units()` — restoring routed work after a restart would forget it — but fails
/// closed naming the table. Regression input for the `data_dir_recovery` fuzz target:
/// `fuzz/corpus/data_dir_recovery/crash-unit-index`.
#[test]
fn a_pending_unit_missing_from_the_unit_index_fails_closed() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime();
    let id = rt.block_on(async {
        let s = open_all(tmp.path());
        let rec = record("esme1", "447700900001", "indexed");
        let id = rec.id;
        assert_eq!(s.pending.admit(vec![rec]).await.unwrap(), vec![AdmitOutcome::Admitted]);
        assert_eq!(s.pending.units(&[id]).await.unwrap().len(), 1);
        id
    });
    // The damage: the unit's index entry is gone, its records stay.
    {
        let unit_seq: redb::TableDefinition<&[u8; 16], u64> = redb::TableDefinition::new("unit_seq");
        let db = redb::Database::create(tmp.path().join("pending.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut t = txn.open_table(unit_seq).unwrap();
            assert!(t.remove(&id.to_bytes()).unwrap().is_some());
        }
        txn.commit().unwrap();
    }
    rt.block_on(async {
        let s = open_all(tmp.path());
        let crate::error::PendingError::Backend(failure) = s.pending.units(&[id]).await.unwrap_err();
        assert_eq!(failure.kind, FailureKind::Corrupt, "{failure}");
        assert!(failure.to_string().contains("unit_seq"), "{failure}");
        // A completed unit is simply absent.
        assert!(s.pending.units(&[MessageId::generate()]).await.unwrap().is_empty());
    });
}

/// Units recorded by `s.rw`, as restore reads them.
async fn routed_ids(s: &Stores) -> Vec<MessageId> {
    s.rw.load_after(None, 1000)
        .await
        .unwrap()
        .iter()
        .map(|u| u.id)
        .collect()
}

#[test]
fn background_stages_checkpoint_only_what_is_live() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let s = open_all(tmp.path());
        s.rw.store().journal().pause_ticks();
        let units: Vec<_> = (0..100).map(|_| routed(MessageId::generate(), 1)).collect();
        s.rw.record(units.clone()).await.unwrap();
        let gone: Vec<_> = units[..90].iter().map(|u| u.id).collect();
        s.rw.remove(&gone).await.unwrap();
        let staged: Vec<_> = (1..=100)
            .map(|n| StagedUnit {
                id: MessageId::generate(),
                seq: ReadySeq(n),
            })
            .collect();
        s.rq.stage(&staged, ReadySeq(100)).await.unwrap();
        let released: Vec<_> = staged[..95].iter().map(|u| u.id).collect();
        s.rq.release(&released).await.unwrap();
        assert!(
            s.rw.units_in_file().is_empty(),
            "nothing reaches the file before a checkpoint"
        );
        assert!(s.rq.staged_in_file().is_empty());

        s.rw.store().checkpoint_now().unwrap();
        s.rq.store().checkpoint_now().unwrap();
        let live: Vec<_> = units[90..].iter().map(|u| u.id).collect();
        assert_eq!(s.rw.units_in_file(), live, "only the units live at the checkpoint");
        assert_eq!(s.rq.staged_in_file(), (96..=100).collect::<Vec<u64>>());

        // A unit of the file removed, another recorded: the next checkpoint writes both.
        s.rw.remove(&[live[0]]).await.unwrap();
        let late = routed(MessageId::generate(), 1);
        s.rw.record(vec![late.clone()]).await.unwrap();
        s.rw.store().checkpoint_now().unwrap();
        let mut expected = live[1..].to_vec();
        expected.push(late.id);
        assert_eq!(s.rw.units_in_file(), expected);
        assert_eq!(routed_ids(&s).await, expected);
        assert_eq!(s.rw.stats().await.unwrap().open_branches, 10);
    });
}

#[test]
fn a_background_write_whose_frame_fails_to_sync_is_not_kept() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let s = open_all(tmp.path());
        let a = routed(MessageId::generate(), 1);
        let b = routed(MessageId::generate(), 1);
        let c = routed(MessageId::generate(), 1);
        s.rw.record(vec![a.clone()]).await.unwrap();
        let faults = s.rw.store().journal().faults().clone();
        faults.sync.store(true, std::sync::atomic::Ordering::Relaxed);
        let err = s.rw.record(vec![b.clone()]).await.unwrap_err();
        let f = crate::StorageError::from(err).failure().clone();
        assert!(f.location.contains("journal."), "{f}");
        faults.sync.store(false, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(routed_ids(&s).await, vec![a.id], "the refused record is not kept");
        s.rw.record(vec![c.clone()]).await.unwrap();
        assert_eq!(routed_ids(&s).await, vec![a.id, c.id]);
        drop(s);
        let s = open_all(tmp.path());
        assert_eq!(routed_ids(&s).await, vec![a.id, c.id]);
    });
}

#[test]
fn a_failed_checkpoint_keeps_its_changes_for_the_next_one() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let s = open_all(tmp.path());
        s.rw.store().journal().pause_ticks();
        let units: Vec<_> = (0..3).map(|_| routed(MessageId::generate(), 2)).collect();
        s.rw.record(units[..2].to_vec()).await.unwrap();
        s.rw.store().checkpoint_now().unwrap();
        s.rw.remove(&[units[0].id]).await.unwrap();
        s.rw.record(vec![units[2].clone()]).await.unwrap();

        let faults = s.rw.store().file_faults();
        faults.io.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(s.rw.store().checkpoint_now().is_err());
        faults.io.store(false, std::sync::atomic::Ordering::Relaxed);
        let live = vec![units[1].id, units[2].id];
        assert_eq!(routed_ids(&s).await, live, "writes go on while the file is failing");
        // The file is reopened (and recovered), then rewritten from the state.
        s.rw.store().checkpoint_now().unwrap();
        assert_eq!(s.rw.units_in_file(), live);
        assert_eq!(s.rw.stats().await.unwrap().open_branches, 4);
        drop(s);
        let s = open_all(tmp.path());
        assert_eq!(routed_ids(&s).await, live);
        assert_eq!(s.rw.stats().await.unwrap().open_branches, 4);
    });
}

#[test]
fn held_units_read_as_stored_ones_and_reach_the_file_at_a_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let s = open_paused(tmp.path());
        let mut idem = record("esme1", "447700900001", "with key");
        idem.idempotency_key = Some("key-1".into());
        let mut rich = record("esme2", "447700900002", "every field");
        rich.callback_url = Some("http://127.0.0.1:9/cb".into());
        rich.valid_until = Some(Timestamp(u64::MAX / 2));
        rich.dlr_mask = Some(31);
        rich.destination_hint = Some("up-b".into());
        rich.service_type = "CMT".into();
        rich.route_priority = 3;
        let batch = vec![
            idem,
            rich,
            record("esme1", "447700900003", "plain"),
            part("esme1", "447700900004", 9, 2, 1, LONG),
            part("esme1", "447700900004", 9, 2, 2, LONG),
        ];
        s.pending.admit(batch).await.unwrap();
        assert_eq!(s.pending.held_units(), 3, "the single-record units");
        assert_eq!(s.pending.records_in_file(), 5, "held records count as stored");
        let held = s.pending.ready_after(crate::ReadyCursor::START, 100).await.unwrap();
        assert_eq!(held.len(), 4, "3 singles + 1 complete group");
        let ids: Vec<_> = held.iter().map(|u| u.unit.id).collect();
        assert_eq!(s.pending.units(&ids).await.unwrap(), held);

        s.pending.checkpoint_now().unwrap();
        assert_eq!(s.pending.held_units(), 0, "written into the tables");
        assert_eq!(
            s.pending.ready_after(crate::ReadyCursor::START, 100).await.unwrap(),
            held
        );
        assert_eq!(s.pending.units(&ids).await.unwrap(), held);
        assert_eq!(s.pending.stats().await.unwrap().records, 5);

        // Held and stored units interleave by seq, and a completion finds either.
        let more: Vec<_> = (0..3)
            .map(|i| record("esme1", "447700900005", &format!("more {i}")))
            .collect();
        s.pending.admit(more).await.unwrap();
        assert_eq!(s.pending.held_units(), 3);
        s.pending.complete(&[held[0].unit.id, ids[3]]).await.unwrap();
        let mixed = s.pending.ready_after(crate::ReadyCursor::START, 100).await.unwrap();
        assert_eq!(mixed.len(), 5);
        assert_eq!(mixed[..2].to_vec(), held[1..3].to_vec());
        assert!(mixed.windows(2).all(|w| w[0].seq < w[1].seq), "in seq order");
        // A limit cuts the merged order, and a cursor resumes it.
        let first = s.pending.ready_after(crate::ReadyCursor::START, 3).await.unwrap();
        assert_eq!(first, mixed[..3].to_vec());
        let mut cursor = crate::ReadyCursor::START;
        for u in &first {
            cursor.advance(u.seq);
        }
        let rest = s.pending.ready_after(cursor, 100).await.unwrap();
        assert_eq!(rest, mixed[3..].to_vec());
        let held_ids: Vec<_> = mixed[2..].iter().map(|u| u.unit.id).collect();
        s.pending.complete(&held_ids[..1]).await.unwrap();
        assert_eq!(s.pending.held_units(), 2, "completed in memory");
        let stats = s.pending.stats().await.unwrap();
        assert_eq!((stats.records, stats.ready_units), (4, 4));

        // The last two commits changed only held units: no redb commit, the counters in
        // memory. A clean close writes both, so the reopen has nothing to replay.
        let receipts = stats.receipt_requests;
        drop(s);
        let s = open_all(tmp.path());
        assert_eq!(s.pending.replayed_frames(), 0);
        let survivors: Vec<_> = mixed[..2].iter().chain(&mixed[3..]).cloned().collect();
        assert_eq!(
            s.pending.ready_after(crate::ReadyCursor::START, 100).await.unwrap(),
            survivors
        );
        assert_eq!(s.pending.stats().await.unwrap().receipt_requests, receipts);
        s.pending
            .admit(vec![record("esme1", "447700900006", "next")])
            .await
            .unwrap();
        let all = s.pending.ready_after(crate::ReadyCursor::START, 100).await.unwrap();
        assert!(all.last().unwrap().seq > survivors.last().unwrap().seq, "seqs go on");
    });
}

#[test]
fn commits_that_change_only_held_units_are_replayed_after_a_crash() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let s = open_paused(tmp.path());
        let batch = plain(4);
        s.pending.admit(batch).await.unwrap();
        let units = s.pending.ready_after(crate::ReadyCursor::START, 100).await.unwrap();
        s.pending.complete(&[units[0].unit.id]).await.unwrap();
        let receipts = s.pending.stats().await.unwrap().receipt_requests;
        // What a SIGKILL leaves: the file as of its last durable commit, and the journal.
        std::mem::forget(s);
        let copy = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(tmp.path()).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_file() {
                std::fs::copy(entry.path(), copy.path().join(entry.file_name())).unwrap();
            }
        }
        let s = open_all(copy.path());
        assert!(s.pending.replayed_frames() >= 2, "the admission and the completion");
        assert_eq!(
            s.pending.ready_after(crate::ReadyCursor::START, 100).await.unwrap(),
            units[1..].to_vec()
        );
        assert_eq!(s.pending.stats().await.unwrap().receipt_requests, receipts);
    });
}

/// Stores opened paused holding `n` plain units, then a multipart part: a part is stored,
/// so its commit writes redb with a journal LSN past the held units' frames.
async fn held_then_a_stored_part(path: &Path, n: usize) -> Stores {
    let s = open_paused(path);
    s.pending.admit(plain(n)).await.unwrap();
    assert_eq!(s.pending.held_units(), n);
    s.pending
        .admit(vec![part("esme1", "447700900005", 7, 2, 1, LONG)])
        .await
        .unwrap();
    assert_eq!(s.pending.held_units(), n, "the part is stored");
    s
}

/// A panic inside a pending write leaves the handle untrusted; its reopen closes it
/// first. Held units whose frames a non-durable commit's journal LSN already covers must
/// still be in the file that reopen (and a later restart) reads — whether the step before
/// that close stores them, or fails and the handle closes without writing.
#[test]
fn a_panic_after_the_answer_loses_no_held_unit() {
    for close_fails in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        runtime().block_on(async {
            let s = held_then_a_stored_part(tmp.path(), 4).await;
            s.pending.fail_close(close_fails);
            s.pending
                .before_apply(|| panic!("injected: the storage engine fails after the answer"));
            let last = record("esme1", "447700900001", "answered");
            let last_id = last.id;
            let _ = s.pending.admit(vec![last]).await;
            let ready = s.pending.ready_after(crate::ReadyCursor::START, 100).await.unwrap();
            assert_eq!(ready.len(), 5, "the four held units and the last admission: {ready:?}");
            assert!(ready.iter().any(|u| u.unit.id == last_id));
            assert_eq!(s.pending.stats().await.unwrap().records, 6, "and the part");
            // The reopened handle writes.
            s.pending.fail_close(false);
            s.pending.complete(&[ready[0].unit.id]).await.unwrap();
            drop(s);
            let s = open_all(tmp.path());
            assert_eq!(
                s.pending.ready_after(crate::ReadyCursor::START, 100).await.unwrap(),
                ready[1..].to_vec(),
                "after a restart (the close step failed: {close_fails})"
            );
            assert_eq!(s.pending.stats().await.unwrap().records, 5);
        });
    }
}

/// The step before closing cannot store the held units (an error that is not the disk's):
/// the handle must then close without making its non-durable commits durable, whose
/// journal LSN covers the held units' frames, so the restart replays them.
#[test]
fn a_close_that_cannot_store_the_held_units_loses_none() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let s = held_then_a_stored_part(tmp.path(), 4).await;
        let ready = s.pending.ready_after(crate::ReadyCursor::START, 100).await.unwrap();
        assert_eq!(ready.len(), 4);
        s.pending.fail_close(true);
        drop(s);
        let s = open_all(tmp.path());
        assert_eq!(
            s.pending.ready_after(crate::ReadyCursor::START, 100).await.unwrap(),
            ready,
            "after a restart"
        );
        assert_eq!(s.pending.stats().await.unwrap().records, 5, "and the part");
    });
}

#[test]
fn a_failed_checkpoint_loses_no_held_unit() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let s = open_paused(tmp.path());
        let batch = plain(4);
        s.pending.admit(batch).await.unwrap();
        assert_eq!(s.pending.held_units(), 4);
        let before = s.pending.ready_after(crate::ReadyCursor::START, 100).await.unwrap();

        s.pending.faults().io.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(s.pending.checkpoint_now().is_err());
        s.pending.faults().io.store(false, std::sync::atomic::Ordering::Relaxed);
        // The file is reopened and the journal replayed into its tables.
        assert_eq!(
            s.pending.ready_after(crate::ReadyCursor::START, 100).await.unwrap(),
            before
        );
        assert_eq!(s.pending.held_units(), 0);
        assert_eq!(s.pending.stats().await.unwrap().records, 4);
        s.pending.complete(&[before[0].unit.id]).await.unwrap();
        drop(s);
        let s = open_all(tmp.path());
        assert_eq!(
            s.pending.ready_after(crate::ReadyCursor::START, 100).await.unwrap(),
            before[1..].to_vec()
        );
    });
}

#[test]
fn admissions_past_the_held_bound_are_stored() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let s = open_paused(tmp.path());
        let batch = plain(20);
        s.pending.admit(batch).await.unwrap();
        assert_eq!(s.pending.held_units(), 8, "the bound in tests");
        let all = s.pending.ready_after(crate::ReadyCursor::START, 100).await.unwrap();
        assert_eq!(all.len(), 20);
        assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
        let ids: Vec<_> = all.iter().map(|u| u.unit.id).collect();
        s.pending.complete(&ids[..10]).await.unwrap();
        assert_eq!(s.pending.held_units(), 0, "the first 8 were the held ones");
        s.pending
            .admit(vec![record("esme1", "447700900001", "late")])
            .await
            .unwrap();
        assert_eq!(s.pending.held_units(), 1, "room again");
        assert_eq!(s.pending.stats().await.unwrap().records, 11);
    });
}

/// Between a checkpoint's commit and its dropping the units it stored, they are both in
/// the tables and held: stats count each once.
#[test]
fn stats_during_a_checkpoint_count_each_unit_once() {
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let s = held_then_a_stored_part(tmp.path(), 3).await;
        let before = s.pending.stats().await.unwrap();
        assert_eq!((before.records, before.ready_units), (4, 3));
        let seen = Arc::new(std::sync::Mutex::new(None));
        let (pending, slot) = (s.pending.clone(), seen.clone());
        s.pending.after_storing_held(move || {
            let stats = std::thread::spawn(move || runtime().block_on(pending.stats()).unwrap())
                .join()
                .unwrap();
            *slot.lock().unwrap() = Some(stats);
        });
        s.pending.checkpoint_now().unwrap();
        assert_eq!(seen.lock().unwrap().take(), Some(before.clone()), "in the window");
        assert_eq!(s.pending.held_units(), 0);
        assert_eq!(s.pending.stats().await.unwrap(), before, "after it");
    });
}

#[test]
fn a_commit_racing_a_checkpoint_keeps_its_held_units() {
    use crate::pending::BlockingPendingWriter;
    let tmp = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let s = open_paused(tmp.path());
        let first = record("esme1", "447700900001", "stored by the checkpoint");
        let late = record("esme1", "447700900001", "admitted meanwhile");
        let ids = vec![first.id, late.id];
        s.pending.admit(vec![first]).await.unwrap();
        assert_eq!(s.pending.held_units(), 1);
        // Once the checkpoint has committed, and before it drops what it stored from
        // memory, another thread commits an admission (the committer beside the
        // journal's checkpointer) and gets time to finish.
        let racer = Arc::new(std::sync::Mutex::new(None));
        let (pending, slot) = (s.pending.clone(), racer.clone());
        s.pending.after_storing_held(move || {
            let handle = std::thread::spawn(move || {
                BlockingPendingWriter::commit(&pending, vec![late], &[], &mut |_| {}).unwrap();
            });
            std::thread::sleep(Duration::from_millis(200));
            *slot.lock().unwrap() = Some(handle);
        });
        s.pending.checkpoint_now().unwrap();
        let handle = racer.lock().unwrap().take().unwrap();
        handle.join().unwrap();
        let ready = s.pending.ready_after(crate::ReadyCursor::START, 100).await.unwrap();
        assert_eq!(ready.iter().map(|u| u.unit.id).collect::<Vec<_>>(), ids);
        assert_eq!(s.pending.held_units(), 1, "the later admission is still held");
        drop(s);
        let s = open_all(tmp.path());
        let ready = s.pending.ready_after(crate::ReadyCursor::START, 100).await.unwrap();
        assert_eq!(ready.iter().map(|u| u.unit.id).collect::<Vec<_>>(), ids);
    });
}
