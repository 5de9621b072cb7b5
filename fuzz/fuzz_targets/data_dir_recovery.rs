//! Recovery of a file data directory (`sendium_storage::file`) whose bytes were damaged.
//!
//! Once per process a small valid data directory is built: the four file stores opened,
//! singles and multipart parts admitted (one group complete, one not), units staged and
//! routed with a completed branch, a DLR handoff with a matched and an orphan receipt
//! and a failed handoff's pending delivery. Two images of it are kept in memory: one
//! copied while the stores were open (the journal holds frames the redb files do not:
//! a crash image, whose reopen replays them) and one after the stores closed.
//!
//! Input: a byte choosing the image, then mutations, each a file, an operation and an
//! offset: set a byte, flip bits, truncate the file, or overwrite a run with input bytes.
//! The damaged files are written to a fresh directory, which is opened as Sendium opens
//! it (manifest, pending, router-queue, routed-work, DLR) and read back through every
//! stage (ready units and their records, staged units and cursor, routed units, DLR
//! stats and due deliveries), then written to once.
//!
//! Checked: every step either succeeds or fails with an error; nothing panics; each run
//! is bounded (reads are limited, and libFuzzer's `-timeout` catches a hang). What is
//! read back is consistent: `units()` agrees with `ready_after()`.
//!
//! Panics: redb documents that a file altered behind its back may make it panic instead
//! of failing, and the stores catch those (`engine::db`: the open runs under
//! `catch_unwind`, every call on the blocking pool turns a panic into a `Corrupt`
//! failure). So a panic raised in redb's own source is let through to that catch; a
//! panic anywhere else aborts the run, even one a store would catch, and so does any
//! panic that escapes the stores.
#![no_main]
#![forbid(unsafe_code)]

use std::panic::PanicHookInfo;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use sendium_fuzz::Input;
use sendium_storage::file::manifest::Manifest;
use sendium_storage::file::{DataDir, FileDlrStore, FilePendingStore, FileRoutedWorkStore, FileRouterQueueStore};
use sendium_storage::memory::PendingLimits;
use sendium_storage::{
    Address, AdmitOutcome, Branch, BranchDone, BranchKind, BranchOutcome, Channel, ClaimScope, DlrRetention, DlrState,
    DlrStore, DlrWrite, Handoff, HandoffOutcome, MessageId, PartInfo, PendingRecord, PendingStore, ProviderReceipt,
    ReadySeq, ReceiptOutcome, ReceiptTarget, ReplyPath, RoutedUnit, RoutedWorkStore, RoutedWrite, RouterQueueStore,
    RouterQueueWrite, StagedUnit, Timestamp,
};

/// Reads are limited so a damaged count cannot make a run long.
const READ_LIMIT: usize = 1_000;
/// Mutations per input.
const MAX_MUTATIONS: usize = 32;
/// The files of a data directory that are kept (the lock file is not: it holds a pid).
const FILES: [&str; 7] = [
    "manifest.json",
    "journal.0",
    "journal.1",
    "pending.redb",
    "router-queue.redb",
    "routed-work.redb",
    "dlr.redb",
];

/// One file of an image: its bytes up to the last non-zero one, and its length (the
/// rest is zeros, written as a hole).
#[derive(Clone)]
struct File {
    name: &'static str,
    bytes: Vec<u8>,
    len: u64,
}

struct Base {
    runtime: tokio::runtime::Runtime,
    scratch: PathBuf,
    images: [Vec<File>; 2],
}

fn retention() -> DlrRetention {
    DlrRetention {
        retention: Duration::from_secs(86_400),
        orphan_retention: Duration::from_secs(3_600),
    }
}

/// Where the directories go: memory when the machine has /dev/shm (fsync is free there).
fn scratch() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

fn record(account: &str, destination: &str, text: &str, part: Option<(u16, u8, u8)>) -> PendingRecord {
    let now = Timestamp::now();
    PendingRecord {
        id: MessageId::generate(),
        account: account.into(),
        channel: Channel::Smpp,
        source: Address::new(5, 0, "Sendium"),
        destination: Address::new(1, 1, destination),
        service_type: String::new(),
        esm_class: 0,
        protocol_id: 0,
        priority: 0,
        data_coding: 0,
        payload: text.as_bytes().to_vec(),
        part: part.map(|(reference, total, seq)| PartInfo {
            reference,
            total,
            seq,
            expires_at: now.saturating_add(Duration::from_secs(3_600)),
        }),
        registered_delivery: 1,
        callback_url: None,
        idempotency_key: None,
        accepted_at: now,
        valid_until: None,
        dlr_mask: None,
        route_priority: 0,
        destination_hint: None,
        deliver_at: None,
    }
}

fn target(submit_id: MessageId) -> ReceiptTarget {
    ReceiptTarget {
        submit_id,
        account: "esme1".into(),
        reply: ReplyPath::Smpp,
        source: Address::new(5, 0, "Sendium"),
        destination: Address::new(1, 1, "46700000001"),
        submitted_at: Timestamp::now(),
        failure_only: false,
    }
}

fn read_image(dir: &Path) -> Vec<File> {
    FILES
        .iter()
        .map(|&name| {
            let bytes = std::fs::read(dir.join(name)).unwrap_or_default();
            let len = bytes.len() as u64;
            let used = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
            File {
                name,
                bytes: bytes[..used].to_vec(),
                len,
            }
        })
        .collect()
}

/// Panics raised in redb's source (caught by the stores and reported as `Corrupt`).
static ENGINE_PANICS: AtomicU64 = AtomicU64::new(0);

fn in_redb(info: &PanicHookInfo<'_>) -> bool {
    info.location().is_some_and(|l| {
        let file = l.file().replace('\\', "/");
        file.contains("/redb-") && file.contains("/src/")
    })
}

/// Let redb's own panics reach the stores' `catch_unwind`; every other panic goes to
/// libFuzzer's hook, which aborts.
fn install_panic_hook() {
    let fuzzer_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if in_redb(info) {
            let n = ENGINE_PANICS.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                eprintln!(
                    "data_dir_recovery: {n} redb panics on damaged files so far (caught by the stores), last: {info}"
                );
            }
            // SENDIUM_FUZZ_TRACE=1: where each of them came from.
            if std::env::var_os("SENDIUM_FUZZ_TRACE").is_some() {
                eprintln!("{info}\n{}", std::backtrace::Backtrace::force_capture());
            }
        } else {
            fuzzer_hook(info);
        }
    }));
}

/// Build the valid data directory and keep its two images.
fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(|| {
        install_panic_hook();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let scratch = scratch();
        let tmp = tempfile::Builder::new()
            .prefix("sendium-fuzz-base-")
            .tempdir_in(&scratch)
            .expect("a scratch directory");
        let path = tmp.path().join("data");
        let open_image = runtime.block_on(async {
            let dir = Arc::new(DataDir::open(&path).expect("open the data directory"));
            dir.write_manifest(&Manifest::new("file", "file", "file", "file"))
                .expect("write the manifest");
            let pending = FilePendingStore::open(&dir, PendingLimits::default()).expect("open pending");
            let rq = FileRouterQueueStore::open(&dir).expect("open router-queue");
            let rw = FileRoutedWorkStore::open(&dir).expect("open routed-work");
            let dlr = FileDlrStore::open(&dir, retention()).expect("open dlr");
            dir.file_stages_opened();

            let mut keyed = record("esme1", "46700000001", "with key", None);
            keyed.idempotency_key = Some("key-1".into());
            let batch = vec![
                keyed,
                record("esme1", "46700000002", "hello", None),
                record("esme2", "46700000003", "plain", None),
                record("esme1", "46700000004", "first ", Some((77, 2, 1))),
                record("esme1", "46700000004", "second", Some((77, 2, 2))),
                record("esme1", "46700000005", "lonely", Some((5, 3, 1))),
            ];
            let outcomes = pending.commit(batch, &[]).await.expect("admit");
            assert!(outcomes.iter().all(|o| *o == AdmitOutcome::Admitted), "{outcomes:?}");
            let ready = pending
                .ready_after(sendium_storage::ReadyCursor::START, 100)
                .await
                .expect("ready units");
            assert_eq!(ready.len(), 4, "3 singles and 1 complete group");

            let staged: Vec<StagedUnit> = ready.iter().map(StagedUnit::from).collect();
            rq.apply(RouterQueueWrite {
                stage: staged.clone(),
                cursor: Some(staged[3].seq.into()),
                release: vec![staged[0].id],
            })
            .await
            .expect("stage");

            let routed: Vec<RoutedUnit> = ready
                .iter()
                .take(3)
                .map(|u| RoutedUnit {
                    id: u.unit.id,
                    members: u.unit.member_ids(),
                    route: "default".into(),
                    routed_at: Timestamp::now(),
                    branches: vec![Branch {
                        no: 0,
                        kind: BranchKind::Primary,
                        targets: vec!["up-a".into(), "up-b".into()],
                        outcome: None,
                        failed_over_from: Vec::new(),
                    }],
                })
                .collect();
            rw.apply(RoutedWrite {
                record: routed.clone(),
                complete: vec![BranchDone {
                    unit: routed[0].id,
                    branch: 0,
                    outcome: BranchOutcome::Submitted {
                        destination: "up-a".into(),
                        provider_ids: vec!["0AF1".into()],
                    },
                }],
                ..RoutedWrite::default()
            })
            .await
            .expect("route");

            let handoffs = vec![
                Handoff {
                    unit: routed[0].id,
                    branch: 0,
                    destination: "up-a".into(),
                    outcome: HandoffOutcome::Submitted {
                        provider_keys: vec!["af1".into(), "af2".into()],
                    },
                    targets: vec![target(routed[0].id)],
                    handed_off_at: Timestamp::now(),
                },
                Handoff {
                    unit: routed[1].id,
                    branch: 0,
                    destination: "up-b".into(),
                    outcome: HandoffOutcome::Failed(ReceiptOutcome {
                        state: DlrState::Rejected,
                        error: "045".into(),
                        done_at: Timestamp::now(),
                    }),
                    targets: vec![target(routed[1].id)],
                    handed_off_at: Timestamp::now(),
                },
            ];
            let delivered = |keys: &[&str]| ProviderReceipt {
                destination: "up-a".into(),
                keys: keys.iter().map(|k| k.to_string()).collect(),
                outcome: ReceiptOutcome {
                    state: DlrState::Delivered,
                    error: "000".into(),
                    done_at: Timestamp::now(),
                },
            };
            let outcome = dlr
                .apply(DlrWrite {
                    handoffs,
                    receipts: vec![delivered(&["af1"]), delivered(&["unknown"])],
                    ..DlrWrite::default()
                })
                .await;
            outcome.handoffs.expect("handoffs");
            outcome.receipts.expect("receipts");

            // The crash image: copied while the stores are open.
            let image = read_image(&path);
            drop((pending, rq, rw, dlr, dir));
            image
        });
        let closed_image = read_image(&path);
        let base = Base {
            runtime,
            scratch,
            images: [open_image, closed_image],
        };
        // Both images open, and hold what was written.
        for image in &base.images {
            let summary = recover(&base, image).expect("a valid image does not open");
            assert_eq!(summary, (6, 4, 3, 3), "records, ready units, staged, routed");
        }
        base
    })
}

/// Write `image` to a fresh directory and open and read it as Sendium would. Returns
/// (records, ready units, staged units, routed units), or the first error.
fn recover(base: &Base, image: &[File]) -> Result<(u64, usize, usize, usize), String> {
    let tmp = tempfile::Builder::new()
        .prefix("sendium-fuzz-")
        .tempdir_in(&base.scratch)
        .map_err(|e| e.to_string())?;
    let path = tmp.path().join("data");
    std::fs::create_dir(&path).map_err(|e| e.to_string())?;
    for file in image {
        let name = path.join(file.name);
        std::fs::write(&name, &file.bytes).map_err(|e| e.to_string())?;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&name)
            .map_err(|e| e.to_string())?;
        f.set_len(file.len).map_err(|e| e.to_string())?;
    }
    base.runtime.block_on(async {
        let e = |e: &dyn std::fmt::Display| e.to_string();
        let dir = Arc::new(DataDir::open(&path).map_err(|x| e(&x))?);
        let _ = dir.manifest();
        let pending = FilePendingStore::open(&dir, PendingLimits::default()).map_err(|x| e(&x))?;
        let rq = FileRouterQueueStore::open(&dir).map_err(|x| e(&x))?;
        let rw = FileRoutedWorkStore::open(&dir).map_err(|x| e(&x))?;
        let dlr = FileDlrStore::open(&dir, retention()).map_err(|x| e(&x))?;
        dir.file_stages_opened();

        let stats = pending.stats().await.map_err(|x| e(&x))?;
        let ready = pending
            .ready_after(sendium_storage::ReadyCursor::START, READ_LIMIT)
            .await
            .map_err(|x| e(&x))?;
        let ids: Vec<_> = ready.iter().map(|u| u.unit.id).collect();
        let units = pending.units(&ids).await.map_err(|x| e(&x))?;
        // A unit missing from the `unit_seq` index while its records remain is a
        // `Corrupt` failure (corpus: crash-unit-index), not a unit skipped as completed.
        assert_eq!(units, ready, "units() and ready_after() disagree");
        let staged = rq.staged_after(ReadySeq(0), READ_LIMIT).await.map_err(|x| e(&x))?;
        rq.cursor().await.map_err(|x| e(&x))?;
        rq.stats().await.map_err(|x| e(&x))?;
        let routed = rw.load_after(None, READ_LIMIT).await.map_err(|x| e(&x))?;
        rw.stats().await.map_err(|x| e(&x))?;
        dlr.stats().await.map_err(|x| e(&x))?;
        dlr.release_claims(Duration::from_secs(60)).await.map_err(|x| e(&x))?;
        dlr.claim_due(Timestamp::now(), Duration::from_secs(60), READ_LIMIT, ClaimScope::All)
            .await
            .map_err(|x| e(&x))?;

        // The recovered store takes new work.
        let fresh = record("esme3", "46700000009", "after recovery", None);
        let admitted = pending.commit(vec![fresh], &[]).await.map_err(|x| e(&x))?;
        assert_eq!(admitted.len(), 1);
        Ok((stats.records, ready.len(), staged.len(), routed.len()))
    })
}

/// The byte at `at`, the file grown with zeros to reach it.
fn byte_at(bytes: &mut Vec<u8>, at: usize) -> &mut u8 {
    if bytes.len() <= at {
        bytes.resize(at + 1, 0);
    }
    &mut bytes[at]
}

fuzz_target!(|data: &[u8]| {
    let base = base();
    let mut input = Input::new(data);
    let mut image = base.images[usize::from(input.byte() & 1)].clone();
    let mut mutations = 0;
    while !input.is_empty() && mutations < MAX_MUTATIONS {
        mutations += 1;
        let file = &mut image[input.below(FILES.len())];
        let op = input.byte();
        // Offsets reach a little past the last non-zero byte.
        let span = file.bytes.len() + 64;
        let at = usize::try_from(input.u32()).unwrap_or(0) % span;
        match op % 4 {
            0 => {
                let value = input.byte();
                *byte_at(&mut file.bytes, at) = value;
            }
            1 => {
                let value = input.byte();
                *byte_at(&mut file.bytes, at) ^= value | 1;
            }
            2 => {
                file.bytes.truncate(at);
                file.len = file.len.min(at as u64);
            }
            _ => {
                let run = input.short_bytes();
                let end = at + run.len();
                if file.bytes.len() < end {
                    file.bytes.resize(end, 0);
                }
                file.bytes[at..end].copy_from_slice(run);
            }
        }
        file.len = file.len.max(file.bytes.len() as u64);
    }
    let _ = recover(base, &image);
});
