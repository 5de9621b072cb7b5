//! File-backed pending stage (`<dir>/pending.redb`).
//!
//! Semantics are exactly those of [`MemoryPendingStore`](crate::memory::MemoryPendingStore)
//! (the conformance suite runs against both); what the file adds is that an admitted
//! record survives SIGKILL: every `admit` is one redb write transaction, made durable
//! before the caller acknowledges anything — by a frame of the stages' journal
//! (`journal.0`/`journal.1`, one shared `fdatasync`; see [`super::engine::journal`] for
//! why and how it is replayed) or, when the journal cannot take frames, by committing
//! with `Durability::Immediate`.
//!
//! Tables (keys are big-endian, so byte order is the order the stage needs):
//!
//! | table | key | value |
//! |---|---|---|
//! | `records` | message id (16 bytes, UUIDv7: time order) | [`PendingRecord`] envelope |
//! | `ready` | [`ReadySeq`] | ready unit envelope (id, disposition, members) |
//! | `unit_seq` | unit id | its ready seq |
//! | `groups` | encoded [`GroupKey`] | incomplete group envelope (parts, deadline) |
//! | `group_deadlines` | (deadline ms, group key) | — |
//! | `completed_groups` | encoded [`GroupKey`] | completed group envelope, kept until its deadline |
//! | `completed_group_deadlines` | (deadline ms, group key) | — |
//! | `idempotency` | (account, key) | first admission's id and retention deadline |
//! | `idempotency_expiry` | (deadline ms, account, key) | — |
//! | `meta` | name | `layout`, `next_seq`, `receipt_requests`, `journal_lsn` |
//!
//! A single-record unit admitted by a journaled commit is held in memory instead of
//! `records`, `ready` and `unit_seq` until the next durable commit, which writes it there
//! if it is still pending (see [`held`]): most units are completed before then and never
//! reach the file.
//!
//! Nothing loads the backlog: selection reads `limit` entries of `ready` with a range,
//! expiry reads the first entries of `group_deadlines`, idempotency retention pops the
//! first entries of `idempotency_expiry`. `stats()` is O(log n): table lengths are kept
//! by redb in each tree's header, the receipt counter lives in `meta` and is updated in
//! the same transactions, and the oldest record is the first key of `records`.

mod held;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use async_trait::async_trait;
use parking_lot::{Condvar, Mutex, MutexGuard};
use redb::{Database, Durability, ReadableTable, ReadableTableMetadata, Table, TableDefinition, WriteTransaction};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use self::held::{Counters, HELD_UNITS, Held, HeldChanges, HeldUnit, HeldUnits, Tracked};
use super::engine::db::{
    Fail, FileOptions, META, StoreFile, blocking, check_layout, encode, get_counter, on_this_thread,
};
use super::engine::dir::{DataDir, PENDING_FILE};
use super::engine::journal::{Checkpoint, Journal, Stage};
use super::engine::journaled::JOURNAL_LSN;
use super::records::{GroupState, IdempotencyEntry, UnitEntry};
use crate::backend::{Backend, StageCapabilities};
use crate::envelope::{self, RecordKind};
use crate::error::{BackendFailure, FailureKind, PendingError};
use crate::failpoint;
use crate::ids::{MessageId, ReadyCursor, ReadySeq, Timestamp, UnitId};
use crate::memory::PendingLimits;
use crate::pending::{
    AdmitOutcome, BlockingPendingWriter, Disposition, PendingCapabilities, PendingStats, PendingStore, ReadyUnit, Unit,
};
use crate::reassembly::{self, GroupView, KeyState, Placement, group_key_bytes, group_prefix};
use crate::record::PendingRecord;

const RECORDS: TableDefinition<&[u8; 16], &[u8]> = TableDefinition::new("records");
const READY: TableDefinition<u64, &[u8]> = TableDefinition::new("ready");
const UNIT_SEQ: TableDefinition<&[u8; 16], u64> = TableDefinition::new("unit_seq");
const GROUPS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("groups");
const DEADLINES: TableDefinition<(u64, &[u8]), ()> = TableDefinition::new("group_deadlines");
const COMPLETED: TableDefinition<&[u8], &[u8]> = TableDefinition::new("completed_groups");
const COMPLETED_DEADLINES: TableDefinition<(u64, &[u8]), ()> = TableDefinition::new("completed_group_deadlines");
const IDEM: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("idempotency");
const IDEM_EXPIRY: TableDefinition<(u64, &str, &str), ()> = TableDefinition::new("idempotency_expiry");

/// The table layout this build reads and writes: commits durable through the stages'
/// journal (`meta.journal_lsn`). A file of any other layout does not open.
const LAYOUT: u64 = 2;
const NEXT_SEQ: &str = "next_seq";
const RECEIPTS: &str = "receipt_requests";
/// Expired idempotency keys forgotten per admission at most, so one admission after a
/// long quiet spell does not turn into a huge transaction. Lookups also check the
/// deadline, so a key not yet forgotten never deduplicates past its retention.
const FORGET_PER_ADMIT: usize = 4096;

/// The file-backed pending store.
#[derive(Clone)]
pub struct FilePendingStore {
    inner: Arc<Inner>,
}

struct Inner {
    file: StoreFile,
    limits: PendingLimits,
    journal: Arc<Journal>,
    /// Journal frames applied by the last (re)open.
    replayed: Arc<AtomicUsize>,
    /// Set while a commit's clients have their answers and its records are not yet
    /// readable (see [`Inner::write`]); `stats` and `units` wait for it, so they see
    /// every acknowledged admission.
    answered_unapplied: Mutex<bool>,
    applied: Condvar,
    /// Units held in memory instead of the tables (see [`held`]).
    held: Arc<Held>,
    /// Taken for a whole [`Inner::write`], past its redb commit: the committer and the
    /// journal's checkpointer both write, and a commit's changes to the held units are
    /// applied after redb has let the next writer in.
    writer: Mutex<()>,
    /// Runs once, after the next durable commit that stores the held units and before
    /// they are dropped from memory.
    #[cfg(test)]
    after_storing_held: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Runs once, where the `pending-apply` failpoint is: answered, not yet applied.
    #[cfg(test)]
    before_apply: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

/// Makes the store's readers wait from [`start`](Self::start) until it is dropped: when
/// the write has committed, or failed (the file is then invalidated, and the next read
/// reopens it and replays the frame), or panicked.
struct ReadersWait<'a>(&'a Inner);

impl ReadersWait<'_> {
    fn start(&self) {
        *self.0.answered_unapplied.lock() = true;
    }
}

impl Drop for ReadersWait<'_> {
    fn drop(&mut self) {
        let mut waiting = self.0.answered_unapplied.lock();
        if *waiting && std::thread::panicking() {
            // As `StoreFile::panicked` will: redb's state is untrusted, and a reader let
            // go now must reopen the file (replaying the answered frame), not read it.
            self.0.file.invalidate(FailureKind::Corrupt);
        }
        if *waiting {
            *waiting = false;
            self.0.applied.notify_all();
        }
    }
}

/// How a pending write may be made durable (see `Inner::write`).
enum Change {
    /// Nothing changed: the transaction is aborted.
    None,
    /// Only by a durable commit (expiry is not journaled; a checkpoint is one).
    Durable,
    /// By this journal frame, unless a checkpoint is due.
    Frame(JournalFrame),
    /// By this journal frame, whose admissions were decided but not applied yet: they
    /// are applied once the frame is synced and its outcomes answered (before the
    /// durable commit instead, if a checkpoint is due).
    Decided(JournalFrame, Decided),
}

/// What a commit decided and has still to apply to the tables: the admitted records
/// (in the frame's order) and, unless already done, the frame's completions. Applied in
/// the order a replay applies the frame ([`apply_frame`]): completions, forgotten
/// idempotency keys, admissions.
struct Decided {
    records: Vec<PendingRecord>,
    completions_applied: bool,
}

impl Decided {
    fn apply(self, t: &mut Tx<'_>, frame: JournalFrame) -> Result<(), Fail> {
        if !self.completions_applied {
            complete_in(t, &frame.complete)?;
        }
        t.forget_idempotency(frame.now)?;
        t.forget_completed_groups(frame.now)?;
        for (record, bytes) in self.records.into_iter().zip(frame.admit) {
            t.admit_one(record, bytes.into_vec(), frame.now, frame.idem_expiry)?;
        }
        Ok(())
    }
}

/// What one commit changed, as journaled: the decisions the live process made (records
/// admitted, sources completed, the clock it used), so a replay reaches the same state
/// whatever the limits of the process that replays it.
#[derive(Serialize, Deserialize)]
struct JournalFrame {
    now: Timestamp,
    idem_expiry: Timestamp,
    complete: Vec<UnitId>,
    /// The admitted records' envelopes, exactly as stored in `records`.
    admit: Vec<ByteBuf>,
}

impl FilePendingStore {
    /// Open (or create) `<dir>/pending.redb` with the default [`FileOptions::pending`].
    /// Blocking: call it at startup, before serving.
    pub fn open(dir: &Arc<DataDir>, limits: PendingLimits) -> Result<Self, BackendFailure> {
        Self::open_with(dir, limits, FileOptions::pending())
    }

    pub fn open_with(dir: &Arc<DataDir>, limits: PendingLimits, options: FileOptions) -> Result<Self, BackendFailure> {
        let journal = dir.journal()?;
        let replayed = Arc::new(AtomicUsize::new(0));
        let held = Arc::new(Held::default());
        let (replay, count, recovered, closing) = (journal.clone(), replayed.clone(), held.clone(), held.clone());
        let file = StoreFile::open_with(
            dir,
            PENDING_FILE,
            options,
            init,
            // One disk: a fault of the journal's is one of this file's too.
            journal.faults().clone(),
            Some(Box::new(move |db| {
                count.store(recover(db, &replay, options.quick_repair)?, Ordering::Relaxed);
                recovered.recovered();
                Ok(())
            })),
            Some(Box::new(move |db| store_held_units(db, &closing))),
        )?;
        let inner = Arc::new(Inner {
            file,
            limits,
            journal: journal.clone(),
            replayed,
            answered_unapplied: Mutex::new(false),
            applied: Condvar::new(),
            held,
            writer: Mutex::new(()),
            #[cfg(test)]
            after_storing_held: Mutex::new(None),
            #[cfg(test)]
            before_apply: Mutex::new(None),
        });
        journal.set_hook(Stage::Pending, Arc::downgrade(&inner) as Weak<dyn Checkpoint>);
        Ok(Self { inner })
    }

    /// The store file (for logs and `sendium inspect`).
    pub fn path(&self) -> &std::path::Path {
        self.inner.file.path()
    }

    /// Journal frames the last (re)open applied: commits acknowledged after the last
    /// checkpoint of a process that did not stop cleanly.
    pub fn replayed_frames(&self) -> usize {
        self.inner.replayed.load(Ordering::Relaxed)
    }

    /// Switch journal segments after `bytes` of frames or `after` (instead of the
    /// defaults).
    #[cfg(test)]
    pub(crate) fn set_checkpoints(&self, bytes: u64, after: std::time::Duration) {
        self.inner.journal.set_switch(bytes, after);
    }

    #[cfg(test)]
    pub(crate) fn journal(&self) -> &Arc<Journal> {
        &self.inner.journal
    }

    /// Records in the file as a read transaction sees them now, without waiting for
    /// an answered commit to be applied (so it can run inside one).
    #[cfg(test)]
    pub(crate) fn records_in_file(&self) -> u64 {
        self.inner.read_stats().map(|s| s.records).unwrap_or(u64::MAX)
    }

    /// Records as any reader of the store sees them (waiting for answered commits).
    #[cfg(test)]
    pub(crate) fn records_for_readers(&self) -> u64 {
        self.inner.stats().map(|s| s.records).unwrap_or(u64::MAX)
    }

    /// Whether the store has journal frames its file's durable state does not hold.
    #[cfg(test)]
    pub(crate) fn journal_uncovered(&self) -> bool {
        self.inner.journal.uncovered(Stage::Pending)
    }

    /// Units held in memory instead of the tables (see [`held`]).
    #[cfg(test)]
    pub(crate) fn held_units(&self) -> usize {
        self.inner.held.lock().len()
    }

    /// Run `f` after the next durable commit that stores the held units, before they are
    /// dropped from memory.
    #[cfg(test)]
    pub(crate) fn after_storing_held(&self, f: impl FnOnce() + Send + 'static) {
        *self.inner.after_storing_held.lock() = Some(Box::new(f));
    }

    /// Run `f` in the next journaled admission, after its answer and before its apply
    /// (where the `pending-apply` failpoint is).
    #[cfg(test)]
    pub(crate) fn before_apply(&self, f: impl FnOnce() + Send + 'static) {
        *self.inner.before_apply.lock() = Some(Box::new(f));
    }

    /// Make the step that stores the held units before a close fail.
    #[cfg(test)]
    pub(crate) fn fail_close(&self, fail: bool) {
        self.inner
            .held
            .fail_close
            .store(fail, std::sync::atomic::Ordering::Relaxed);
    }

    /// A durable commit now, which writes the held units into the tables.
    #[cfg(test)]
    pub(crate) fn checkpoint_now(&self) -> Result<(), BackendFailure> {
        self.inner.write(|_| Ok(((), Change::Durable)), &mut |_| {})
    }

    #[cfg(test)]
    pub(crate) fn invalidate(&self) {
        self.inner.file.invalidate(FailureKind::Unavailable);
    }

    #[cfg(test)]
    pub(crate) fn faults(&self) -> &super::engine::backend::FaultSwitch {
        &self.inner.file.faults
    }

    async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<R, BackendFailure> + Send + 'static,
    ) -> Result<R, PendingError> {
        Ok(blocking(&self.inner, |i| &i.file, f).await?)
    }
}

/// Create the tables, check the layout, and spot-check the first and last entries (a
/// record of a newer major version, or garbage, stops the open instead of a later read).
fn init(txn: &WriteTransaction) -> Result<(), Fail> {
    check_layout(txn, LAYOUT)?;
    let records = txn.open_table(RECORDS)?;
    let ready = txn.open_table(READY)?;
    txn.open_table(UNIT_SEQ)?;
    let groups = txn.open_table(GROUPS)?;
    txn.open_table(DEADLINES)?;
    txn.open_table(COMPLETED)?;
    txn.open_table(COMPLETED_DEADLINES)?;
    let idem = txn.open_table(IDEM)?;
    txn.open_table(IDEM_EXPIRY)?;
    let meta = txn.open_table(META)?;
    for entry in [records.first()?, records.last()?].into_iter().flatten() {
        decode_record(entry.1.value())?;
    }
    for entry in [ready.first()?, ready.last()?].into_iter().flatten() {
        decode_unit(entry.1.value())?;
    }
    // The counter of every lane's last seq is at most the stored next seq.
    let next_seq = get_counter(&meta, NEXT_SEQ)?;
    for lane in 0..ReadySeq::LANES as u8 {
        let lane_range = ReadySeq::in_lane(lane, 0).0..ReadySeq::lane_end(lane).0;
        if let Some(item) = ready.range(lane_range)?.next_back() {
            let seq = ReadySeq(item?.0.value());
            if seq.counter() > next_seq {
                return Err(Fail::Invalid {
                    table: "ready",
                    detail: "a ready unit's sequence number is beyond the stored next one".to_string(),
                });
            }
        }
    }
    for entry in [groups.first()?, groups.last()?].into_iter().flatten() {
        envelope::decode::<GroupState>(RecordKind::PendingGroup, entry.1.value())
            .map_err(|e| Fail::record("groups", "(first/last group)", e))?;
    }
    for entry in [idem.first()?, idem.last()?].into_iter().flatten() {
        envelope::decode::<IdempotencyEntry>(RecordKind::IdempotencyKey, entry.1.value())
            .map_err(|e| Fail::record("idempotency", "(first/last key)", e))?;
    }
    Ok(())
}

/// Apply the journal frames the file does not contain yet, durably. Runs on every
/// (re)open, before any caller sees the file. Returns how many frames it applied.
fn recover(db: &Database, journal: &Journal, quick_repair: bool) -> Result<usize, Fail> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    txn.set_quick_repair(quick_repair);
    let mut replayed = 0usize;
    let lsn = {
        let mut t = Tx::open(&txn, None)?;
        for frame in journal.register(Stage::Pending, t.journal_lsn).map_err(Fail::Located)? {
            let at = || format!("{} frame {}", journal.location(), frame.lsn);
            let decoded: JournalFrame = envelope::decode(RecordKind::PendingJournalFrame, &frame.payload)
                .map_err(|e| Fail::Located(e.at(at())))?;
            apply_frame(&mut t, decoded, frame.lsn)?;
            replayed += 1;
        }
        let lsn = journal.checkpoint_lsn();
        t.meta.insert(JOURNAL_LSN, lsn)?;
        t.save_counters()?;
        lsn
    };
    txn.commit()?;
    journal.checkpointed(Stage::Pending, lsn);
    if replayed > 0 {
        tracing::info!(file = %journal.location(), frames = replayed, "applied the pending journal after an unclean stop");
    }
    Ok(replayed)
}

/// Write the held units, and the counters commits that changed only held units kept in
/// memory, into the file before it is closed, in one durable commit: closing makes the
/// handle's non-durable commits durable, and with them the journal LSN they record, which
/// covers the frames of the held units; the file must hold what that LSN claims.
fn store_held_units(db: &Database, held: &Held) -> Result<(), Fail> {
    #[cfg(test)]
    if held.fail_close.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(Fail::Invalid {
            table: "meta",
            detail: "injected: the step before closing fails".into(),
        });
    }
    let mut units = held.lock();
    let counters = units.counters();
    if units.len() == 0 && counters.is_none() {
        return Ok(());
    }
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    {
        let mut t = Tx::open(&txn, None)?;
        for (seq, unit) in units.iter() {
            t.store_held(seq, unit)?;
        }
        if let Some(c) = counters {
            t.next_seq = c.next_seq;
            t.receipts = c.receipts;
            t.save_counters()?;
            t.meta.insert(JOURNAL_LSN, c.journal_lsn)?;
        }
    }
    txn.commit()?;
    units.clear();
    Ok(())
}

/// Redo one journaled commit, in the order the live commit did it.
fn apply_frame(t: &mut Tx<'_>, frame: JournalFrame, lsn: u64) -> Result<(), Fail> {
    complete_in(t, &frame.complete)?;
    t.forget_idempotency(frame.now)?;
    t.forget_completed_groups(frame.now)?;
    for bytes in frame.admit {
        let record: PendingRecord = envelope::decode(RecordKind::PendingRecord, &bytes)
            .map_err(|e| Fail::record("journal", format!("frame {lsn}"), e))?;
        t.admit_one(record, bytes.into_vec(), frame.now, frame.idem_expiry)?;
    }
    Ok(())
}

fn decode_record(bytes: &[u8]) -> Result<PendingRecord, Fail> {
    envelope::decode(RecordKind::PendingRecord, bytes).map_err(|e| Fail::message_record("records", e))
}

fn decode_unit(bytes: &[u8]) -> Result<UnitEntry, Fail> {
    envelope::decode(RecordKind::PendingUnit, bytes).map_err(|e| Fail::message_record("ready", e))
}

/// Decode a value of `table` (`groups` or `completed_groups`).
fn decode_group(table: &'static str, bytes: &[u8]) -> Result<GroupState, Fail> {
    envelope::decode(RecordKind::PendingGroup, bytes).map_err(|e| Fail::message_record(table, e))
}

/// A group as the `groups` or `completed_groups` table holds it.
struct StoredGroup {
    key: Vec<u8>,
    total: u8,
    state: GroupState,
}

/// The group [`Tx::key_state`] found for a group key.
struct KnownGroup {
    /// In `groups` (else in `completed_groups`).
    open: bool,
    group: StoredGroup,
}

impl KnownGroup {
    /// The group as [`reassembly::place`] sees it for a part at position `seq`.
    fn state(&self, seq: u8) -> KeyState {
        let at_seq = self
            .group
            .state
            .at(seq)
            .and_then(|p| Some((*p.ids.first()?, p.digest?)));
        KeyState::new(
            self.open,
            GroupView {
                total: self.group.total,
                at_seq,
            },
        )
    }
}

/// The first group of a group key (its [`group_prefix`]) in `table`, named `name`
/// (`groups` or `completed_groups`).
fn first_group(
    name: &'static str,
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    prefix: &[u8],
) -> Result<Option<StoredGroup>, Fail> {
    let (low, high) = (group_key_bytes(prefix, 0), group_key_bytes(prefix, u8::MAX));
    let Some(entry) = table.range::<&[u8]>(low.as_slice()..=high.as_slice())?.next() else {
        return Ok(None);
    };
    let (k, v) = entry?;
    let key = k.value().to_vec();
    let state = decode_group(name, v.value())?;
    let total = key.last().copied().unwrap_or(0);
    Ok(Some(StoredGroup { key, total, state }))
}

/// Build a unit from its entry, reading its member records.
fn build_unit(
    records: &impl ReadableTable<&'static [u8; 16], &'static [u8]>,
    seq: u64,
    entry: UnitEntry,
) -> Result<ReadyUnit, Fail> {
    let mut parts = Vec::with_capacity(entry.members.len());
    for m in &entry.members {
        if let Some(v) = records.get(&m.to_bytes())? {
            parts.push(decode_record(v.value())?);
        }
    }
    Ok(ReadyUnit {
        seq: ReadySeq(seq),
        unit: Unit {
            id: entry.id,
            disposition: entry.disposition,
            parts,
        },
    })
}

/// The group keys a commit's admissions touch, as its admissions leave them, for
/// placing each part before any of the batch is applied (see [`Change::Decided`]): what
/// [`Tx::admit_one`] will find when it applies the same records in the same order.
#[derive(Default)]
struct BatchGroups {
    /// Group key prefix → what is known of it (`None`: no group, open or completed).
    keys: HashMap<Vec<u8>, Option<BatchGroup>>,
}

struct BatchGroup {
    /// Open (else completed: known until its deadline).
    open: bool,
    total: u8,
    deadline: Timestamp,
    /// Position → the id and submission digest of the record first admitted there.
    parts: std::collections::BTreeMap<u8, (MessageId, u64)>,
}

impl BatchGroup {
    fn state(&self, seq: u8, now: Timestamp) -> Option<KeyState> {
        if !self.open && self.deadline <= now {
            return None;
        }
        let view = GroupView {
            total: self.total,
            at_seq: self.parts.get(&seq).copied(),
        };
        Some(KeyState::new(self.open, view))
    }
}

impl BatchGroups {
    /// Where `record` (with submission digest `digest`) goes at `now` (see
    /// [`crate::reassembly`]).
    fn place(&mut self, t: &Tx<'_>, record: &PendingRecord, digest: u64, now: Timestamp) -> Result<Placement, Fail> {
        let (Some(gk), Some(info)) = (record.group_key(), record.part) else {
            return Ok(Placement::Join);
        };
        let prefix = group_prefix(&gk);
        let known = match self.keys.get(&prefix) {
            Some(known) => known.as_ref(),
            None => {
                let stored = t.key_state(&prefix, now)?.map(|k| BatchGroup {
                    open: k.open,
                    total: k.group.total,
                    deadline: k.group.state.deadline,
                    parts: k
                        .group
                        .state
                        .parts
                        .iter()
                        .filter_map(|p| Some((p.seq, (*p.ids.first()?, p.digest?))))
                        .collect(),
                });
                self.keys.entry(prefix).or_insert(stored).as_ref()
            }
        };
        Ok(reassembly::place(
            record,
            digest,
            known.and_then(|g| g.state(info.seq, now)),
        ))
    }

    /// `record`, placed by [`Self::place`] (not a retransmission), is admitted.
    fn admitted(&mut self, record: &PendingRecord, digest: u64, placement: Placement) {
        let (Some(gk), Some(info)) = (record.group_key(), record.part) else {
            return;
        };
        let slot = self.keys.entry(group_prefix(&gk)).or_insert(None);
        if placement == Placement::Supersede || slot.as_ref().is_some_and(|g| !g.open) {
            *slot = None;
        }
        let group = slot.get_or_insert_with(|| BatchGroup {
            open: true,
            total: info.total,
            deadline: info.expires_at,
            parts: Default::default(),
        });
        group.deadline = group.deadline.min(info.expires_at);
        group.parts.entry(info.seq).or_insert((record.id, digest));
        if group.parts.len() == usize::from(group.total) {
            group.open = false;
        }
    }
}

/// The tables of one write transaction and the counters it updates.
struct Tx<'t> {
    records: Tracked<'t, &'static [u8; 16], &'static [u8]>,
    ready: Tracked<'t, u64, &'static [u8]>,
    unit_seq: Tracked<'t, &'static [u8; 16], u64>,
    groups: Tracked<'t, &'static [u8], &'static [u8]>,
    deadlines: Tracked<'t, (u64, &'static [u8]), ()>,
    completed: Tracked<'t, &'static [u8], &'static [u8]>,
    completed_deadlines: Tracked<'t, (u64, &'static [u8]), ()>,
    idem: Tracked<'t, (&'static str, &'static str), &'static [u8]>,
    idem_expiry: Tracked<'t, (u64, &'static str, &'static str), ()>,
    /// Whether any of the tables above was changed.
    changed: std::rc::Rc<std::cell::Cell<bool>>,
    meta: Table<'t, &'static str, u64>,
    next_seq: u64,
    receipts: u64,
    /// The journal LSN this state corresponds to.
    journal_lsn: u64,
    /// The stage's held units (none while recovering: a replay writes the tables).
    held: Option<&'t Held>,
    /// What this transaction changes in them.
    held_changes: HeldChanges,
    /// Whether admissions may be held: only in a commit made durable by its journal
    /// frame (a durable commit writes everything into the tables).
    hold_admissions: bool,
}

impl<'t> Tx<'t> {
    fn open(txn: &'t WriteTransaction, held: Option<&'t Held>) -> Result<Self, Fail> {
        let meta = txn.open_table(META)?;
        let counters = match held.and_then(|h| h.lock().counters()) {
            Some(newer) => newer,
            None => Counters {
                next_seq: get_counter(&meta, NEXT_SEQ)?,
                receipts: get_counter(&meta, RECEIPTS)?,
                journal_lsn: get_counter(&meta, JOURNAL_LSN)?,
            },
        };
        let Counters {
            next_seq,
            receipts,
            journal_lsn,
        } = counters;
        let changed = std::rc::Rc::new(std::cell::Cell::new(false));
        Ok(Self {
            records: Tracked::new(txn.open_table(RECORDS)?, &changed),
            ready: Tracked::new(txn.open_table(READY)?, &changed),
            unit_seq: Tracked::new(txn.open_table(UNIT_SEQ)?, &changed),
            groups: Tracked::new(txn.open_table(GROUPS)?, &changed),
            deadlines: Tracked::new(txn.open_table(DEADLINES)?, &changed),
            completed: Tracked::new(txn.open_table(COMPLETED)?, &changed),
            completed_deadlines: Tracked::new(txn.open_table(COMPLETED_DEADLINES)?, &changed),
            idem: Tracked::new(txn.open_table(IDEM)?, &changed),
            idem_expiry: Tracked::new(txn.open_table(IDEM_EXPIRY)?, &changed),
            changed,
            meta,
            next_seq,
            receipts,
            journal_lsn,
            held,
            held_changes: HeldChanges::default(),
            hold_admissions: false,
        })
    }

    /// Records stored, in the tables and held.
    fn record_count(&self) -> Result<u64, Fail> {
        let held = self.held.map_or(0, |h| h.lock().len() as i64) + self.held_changes.growth();
        Ok(self.records.len()? + held.max(0) as u64)
    }

    /// The seq of `id`'s unit among the held units as this transaction leaves them.
    fn held_seq(&self, id: UnitId) -> Option<u64> {
        let seq = self.held?.lock().seq_of(id)?;
        (!self.held_changes.removes(seq)).then_some(seq)
    }

    /// Complete `id`'s unit if it is held. Returns whether it was.
    fn complete_held(&mut self, id: UnitId) -> bool {
        let receipts = match self.held_changes.take_added(id) {
            Some((_, unit)) => unit.receipts,
            None => {
                let Some(seq) = self.held_seq(id) else {
                    return false;
                };
                let receipts = self.held.and_then(|h| Some(h.lock().get(seq)?.receipts));
                self.held_changes.remove(seq);
                receipts.unwrap_or(0)
            }
        };
        self.receipts = self.receipts.saturating_sub(receipts);
        true
    }

    /// Move `id`'s held unit, if any, into the tables: an admission of a record with the
    /// same id then stores over it exactly as it would over a stored one.
    fn unhold(&mut self, id: MessageId) -> Result<(), Fail> {
        if let Some((seq, unit)) = self.held_changes.take_added(id) {
            return self.store_held(seq, &unit);
        }
        if let (Some(seq), Some(held)) = (self.held_seq(id), self.held) {
            self.held_changes.remove(seq);
            let unit = held.lock().get(seq).cloned();
            if let Some(unit) = unit {
                self.store_held(seq, &unit)?;
            }
        }
        Ok(())
    }

    /// Write a held unit into the tables, at its seq.
    fn store_held(&mut self, seq: u64, unit: &HeldUnit) -> Result<(), Fail> {
        let id = unit.record.id;
        let entry = UnitEntry {
            id,
            disposition: Disposition::Deliver,
            members: vec![id],
            receipts: unit.receipts,
        };
        let bytes = encode(RecordKind::PendingUnit, "ready", &entry)?;
        self.records.insert(&id.to_bytes(), unit.bytes.as_slice())?;
        self.ready.insert(seq, bytes.as_slice())?;
        if let Some(old) = self.unit_seq.insert(&id.to_bytes(), seq)?.map(|g| g.value()) {
            self.ready.remove(old)?;
        }
        Ok(())
    }

    /// For a durable commit: write every unit held when it commits (`units`, held before
    /// it, with this transaction's changes) into the tables.
    fn store_all_held(&mut self, units: &[(u64, Arc<HeldUnit>)]) -> Result<(), Fail> {
        let changes = std::mem::take(&mut self.held_changes);
        for (seq, unit) in units.iter().filter(|(seq, _)| !changes.removes(*seq)) {
            self.store_held(*seq, unit)?;
        }
        for (seq, unit) in changes.added() {
            self.store_held(*seq, unit)?;
        }
        Ok(())
    }

    fn counters(&self, journal_lsn: u64) -> Counters {
        Counters {
            next_seq: self.next_seq,
            receipts: self.receipts,
            journal_lsn,
        }
    }

    fn save_counters(&mut self) -> Result<(), Fail> {
        self.meta.insert(NEXT_SEQ, self.next_seq)?;
        self.meta.insert(RECEIPTS, self.receipts)?;
        Ok(())
    }

    fn make_ready(
        &mut self,
        id: UnitId,
        disposition: Disposition,
        members: Vec<MessageId>,
        receipts: u64,
        lane: u8,
    ) -> Result<u64, Fail> {
        self.next_seq += 1;
        let seq = ReadySeq::in_lane(lane, self.next_seq).0;
        let entry = UnitEntry {
            id,
            disposition,
            members,
            receipts,
        };
        let bytes = encode(RecordKind::PendingUnit, "ready", &entry)?;
        self.ready.insert(seq, bytes.as_slice())?;
        let old = self.unit_seq.insert(&id.to_bytes(), seq)?.map(|g| g.value());
        if let Some(old) = old {
            // Only with a reused message id: keep one ready entry per unit.
            self.ready.remove(old)?;
        }
        Ok(seq)
    }

    /// The open group of a group key (its [`group_prefix`]). Normally at most one is
    /// open; should the table hold several (groups of one reference with different
    /// totals), the first in key order is the open one, and superseding it closes all.
    fn open_group(&self, prefix: &[u8]) -> Result<Option<StoredGroup>, Fail> {
        first_group("groups", &*self.groups, prefix)
    }

    /// What the store knows of a group key at `now`: its open group, else its completed
    /// group if that one's deadline has not passed. Digests missing from a stored group
    /// are computed from its records.
    fn key_state(&self, prefix: &[u8], now: Timestamp) -> Result<Option<KnownGroup>, Fail> {
        let (open, mut group) = match self.open_group(prefix)? {
            Some(g) => (true, g),
            None => match first_group("completed_groups", &*self.completed, prefix)? {
                Some(g) if g.state.deadline > now => (false, g),
                _ => return Ok(None),
            },
        };
        for part in &mut group.state.parts {
            if part.digest.is_none()
                && let Some(first) = part.ids.first()
            {
                part.digest = self.record(*first)?.map(|r| r.submission_digest());
            }
        }
        Ok(Some(KnownGroup { open, group }))
    }

    /// Close every open group of a group key as incomplete (see [`Tx::close_incomplete`]).
    fn close_open_groups(&mut self, prefix: &[u8]) -> Result<(), Fail> {
        while let Some(g) = self.open_group(prefix)? {
            self.groups.remove(g.key.as_slice())?;
            self.close_incomplete(&g.key, g.state)?;
        }
        Ok(())
    }

    /// Turn a group removed from `groups` into a ready unit that expires: each of its
    /// parts that asked for a receipt gets a failure receipt.
    fn close_incomplete(&mut self, key: &[u8], group: GroupState) -> Result<(), Fail> {
        self.deadlines.remove((group.deadline.0, key))?;
        let members = group.members();
        if let Some(first) = members.first().copied() {
            self.make_ready(first, Disposition::Expired, members, group.receipts, 0)?;
        }
        Ok(())
    }

    /// Forget the completed groups of a group key.
    fn forget_completed(&mut self, prefix: &[u8]) -> Result<(), Fail> {
        while let Some(g) = first_group("completed_groups", &*self.completed, prefix)? {
            self.completed.remove(g.key.as_slice())?;
            self.completed_deadlines
                .remove((g.state.deadline.0, g.key.as_slice()))?;
        }
        Ok(())
    }

    /// Forget completed groups whose deadline has passed (at most [`FORGET_PER_ADMIT`];
    /// [`Tx::key_state`] ignores any left). Returns whether anything changed.
    fn forget_completed_groups(&mut self, now: Timestamp) -> Result<bool, Fail> {
        let mut changed = false;
        for _ in 0..FORGET_PER_ADMIT {
            let (at, key) = match self.completed_deadlines.first()? {
                Some((k, _)) => {
                    let (at, key) = k.value();
                    if at > now.0 {
                        break;
                    }
                    (at, key.to_vec())
                }
                None => break,
            };
            self.completed_deadlines.remove((at, key.as_slice()))?;
            let current = match self.completed.get(key.as_slice())? {
                Some(v) => Some(decode_group("completed_groups", v.value())?.deadline),
                None => None,
            };
            if current.is_some_and(|d| d.0 == at) {
                self.completed.remove(key.as_slice())?;
            }
            changed = true;
        }
        Ok(changed)
    }

    /// A stored record, if present.
    fn record(&self, id: MessageId) -> Result<Option<PendingRecord>, Fail> {
        match self.records.get(&id.to_bytes())? {
            Some(v) => Ok(Some(decode_record(v.value())?)),
            None => Ok(None),
        }
    }

    /// Forget idempotency keys whose retention ended. Returns whether anything changed.
    fn forget_idempotency(&mut self, now: Timestamp) -> Result<bool, Fail> {
        let mut changed = false;
        for _ in 0..FORGET_PER_ADMIT {
            let first = match self.idem_expiry.first()? {
                Some((k, _)) => {
                    let (at, account, key) = k.value();
                    if at > now.0 {
                        break;
                    }
                    (at, account.to_string(), key.to_string())
                }
                None => break,
            };
            let (at, account, key) = first;
            self.idem_expiry.remove((at, account.as_str(), key.as_str()))?;
            let current = match self.idem.get((account.as_str(), key.as_str()))? {
                Some(v) => Some(
                    envelope::decode::<IdempotencyEntry>(RecordKind::IdempotencyKey, v.value())
                        .map_err(|e| Fail::record("idempotency", &account, e))?,
                ),
                None => None,
            };
            if current.is_some_and(|c| c.expires_at.0 == at) {
                self.idem.remove((account.as_str(), key.as_str()))?;
            }
            changed = true;
        }
        Ok(changed)
    }

    /// The retained first admission of this idempotency key, if any, and its
    /// submission digest (absent in entries written before it was kept).
    fn idempotent(&self, account: &str, key: &str, now: Timestamp) -> Result<Option<(MessageId, Option<u64>)>, Fail> {
        let Some(v) = self.idem.get((account, key))? else {
            return Ok(None);
        };
        let entry: IdempotencyEntry = envelope::decode(RecordKind::IdempotencyKey, v.value())
            .map_err(|e| Fail::record("idempotency", account, e))?;
        Ok((entry.expires_at > now).then_some((entry.id, entry.digest)))
    }

    /// Store `record` (whose envelope is `bytes`), a part where the rules of
    /// [`crate::reassembly`] put it at `now`; a single-record unit is held instead when
    /// the transaction may hold it and there is room.
    fn admit_one(
        &mut self,
        record: PendingRecord,
        bytes: Vec<u8>,
        now: Timestamp,
        idem_expiry: Timestamp,
    ) -> Result<(), Fail> {
        let id = record.id;
        self.unhold(id)?;
        let wants = u64::from(record.wants_receipt());
        self.receipts += wants;
        if let Some(key) = &record.idempotency_key {
            self.idem_expiry
                .insert((idem_expiry.0, record.account.as_str(), key.as_str()), ())?;
            let entry = IdempotencyEntry {
                id,
                expires_at: idem_expiry,
                digest: Some(record.submission_digest()),
            };
            let bytes = envelope::encode(RecordKind::IdempotencyKey, &entry)
                .map_err(|e| Fail::record("idempotency", &record.account, e))?;
            self.idem
                .insert((record.account.as_str(), key.as_str()), bytes.as_slice())?;
        }
        let lane = record.route_priority;
        match (record.group_key(), record.part) {
            (Some(gk), Some(part)) => {
                let prefix = group_prefix(&gk);
                let digest = record.submission_digest();
                let known = self.key_state(&prefix, now)?;
                let placement = reassembly::place(&record, digest, known.as_ref().map(|k| k.state(part.seq)));
                // A retransmission is never admitted by a live commit; one met here was
                // acknowledged with an id of its own, so it is kept beside the first
                // (in an open group), or starts a group (after a completed one).
                let open = match (placement, known) {
                    (Placement::Supersede, _) => {
                        self.close_open_groups(&prefix)?;
                        None
                    }
                    (_, Some(KnownGroup { open: true, group })) => Some(group.state),
                    _ => None,
                };
                let mut group = match open {
                    Some(group) => group,
                    None => {
                        // A new message with this reference: the completed one is no
                        // longer expected.
                        self.forget_completed(&prefix)?;
                        GroupState {
                            deadline: part.expires_at,
                            ..GroupState::default()
                        }
                    }
                };
                let gkb = group_key_bytes(&prefix, part.total);
                group.add(part.seq, id, digest);
                group.receipts += wants;
                let complete = group.parts.len() == usize::from(part.total);
                let old_deadline = group.deadline;
                group.deadline = group.deadline.min(part.expires_at);
                self.records.insert(&id.to_bytes(), bytes.as_slice())?;
                self.deadlines.remove((old_deadline.0, gkb.as_slice()))?;
                let gbytes = encode(RecordKind::PendingGroup, "groups", &group)?;
                if complete {
                    self.groups.remove(gkb.as_slice())?;
                    let members = group.members();
                    if let Some(first) = members.first().copied() {
                        // A completed group's lane is that of the part completing it.
                        self.make_ready(first, Disposition::Deliver, members, group.receipts, lane)?;
                    }
                    self.completed.insert(gkb.as_slice(), gbytes.as_slice())?;
                    self.completed_deadlines
                        .insert((group.deadline.0, gkb.as_slice()), ())?;
                } else {
                    self.groups.insert(gkb.as_slice(), gbytes.as_slice())?;
                    self.deadlines.insert((group.deadline.0, gkb.as_slice()), ())?;
                }
            }
            _ => {
                let room = self
                    .held
                    .is_some_and(|h| (h.lock().len() as i64 + self.held_changes.growth()) < HELD_UNITS as i64);
                if self.hold_admissions && room && self.records.get(&id.to_bytes())?.is_none() {
                    self.next_seq += 1;
                    let seq = ReadySeq::in_lane(lane, self.next_seq).0;
                    let unit = HeldUnit {
                        record,
                        bytes,
                        receipts: wants,
                    };
                    self.held_changes.add(seq, unit);
                } else {
                    self.records.insert(&id.to_bytes(), bytes.as_slice())?;
                    self.make_ready(id, Disposition::Deliver, vec![id], wants, lane)?;
                }
            }
        }
        Ok(())
    }
}

/// Remove completed units and their records inside a write transaction. Returns
/// whether anything changed.
fn complete_in(t: &mut Tx<'_>, ids: &[UnitId]) -> Result<bool, Fail> {
    let mut changed = false;
    for id in ids {
        if t.complete_held(*id) {
            changed = true;
            continue;
        }
        let Some(seq) = t.unit_seq.remove(&id.to_bytes())?.map(|g| g.value()) else {
            continue;
        };
        changed = true;
        let entry = match t.ready.remove(seq)? {
            Some(v) => Some(decode_unit(v.value())?),
            None => None,
        };
        if let Some(entry) = entry {
            for m in entry.members {
                t.records.remove(&m.to_bytes())?;
            }
            t.receipts = t.receipts.saturating_sub(entry.receipts);
        }
    }
    Ok(changed)
}

impl Inner {
    /// One write transaction of the pending stage. `body` changes the tables (or
    /// decides changes, see [`Change::Decided`]) and says how the change may be made
    /// durable; this records the journal LSN the new state corresponds to and makes it
    /// durable — by appending the body's frame (one `fdatasync`) while the journal takes
    /// appends, else by committing with `Durability::Immediate`, which is a checkpoint.
    /// Durable before it returns. For a decided change `durable` is called with the
    /// outcome as soon as the frame is synced, before the decided changes are applied;
    /// `stats` and `units` wait from then until the commit is done.
    fn write<R: Clone>(
        &self,
        body: impl FnOnce(&mut Tx<'_>) -> Result<(R, Change), Fail>,
        durable: &mut dyn FnMut(&R),
    ) -> Result<R, BackendFailure> {
        // Set once the frame is synced: from then on the journal, not redb's memory, is
        // the truth, and this is the answer whatever redb's commit does.
        let mut journaled = None;
        let mut checkpoint = None;
        // The held units, locked from before this transaction commits until its changes
        // to them are applied (see `held`: readers see both at one point in time), and
        // those changes; or, for a durable commit, whether it stores the held units.
        let mut held: Option<MutexGuard<'_, HeldUnits>> = None;
        let mut held_changes: Option<HeldChanges> = None;
        let mut stores_held = false;
        // The counters to keep in memory once this write is done: `Some(None)` when it
        // wrote them to `meta`, `Some(Some(_))` when it left `meta` behind.
        let mut counters_after: Option<Option<Counters>> = None;
        let _writer = self.writer.lock();
        let readers_wait = ReadersWait(self);
        let result = self.file.write_txn(|txn| {
            let mut t = Tx::open(txn, Some(&self.held))?;
            self.journal
                .check_applied(Stage::Pending, t.journal_lsn)
                .map_err(Fail::Located)?;
            let (out, change) = body(&mut t)?;
            let (frame, decided) = match change {
                Change::None => return Ok((out, false)),
                Change::Durable => (None, None),
                Change::Frame(frame) => (Some(frame), None),
                Change::Decided(frame, decided) => (Some(frame), Some(decided)),
            };
            let appended = match &frame {
                Some(frame) => {
                    let payload = envelope::encode(RecordKind::PendingJournalFrame, frame)
                        .map_err(|e| Fail::Located(e.at(self.journal.location().to_string())))?;
                    self.journal
                        .try_append(Stage::Pending, &payload)
                        .map_err(Fail::Located)?
                }
                None => None,
            };
            let lsn = match (appended, frame) {
                (Some(lsn), Some(frame)) => {
                    self.journal.sync(lsn).map_err(Fail::Located)?;
                    self.journal.applying(Stage::Pending, lsn);
                    journaled = Some(out.clone());
                    if let Some(decided) = decided {
                        readers_wait.start();
                        durable(&out);
                        // Answered, not applied: a panic here (`pending-apply=panic`) is
                        // a storage engine failing after the acknowledgement.
                        failpoint::hit("pending-apply");
                        #[cfg(test)]
                        if let Some(f) = self.before_apply.lock().take() {
                            f();
                        }
                        t.hold_admissions = true;
                        decided.apply(&mut t, frame)?;
                    }
                    lsn
                }
                (_, frame) => {
                    if let (Some(frame), Some(decided)) = (frame, decided) {
                        decided.apply(&mut t, frame)?;
                    }
                    let lsn = self.journal.checkpoint_lsn();
                    checkpoint = Some(lsn);
                    lsn
                }
            };
            if checkpoint.is_some() {
                let units: Vec<_> = {
                    let mut held = self.held.lock();
                    held.set_storing(true);
                    held.iter().map(|(seq, u)| (seq, u.clone())).collect()
                };
                stores_held = true;
                t.store_all_held(&units)?;
            } else {
                if !t.held_changes.is_empty() {
                    held = Some(self.held.lock());
                    held_changes = Some(std::mem::take(&mut t.held_changes));
                }
                if !t.changed.get() {
                    // Only held units changed, and the frame made that durable: redb has
                    // nothing to commit but counters, which stay in memory until the next
                    // commit that writes (every durable one does, and a close).
                    counters_after = Some(Some(t.counters(lsn)));
                    return Ok((out, false));
                }
                counters_after = Some(None);
            }
            t.meta.insert(JOURNAL_LSN, lsn)?;
            t.save_counters()?;
            drop(t);
            txn.set_durability(if checkpoint.is_some() {
                Durability::Immediate
            } else {
                Durability::None
            })?;
            Ok((out, true))
        });
        if result.is_ok() {
            if let (Some(units), Some(changes)) = (held.as_mut(), held_changes) {
                changes.apply(units);
            }
            if let Some(counters) = counters_after {
                match held.as_mut() {
                    Some(units) => units.set_counters(counters),
                    None => self.held.lock().set_counters(counters),
                }
            }
        }
        drop(held);
        if result.is_ok() && stores_held {
            #[cfg(test)]
            if let Some(f) = self.after_storing_held.lock().take() {
                f();
            }
            // In the tables now; no other commit ran meanwhile (`writer`).
            self.held.lock().clear();
        } else if stores_held {
            self.held.lock().set_storing(false);
        }
        let outcome = match (result, journaled) {
            (Ok(out), _) => {
                if let Some(lsn) = checkpoint {
                    self.journal.checkpointed(Stage::Pending, lsn);
                }
                Ok(out)
            }
            (Err(e), Some(out)) => {
                // Durable in the journal, not applied to redb: the write happened. No
                // write proceeds on redb's state without it (`check_applied`) and the
                // reopen this asks for applies it before anything reads the file again.
                tracing::warn!(error = %e, "pending commit journaled but not applied; reopening the store file");
                self.file.invalidate(e.kind);
                Ok(out)
            }
            (Err(e), None) => Err(e),
        };
        // Only now, with the file invalidated if the apply failed: a waiting reader
        // must reopen it (and so replay the frame), not read what redb holds.
        drop(readers_wait);
        outcome
    }

    /// Admissions and source completions in one write transaction: one journal frame
    /// (or one checkpoint) for both. The admissions are decided first (idempotency,
    /// capacity), from the tables as they are and what this batch admitted before; the
    /// decided records and, when capacity cannot depend on them, the completions are
    /// applied after the frame is synced and `durable` has been called (see
    /// [`Change::Decided`]).
    fn commit(
        &self,
        batch: Vec<PendingRecord>,
        complete: &[UnitId],
        durable: &mut dyn FnMut(&Vec<AdmitOutcome>),
    ) -> Result<Vec<AdmitOutcome>, BackendFailure> {
        if batch.is_empty() && complete.is_empty() {
            return Ok(Vec::new());
        }
        let now = Timestamp::now();
        let idem_expiry = now.saturating_add(self.limits.idempotency_retention);
        let max = self.limits.max_records;
        self.write(
            |t| {
                // Completions only lower the record count: if the batch fits without
                // them, no outcome depends on them and they wait until after the answer.
                let stored = t.record_count()?;
                let completions_applied = stored.saturating_add(batch.len() as u64) > max;
                let mut changed = false;
                let mut count = stored;
                if completions_applied {
                    changed = complete_in(t, complete)?;
                    count = t.record_count()?;
                }
                let mut outcomes = Vec::with_capacity(batch.len());
                let mut admitted = Vec::with_capacity(batch.len());
                let mut records = Vec::with_capacity(batch.len());
                // Keys this batch admitted, per account, as the tables will hold them
                // once applied (looked up by reference: no copy per lookup).
                let mut keys: HashMap<String, HashMap<String, (MessageId, Option<u64>)>> = HashMap::new();
                let mut groups = BatchGroups::default();
                for record in batch {
                    if let Some(key) = &record.idempotency_key {
                        let batched = keys.get(record.account.as_str()).and_then(|k| k.get(key.as_str()));
                        let existing = match batched {
                            Some(first) => Some(*first),
                            None => t.idempotent(&record.account, key, now)?,
                        };
                        if let Some((existing, digest)) = existing {
                            outcomes.push(match digest {
                                Some(d) if d != record.submission_digest() => AdmitOutcome::KeyReused { existing },
                                _ => AdmitOutcome::Duplicate { existing },
                            });
                            continue;
                        }
                    }
                    // Only parts are compared with other admissions.
                    let digest = if record.part.is_some() {
                        record.submission_digest()
                    } else {
                        0
                    };
                    let placement = groups.place(t, &record, digest, now)?;
                    if let Placement::Retransmission { existing } = placement {
                        outcomes.push(AdmitOutcome::Duplicate { existing });
                        continue;
                    }
                    if count >= max {
                        outcomes.push(AdmitOutcome::Full);
                        continue;
                    }
                    groups.admitted(&record, digest, placement);
                    let bytes = encode(RecordKind::PendingRecord, "records", &record)?;
                    admitted.push(ByteBuf::from(bytes));
                    if let Some(key) = &record.idempotency_key {
                        keys.entry(record.account.clone())
                            .or_default()
                            .insert(key.clone(), (record.id, Some(record.submission_digest())));
                    }
                    records.push(record);
                    count += 1;
                    outcomes.push(if placement == Placement::Supersede {
                        AdmitOutcome::Superseding
                    } else {
                        AdmitOutcome::Admitted
                    });
                }
                let frame = JournalFrame {
                    now,
                    idem_expiry,
                    complete: complete.to_vec(),
                    admit: admitted,
                };
                if !records.is_empty() {
                    let decided = Decided {
                        records,
                        completions_applied,
                    };
                    return Ok((outcomes, Change::Decided(frame, decided)));
                }
                // Nothing admitted: apply the rest now, and write only if it changed
                // anything.
                if !completions_applied {
                    changed |= complete_in(t, complete)?;
                }
                changed |= t.forget_idempotency(now)?;
                changed |= t.forget_completed_groups(now)?;
                Ok((outcomes, if changed { Change::Frame(frame) } else { Change::None }))
            },
            durable,
        )
    }

    /// A durable commit that changes nothing but the recorded LSN, if the store has
    /// frames its file's durable state does not hold: afterwards redb holds no unsynced
    /// pages and the journal segments they are in can be reused. Done when the writer is
    /// idle, and by the journal's checkpointer (see [`super::engine::journal`]).
    fn checkpoint_uncovered(&self) -> Result<(), BackendFailure> {
        if !self.journal.uncovered(Stage::Pending) {
            return Ok(());
        }
        self.write(|_| Ok(((), Change::Durable)), &mut |_| {})
    }

    /// Wait while a commit's clients are answered and its records not yet readable.
    fn wait_for_answered(&self) {
        let mut waiting = self.answered_unapplied.lock();
        while *waiting {
            self.applied.wait(&mut waiting);
        }
    }

    /// Does not wait for an answered commit: its units are picked up by the Selector's
    /// next read, which the commit's end wakes it for (the Selector reads this on every
    /// wake, and waiting here would stall it behind the writer's commits).
    fn ready_after(&self, after: ReadyCursor, limit: usize) -> Result<Vec<ReadyUnit>, BackendFailure> {
        self.file.read_locked(
            || self.held.lock(),
            |txn, held| {
                let ready = txn.open_table(READY)?;
                let records = txn.open_table(RECORDS)?;
                let mut chosen: Vec<(u64, Option<UnitEntry>)> = Vec::with_capacity(limit.min(1024));
                for lane in (0..ReadySeq::LANES as u8).rev() {
                    if chosen.len() >= limit {
                        break;
                    }
                    let from = after.lane(lane).0.max(ReadySeq::in_lane(lane, 0).0).saturating_add(1);
                    let range = from..ReadySeq::lane_end(lane).0;
                    let room = limit - chosen.len();
                    // The lane's first `room` units, from the table and the held ones by seq.
                    let mut stored = ready.range(range.clone())?.take(room).peekable();
                    let mut kept = held.seqs(range).peekable();
                    while chosen.len() < limit {
                        let from_table = match (stored.peek(), kept.peek().copied()) {
                            (None, None) => break,
                            (Some(Err(_)) | Some(Ok(_)), None) => true,
                            (None, Some(_)) => false,
                            (Some(Err(_)), Some(_)) => true,
                            (Some(Ok((k, _))), Some(held_seq)) => {
                                let seq = k.value();
                                if seq == held_seq {
                                    // Stored by a checkpoint that has not dropped it from
                                    // memory yet: the same unit.
                                    kept.next();
                                }
                                seq <= held_seq
                            }
                        };
                        if from_table {
                            if let Some(item) = stored.next() {
                                let (k, v) = item?;
                                let seq = k.value();
                                chosen.push((seq, Some(decode_unit(v.value())?)));
                            }
                        } else if let Some(seq) = kept.next() {
                            chosen.push((seq, None));
                        }
                    }
                }
                // Held units are taken (shared) under the lock, copied and read after it.
                let kept: Vec<Option<Arc<HeldUnit>>> = chosen
                    .iter()
                    .map(|(seq, entry)| match entry {
                        Some(_) => None,
                        None => held.get(*seq).cloned(),
                    })
                    .collect();
                drop(held);
                let mut out = Vec::with_capacity(chosen.len());
                for ((seq, entry), kept) in chosen.into_iter().zip(kept) {
                    match (entry, kept) {
                        (Some(entry), _) => out.push(build_unit(&records, seq, entry)?),
                        (None, Some(unit)) => out.push(ReadyUnit {
                            seq: ReadySeq(seq),
                            unit: unit.unit(),
                        }),
                        (None, None) => {}
                    }
                }
                Ok(out)
            },
        )
    }

    fn units(&self, ids: &[UnitId]) -> Result<Vec<ReadyUnit>, BackendFailure> {
        self.wait_for_answered();
        self.file.read_locked(
            || self.held.lock(),
            |txn, held| {
                let ready = txn.open_table(READY)?;
                let unit_seq = txn.open_table(UNIT_SEQ)?;
                let records = txn.open_table(RECORDS)?;
                let mut out = Vec::with_capacity(ids.len());
                // A unit without its index entries is completed — unless its records are
                // still here: then the index was damaged, and restoring routed work must
                // fail closed rather than take the unit for completed.
                let still_pending = |id: &UnitId| -> Result<bool, Fail> { Ok(records.get(&id.to_bytes())?.is_some()) };
                for id in ids {
                    if let Some(unit) = held.seq_of(*id).and_then(|seq| held.get(seq).map(|u| (seq, u))) {
                        out.push(ReadyUnit {
                            seq: ReadySeq(unit.0),
                            unit: unit.1.unit(),
                        });
                        continue;
                    }
                    let seq = unit_seq.get(&id.to_bytes())?.map(|g| g.value());
                    let found = match seq {
                        Some(seq) => ready.get(seq)?.map(|v| (seq, v)),
                        None => None,
                    };
                    let Some((seq, v)) = found else {
                        if still_pending(id)? {
                            return Err(Fail::Invalid {
                                table: "unit_seq",
                                detail: "a pending unit is missing from the unit index".into(),
                            });
                        }
                        continue;
                    };
                    let entry = decode_unit(v.value())?;
                    out.push(build_unit(&records, seq, entry)?);
                }
                Ok(out)
            },
        )
    }

    fn expire_groups(&self, now: Timestamp, limit: usize) -> Result<usize, BackendFailure> {
        // Most calls find nothing due: answer from a snapshot without a write (and fsync).
        let due = self.file.read(|txn| {
            let deadlines = txn.open_table(DEADLINES)?;
            Ok(deadlines.first()?.is_some_and(|(k, _)| k.value().0 <= now.0))
        })?;
        if !due || limit == 0 {
            return Ok(0);
        }
        // Durable (a checkpoint): expiry is not journaled.
        self.write(
            |t| {
                let mut expired = 0;
                let mut changed = false;
                while expired < limit {
                    let (deadline, gkb) = match t.deadlines.first()? {
                        Some((k, _)) => {
                            let (deadline, gkb) = k.value();
                            if deadline > now.0 {
                                break;
                            }
                            (deadline, gkb.to_vec())
                        }
                        None => break,
                    };
                    t.deadlines.remove((deadline, gkb.as_slice()))?;
                    changed = true;
                    let group = match t.groups.remove(gkb.as_slice())? {
                        Some(v) => Some(decode_group("groups", v.value())?),
                        None => None,
                    };
                    if let Some(group) = group {
                        t.close_incomplete(&gkb, group)?;
                        expired += 1;
                    }
                }
                Ok((expired, if changed { Change::Durable } else { Change::None }))
            },
            &mut |_| {},
        )
    }

    fn stats(&self) -> Result<PendingStats, BackendFailure> {
        self.wait_for_answered();
        self.read_stats()
    }

    fn read_stats(&self) -> Result<PendingStats, BackendFailure> {
        self.file.read_locked(
            || self.held.lock(),
            |txn, held| {
                let records = txn.open_table(RECORDS)?;
                let meta = txn.open_table(META)?;
                // Ids are UUIDv7: the first key is the record accepted first.
                let stored = records.first()?.map(|(k, v)| (*k.value(), v));
                let oldest = match (stored, held.oldest()) {
                    (Some((k, _)), Some(r)) if r.id.to_bytes() < k => Some(r.accepted_at),
                    (Some((_, v)), _) => Some(decode_record(v.value())?.accepted_at),
                    (None, r) => r.map(|r| r.accepted_at),
                };
                let unit_seq = txn.open_table(UNIT_SEQ)?;
                // A checkpoint between its commit and dropping the units it stored: those
                // this snapshot has in the tables are counted there.
                let held_units = if held.storing() {
                    let mut n = 0;
                    for (_, unit) in held.iter() {
                        if unit_seq.get(&unit.record.id.to_bytes())?.is_none() {
                            n += 1;
                        }
                    }
                    n
                } else {
                    held.len() as u64
                };
                Ok(PendingStats {
                    records: records.len()? + held_units,
                    ready_units: unit_seq.len()? + held_units,
                    incomplete_groups: txn.open_table(GROUPS)?.len()?,
                    receipt_requests: match held.counters() {
                        Some(c) => c.receipts,
                        None => get_counter(&meta, RECEIPTS)?,
                    },
                    oldest_accepted_at: oldest,
                })
            },
        )
    }
}

impl Checkpoint for Inner {
    fn checkpoint(&self) -> Result<(), BackendFailure> {
        on_this_thread(&self.file, || self.checkpoint_uncovered())
    }
}

#[async_trait]
impl PendingStore for FilePendingStore {
    fn capabilities(&self) -> PendingCapabilities {
        PendingCapabilities {
            stage: StageCapabilities::durable(Backend::File),
            blocking_writer: Some(Arc::new(self.clone())),
        }
    }

    async fn ready_after(&self, after: ReadyCursor, limit: usize) -> Result<Vec<ReadyUnit>, PendingError> {
        self.run(move |i| i.ready_after(after, limit)).await
    }

    async fn units(&self, ids: &[UnitId]) -> Result<Vec<ReadyUnit>, PendingError> {
        let ids = ids.to_vec();
        self.run(move |i| i.units(&ids)).await
    }

    async fn expire_groups(&self, now: Timestamp, limit: usize) -> Result<usize, PendingError> {
        self.run(move |i| i.expire_groups(now, limit)).await
    }

    async fn commit(&self, admit: Vec<PendingRecord>, complete: &[UnitId]) -> Result<Vec<AdmitOutcome>, PendingError> {
        let complete = complete.to_vec();
        self.run(move |i| i.commit(admit, &complete, &mut |_| {})).await
    }

    async fn stats(&self) -> Result<PendingStats, PendingError> {
        self.run(|i| i.stats()).await
    }
}

impl BlockingPendingWriter for FilePendingStore {
    fn commit(
        &self,
        admit: Vec<PendingRecord>,
        complete: &[UnitId],
        durable: &mut dyn FnMut(&[AdmitOutcome]),
    ) -> Result<Vec<AdmitOutcome>, PendingError> {
        Ok(on_this_thread(&self.inner.file, || {
            self.inner.commit(admit, complete, &mut |outcomes| durable(outcomes))
        })?)
    }

    fn idle(&self) {
        if let Err(e) = on_this_thread(&self.inner.file, || self.inner.checkpoint_uncovered()) {
            // The next commit meets the same failure and refuses: nothing more to do here.
            tracing::warn!(error = %e, "pending journal checkpoint failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::tests::same_bytes_as_ciborium;
    use crate::error::FailureKind;

    #[test]
    fn a_journal_frame_is_the_bytes_ciborium_writes() {
        let frame = JournalFrame {
            now: Timestamp(1_700_000_000_123),
            idem_expiry: Timestamp(u64::MAX),
            complete: vec![UnitId::generate(), UnitId::generate()],
            admit: vec![ByteBuf::from((0..=255u8).collect::<Vec<_>>()), ByteBuf::from(vec![])],
        };
        same_bytes_as_ciborium(RecordKind::PendingJournalFrame, &frame);
    }

    #[test]
    fn a_record_of_a_newer_major_version_stops_the_open() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Arc::new(DataDir::open(tmp.path()).unwrap());
        drop(FilePendingStore::open(&dir, PendingLimits::default()).unwrap());
        // What a future Sendium with record major version 99 would have written.
        let value = ciborium::Value::Map(vec![
            (ciborium::Value::Text("v".into()), ciborium::Value::Integer(99.into())),
            (ciborium::Value::Text("vm".into()), ciborium::Value::Integer(0.into())),
            (ciborium::Value::Text("whatever".into()), ciborium::Value::Bool(true)),
        ]);
        let mut bytes = Vec::new();
        ciborium::into_writer(&value, &mut bytes).unwrap();
        let bytes = crate::envelope::seal(bytes);
        {
            let db = redb::Database::create(dir.pending_path()).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(RECORDS)
                .unwrap()
                .insert(&[0xff; 16], bytes.as_slice())
                .unwrap();
            txn.commit().unwrap();
        }
        let err = FilePendingStore::open(&dir, PendingLimits::default()).err().unwrap();
        assert_eq!(err.kind, FailureKind::UnsupportedVersion, "{err}");
        assert!(err.location.ends_with("pending.redb table records"), "{err}");
        assert!(!err.to_string().contains("ffffffff-ffff"), "{err}");
        assert!(err.to_string().contains("major version 99"), "{err}");
    }

    #[test]
    fn a_newer_table_layout_stops_the_open() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Arc::new(DataDir::open(tmp.path()).unwrap());
        drop(FilePendingStore::open(&dir, PendingLimits::default()).unwrap());
        {
            let db = redb::Database::create(dir.pending_path()).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(META)
                .unwrap()
                .insert(crate::file::engine::db::LAYOUT_KEY, 7)
                .unwrap();
            txn.commit().unwrap();
        }
        let err = FilePendingStore::open(&dir, PendingLimits::default()).err().unwrap();
        assert_eq!(err.kind, FailureKind::UnsupportedVersion, "{err}");
    }
}
