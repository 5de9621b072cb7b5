//! The file DLR store (`<dir>/dlr.redb`): provider correlations, pending downstream
//! deliveries (receipts and inbound messages) and the parts of multipart inbound
//! messages, surviving a restart, for the database-free single-process deployment.
//!
//! Its own redb file in the [`DataDir`], so the DLR store has its own namespace and
//! lifecycle, separate from the SMS stages; its writes are made durable by the same
//! journal as theirs.
//!
//! # Semantics
//!
//! Those of [`MemoryDlrStore`](crate::memory::MemoryDlrStore) (the conformance suite runs
//! against both), except where being durable and unbounded lets it do better:
//!
//! * A resolved branch keeps its track and correlations until its retention ends (the
//!   memory store forgets them at once to stay within its bound). A late duplicate
//!   receipt therefore finds its branch and is answered [`ReceiptMatch::Duplicate`] (never
//!   a second delivery, and never an orphan), and a repeated handoff of a resolved branch
//!   is recognised and ignored however long after resolution it comes.
//! * A resubmission's earlier provider ids stay correlated to the branch (the contract:
//!   "earlier ids keep matching"): a receipt for them is answered `Duplicate` — recognised
//!   as this message's, without deciding it — where the memory store orphans it.
//! * No reservations: the store is bounded by the disk, not by a count
//!   ([`DlrStore::reservations`] is `None`).
//!
//! # Tables
//!
//! Keys are big-endian, so byte order is the order each index needs; index values are
//! fixed-layout bytes; records are [envelopes](crate::envelope) (versioned CBOR + CRC).
//!
//! | table | key | value |
//! |---|---|---|
//! | `tracks` | unit id (16) + branch (2) | track envelope: parts with final outcomes, stale ids, targets, first failure, expiry, resolved |
//! | `track_expiry` | expiry ms (8) + track key | — |
//! | `correlations` | dest len (4) + dest + provider id | track key (18 bytes) |
//! | `orphans` | same as `correlations` | orphan envelope: outcome, expiry |
//! | `orphan_expiry` | expiry ms (8) + orphan key | — |
//! | `deliveries` | delivery id (u64) | fixed header (attempt, due, lease end, expiry, SMPP account) + delivery envelope (target, a receipt's outcome or an inbound message, created) |
//! | `due` | due ms (8) + delivery id (8) | — |
//! | `smpp_by_account` | (account, delivery id) | — (SMPP deliveries after a retry: the only ones a wake can change) |
//! | `inbound_groups` | group number (u64) | group envelope: key, deadline, closed, parts (seq, deadline, message) |
//! | `inbound_open` | group key (names length-prefixed, reference, total) | the key's open group number |
//! | `inbound_due` | due ms (8, 0 once complete or closed) + group number (8) | — |
//! | `meta` | name | `layout`, `awaiting`, `next_delivery`, `next_inbound_group`, `inbound_parts`, `journal_lsn` |
//!
//! An inbound delivery is a delivery like a receipt's (claims, retries, scope by SMPP
//! account, expiry), its record carrying the message instead of an outcome. A file of an
//! earlier build opens as it is: the inbound tables are created empty, its delivery
//! records, which have no message field, decode as receipts, and without a
//! `journal_lsn` it holds no journal frames.
//!
//! Nothing scans: a receipt is a point lookup in `correlations` (per candidate id, best
//! first), `claim_due` reads the first keys of `due` up to `now`, `wake_account` ranges
//! over one account's keys of `smpp_by_account`, `expire` reads the first keys of the three
//! expiry indexes, `due_inbound_groups` reads the first keys of `inbound_due`, and
//! `stats` is O(log n): table lengths are kept by redb in each tree's
//! header (O(1), updated by the same transactions, so they cannot drift), branches still
//! awaiting receipts and inbound parts held are counters in `meta` updated in the same
//! transactions, and the
//! oldest pending delivery is the first key of `deliveries` — delivery ids come from a
//! persisted counter, so id order is creation order.
//!
//! A claim rewrites only the 20-byte state and its `due` key, not the delivery record.
//! Most deliveries are never claimed that way: [`DlrStore::apply`] creates a resolved
//! branch's deliveries already claimed (attempt 1, leased) when the correlator asks it
//! to ([`DlrWrite::claim_created`](crate::DlrWrite::claim_created)), so the receipt's
//! own durable transaction is also its claim and no claim transaction follows.
//!
//! # Durability
//!
//! Every mutating call is one write transaction for its whole batch. A call that changed
//! nothing is aborted (nothing written): a repeated handoff, a batch of duplicate
//! receipts, a claim with nothing due.
//!
//! A transaction is made durable by a frame of the data directory's journal (see
//! [`super::engine::journal`]): the keys it set, with their values, and the keys it
//! removed, in order (see [`redo`] for why the frame records effects, not calls). The
//! frame shares one `fdatasync` with whatever else is being flushed; redb commits the
//! transaction with `Durability::None`, and the journal's checkpointer makes the file
//! durable on its own about once a second (a durable commit recording the journal LSN it
//! holds). After a crash the file is back at its last durable commit and the frames after
//! it are applied again before anyone reads the store. When the journal cannot take a
//! frame (a segment switch is waiting for this store), the transaction is committed
//! durably instead. A frame holds only the bytes the transaction changed, while a
//! durable commit writes every B-tree page it touched: the file's pages are written once
//! per checkpoint, not once per transaction.
//!
//! * `hand_off` and `record_receipts`: return once their frame is synced. The source
//!   SMS is completed only after `hand_off` returns, and the provider's
//!   `deliver_sm_resp` is sent only after `record_receipts` returns; from then on this
//!   store is the only copy. The same holds for inbound parts and messages: the step
//!   stores them durably before the provider's `deliver_sm` is acknowledged.
//! * `finish`: synced too. A lost "delivered" would send an acknowledged receipt again
//!   after a crash, and a lost retry/park would forget the backoff.
//! * `claim_due`: its frame is not waited for (it goes with the next flush, at the
//!   latest on the checkpointer's next round, 100 ms). A claim lost in a crash leaves the
//!   delivery exactly as it was before the claim — due, with the previous attempt number
//!   — so after the restart it is claimed again and sent again: at least once downstream,
//!   which a lapsed lease already implies. The lost attempt number cannot confuse the
//!   fencing: the only results quoting it belonged to the process that crashed. Frames
//!   are synced in order, so any later synced write (a handoff, a receipt, a `finish`)
//!   makes the claim durable too, and a `finish` always follows its claim, so no result
//!   is ever applied to a claim that is then rolled back.
//! * `wake_account`, `expire`, `release_claims`: synced.
//!
//! A transaction whose frame was appended but whose redb commit then failed leaves the
//! file behind the journal: the file is reopened (which applies the frame) before any
//! further write.
//!
//! # Quick repair
//!
//! On by default ([`FileDlrStore::default_options`]): its second fsync is paid only by
//! the durable commits, the checkpoints (about one a second), and it spares the reopen
//! after an unclean stop the walk of the whole file that rebuilds redb's allocator
//! state. The ignored `bench_dlr_reopen_after_sigkill` test measures that reopen, with
//! and without quick repair: for 1M correlations (a 272 MiB file, cold page cache) 41 ms
//! against 1.6 s, with the same rate of handoffs before the kill (about 230,000/s in
//! batches of 1,000).
//!
//! # Blocking
//!
//! redb is blocking: every call runs on tokio's blocking pool (see
//! [`crate::file::engine::db`]), once per batch.

mod records;
mod redo;
mod tx;

#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use redb::{Database, Durability, ReadableTable, ReadableTableMetadata};

use self::records::due_key;
use self::redo::Redo;
use self::tx::{
    AWAITING, CORRELATIONS, DELIVERIES, INBOUND_DUE, INBOUND_GROUPS, INBOUND_PARTS, ORPHANS, Tx, decode_delivery,
    decode_group,
};
use super::engine::db::{Fail, FileOptions, META, StoreFile, blocking, get_counter, on_this_thread};
use super::engine::dir::{DLR_FILE, DataDir};
use super::engine::journal::{Checkpoint, Journal, Stage};
use super::engine::journaled::{JOURNAL_LSN, Wait};
use crate::backend::Backend;
use crate::dlr::{
    ClaimScope, Delivery, DlrCapabilities, DlrRetention, DlrStats, DlrStore, DlrWrite, DlrWriteOutcome, ExpiryReport,
};
use crate::error::{BackendFailure, DlrError};
use crate::ids::Timestamp;
use crate::inbound::InboundGroup;

/// SMPP deliveries of one account woken per transaction: an account that was unbound
/// for a day may have a million parked receipts, and one transaction re-indexing all of
/// them would hold that many dirty pages in memory.
#[cfg(not(test))]
const WAKE_BATCH: usize = 10_000;
/// Small in tests, so they walk several batches.
#[cfg(test)]
const WAKE_BATCH: usize = 4;

/// The file-backed DLR store. Cheap to clone (one shared file).
#[derive(Clone)]
pub struct FileDlrStore {
    inner: Arc<Inner>,
}

struct Inner {
    file: StoreFile,
    retention: DlrRetention,
    journal: Arc<Journal>,
    /// The next write transaction panics inside redb's transaction.
    #[cfg(test)]
    panic_in_write: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for FileDlrStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileDlrStore")
            .field("file", &self.inner.file.location())
            .field("retention", &self.inner.retention)
            .finish()
    }
}

impl FileDlrStore {
    /// 64 MiB of page cache: receipts look tracks up at random over the retention
    /// window, and the hot end (recent handoffs, due deliveries) should stay cached.
    pub const CACHE: usize = 64 << 20;

    /// The options [`FileDlrStore::open`] uses: a bounded cache, no verification on
    /// open, quick repair (see the module docs for the measurement behind that).
    pub fn default_options() -> FileOptions {
        FileOptions {
            cache_size: Self::CACHE,
            verify_on_open: false,
            quick_repair: true,
        }
    }

    /// Open (or create) `<dir>/dlr.redb`. Blocking: call it at startup, before serving.
    ///
    /// `retention` applies to what is recorded from now on; stored deadlines are
    /// absolute and do not move when the configuration changes.
    pub fn open(dir: &Arc<DataDir>, retention: DlrRetention) -> Result<Self, BackendFailure> {
        Self::open_with(dir, retention, Self::default_options())
    }

    pub fn open_with(
        dir: &Arc<DataDir>,
        retention: DlrRetention,
        options: FileOptions,
    ) -> Result<Self, BackendFailure> {
        let journal = dir.journal()?;
        let replay = journal.clone();
        let file = StoreFile::open_with(
            dir,
            DLR_FILE,
            options,
            tx::init,
            // One disk: a fault of the journal's is one of this file's too.
            journal.faults().clone(),
            Some(Box::new(move |db| recover(db, &replay, options.quick_repair))),
            None,
        )?;
        let inner = Arc::new(Inner {
            file,
            retention,
            journal: journal.clone(),
            #[cfg(test)]
            panic_in_write: std::sync::atomic::AtomicBool::new(false),
        });
        journal.set_hook(Stage::Dlr, Arc::downgrade(&inner) as Weak<dyn Checkpoint>);
        Ok(Self { inner })
    }

    /// Release the delivery claims a previous process left (it was killed between
    /// claiming receipts and recording their results): they are due again at once
    /// instead of after their lease. Only right after open: the data directory is
    /// exclusively locked, so every claim in the file belongs to a process that is gone.
    /// One synced write; returns how many were released.
    pub async fn release_claims(&self, lease: Duration) -> Result<u64, DlrError> {
        self.run(move |i| i.write(Wait::Synced, |tx| tx.release_claims(Timestamp::now(), lease)))
            .await
    }

    /// The store file (for logs and `sendium inspect`).
    pub fn path(&self) -> &Path {
        self.inner.file.path()
    }

    #[cfg(test)]
    pub(crate) fn faults(&self) -> &super::engine::backend::FaultSwitch {
        &self.inner.file.faults
    }

    #[cfg(test)]
    pub(crate) fn file(&self) -> &StoreFile {
        &self.inner.file
    }

    /// Make the next write transaction panic, as redb may on a damaged file.
    #[cfg(test)]
    pub(crate) fn panic_in_next_write(&self) {
        self.inner
            .panic_in_write
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    #[cfg(test)]
    pub(crate) fn journal(&self) -> &Arc<Journal> {
        &self.inner.journal
    }

    async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<R, BackendFailure> + Send + 'static,
    ) -> Result<R, DlrError> {
        Ok(blocking(&self.inner, |i| &i.file, f).await?)
    }
}

impl Inner {
    /// Run `f` over the tables in one write transaction (aborted when nothing changed),
    /// made durable by its journal frame as `wait` says, or by a durable commit when the
    /// journal cannot take the frame (see the module docs).
    fn write<R>(&self, wait: Wait, f: impl FnOnce(&mut Tx<'_>) -> Result<R, Fail>) -> Result<R, BackendFailure> {
        let retention = self.retention;
        let redo = Redo::default();
        // Set once a frame is appended: from then on the journal may replay it, so no
        // write may proceed on a file that lacks it.
        let mut appended = None;
        let mut checkpoint = None;
        let result = self.file.write_txn(|txn| {
            let (out, changed) = {
                let mut tx = Tx::open(txn, retention, &redo)?;
                #[cfg(test)]
                if self.panic_in_write.swap(false, std::sync::atomic::Ordering::Relaxed) {
                    panic!("injected: the storage engine panics");
                }
                self.journal
                    .check_applied(Stage::Dlr, tx.journal_lsn)
                    .map_err(Fail::Located)?;
                let out = f(&mut tx)?;
                (out, tx.flush()?)
            };
            if !changed {
                return Ok((out, false));
            }
            let frame = redo
                .take_frame()
                .map_err(|e| Fail::Located(e.at(self.journal.location().to_string())))?;
            let lsn = match self.journal.try_append(Stage::Dlr, &frame).map_err(Fail::Located)? {
                Some(lsn) => {
                    if wait == Wait::Synced {
                        self.journal.sync(lsn).map_err(Fail::Located)?;
                    }
                    self.journal.applying(Stage::Dlr, lsn);
                    appended = Some(lsn);
                    txn.set_durability(Durability::None)?;
                    lsn
                }
                None => {
                    // The journal cannot take the frame: this commit is a checkpoint.
                    let lsn = self.journal.checkpoint_lsn();
                    checkpoint = Some(lsn);
                    txn.set_durability(Durability::Immediate)?;
                    lsn
                }
            };
            txn.open_table(META)?.insert(JOURNAL_LSN, lsn)?;
            Ok((out, true))
        });
        match result {
            Ok(out) => {
                if let Some(lsn) = checkpoint {
                    self.journal.checkpointed(Stage::Dlr, lsn);
                }
                Ok(out)
            }
            Err(e) => {
                if appended.is_some() {
                    // The frame may be replayed but redb's commit failed: nothing writes
                    // on this file until its reopen has applied the journal.
                    tracing::warn!(error = %e, "dlr write journaled but not applied; reopening the store file");
                    self.file.invalidate(e.kind);
                }
                Err(e)
            }
        }
    }

    /// A durable commit that changes nothing but the recorded journal LSN, if the store
    /// has frames its file's durable state does not hold: afterwards redb holds no
    /// unsynced pages and the journal segments they are in can be reused.
    fn checkpoint_uncovered(&self) -> Result<(), BackendFailure> {
        if !self.journal.uncovered(Stage::Dlr) {
            return Ok(());
        }
        let mut lsn = 0;
        self.file.write(Durability::Immediate, |txn| {
            let mut meta = txn.open_table(META)?;
            self.journal
                .check_applied(Stage::Dlr, get_counter(&meta, JOURNAL_LSN)?)
                .map_err(Fail::Located)?;
            // Every frame appended so far belongs to a write that has committed: frames
            // are appended inside write transactions, and this one holds redb's lock.
            lsn = self.journal.checkpoint_lsn();
            meta.insert(JOURNAL_LSN, lsn)?;
            Ok(((), true))
        })?;
        self.journal.checkpointed(Stage::Dlr, lsn);
        Ok(())
    }

    fn stats(&self) -> Result<DlrStats, BackendFailure> {
        self.file.read(|txn| {
            let meta = txn.open_table(META)?;
            let deliveries = txn.open_table(DELIVERIES)?;
            let oldest = match deliveries.first()? {
                Some((_, v)) => Some(decode_delivery(v.value())?.1.created_at),
                None => None,
            };
            Ok(DlrStats {
                awaiting_receipts: get_counter(&meta, AWAITING)?,
                correlations: txn.open_table(CORRELATIONS)?.len()?,
                pending_deliveries: deliveries.len()?,
                oldest_pending_delivery: oldest,
                orphans: txn.open_table(ORPHANS)?.len()?,
                inbound_parts: get_counter(&meta, INBOUND_PARTS)?,
            })
        })
    }

    /// The first keys of `inbound_due` up to `now`, each group read by its number.
    fn due_inbound_groups(&self, now: Timestamp, limit: usize) -> Result<Vec<InboundGroup>, BackendFailure> {
        self.file.read(|txn| {
            let due = txn.open_table(INBOUND_DUE)?;
            let groups = txn.open_table(INBOUND_GROUPS)?;
            let mut out = Vec::new();
            for item in due.range::<&[u8; 16]>(..=&due_key(now, u64::MAX))?.take(limit) {
                let no = records::due_key_id(item?.0.value());
                let Some(v) = groups.get(no)? else {
                    return Err(Fail::Invalid {
                        table: "inbound_due",
                        detail: "an inbound group is due but not held".to_string(),
                    });
                };
                out.push(decode_group(v.value())?.into_group(no));
            }
            Ok(out)
        })
    }
}

#[async_trait]
impl DlrStore for FileDlrStore {
    /// Claims in its writes: a receipt's delivery is created already claimed in the
    /// durable transaction that records the receipt, so it is sent without a claim
    /// round (a second transaction per batch of receipts).
    fn capabilities(&self) -> DlrCapabilities {
        DlrCapabilities {
            claims_in_writes: true,
            ..DlrCapabilities::single_writer(Backend::File, true)
        }
    }

    /// Its journal frame is not waited for: see the module docs for why a lost claim is
    /// harmless.
    async fn claim_due(
        &self,
        now: Timestamp,
        lease: Duration,
        limit: usize,
        scope: ClaimScope<'_>,
    ) -> Result<Vec<Delivery>, DlrError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let accounts: Option<Vec<String>> = match scope {
            ClaimScope::All => None,
            ClaimScope::SmppAccounts(a) => Some(a.to_vec()),
        };
        self.run(move |i| {
            let scope = accounts.as_deref().map_or(ClaimScope::All, ClaimScope::SmppAccounts);
            i.write(Wait::Buffered, |tx| tx.claim_due(now, lease, limit, scope))
        })
        .await
    }

    /// The whole step in one transaction: one journal frame (sharing a flush) for every
    /// handoff, receipt and delivery result the correlator gathered meanwhile. Returns
    /// once it is on disk: the provider may then be acknowledged, and an acknowledged
    /// delivery is never sent again because its result was lost.
    async fn apply(&self, step: DlrWrite) -> DlrWriteOutcome {
        if step.is_empty() {
            return DlrWriteOutcome::committed(Vec::new(), Vec::new());
        }
        let result = self
            .run(move |i| {
                i.write(Wait::Synced, |tx| {
                    let now = Timestamp::now();
                    tx.reserve(step.handoffs.len() + step.receipts.len());
                    if let Some(claim) = step.claim_created {
                        tx.claim_created(now, claim.lease, claim.limit);
                    }
                    for h in step.handoffs {
                        tx.hand_off(h, now)?;
                    }
                    let mut unmatched = Vec::new();
                    for (i, r) in step.intermediate.iter().enumerate() {
                        if !tx.record_intermediate(r, now)? {
                            unmatched.push(i);
                        }
                    }
                    let matches = step
                        .receipts
                        .into_iter()
                        .map(|r| tx.record_receipt(r, now))
                        .collect::<Result<Vec<_>, _>>()?;
                    tx.finish(step.finishes)?;
                    let ready = tx.inbound_parts(step.inbound_parts)?;
                    for m in step.inbound {
                        tx.inbound(m, now)?;
                    }
                    for no in step.inbound_dropped {
                        tx.drop_group(no)?;
                    }
                    let complete = tx.inbound_groups(ready)?;
                    Ok((matches, tx.take_claimed(), complete, unmatched))
                })
            })
            .await;
        match result {
            Ok((matches, claimed, complete_groups, unmatched_intermediate)) => DlrWriteOutcome {
                complete_groups,
                unmatched_intermediate,
                ..DlrWriteOutcome::committed(matches, claimed)
            },
            Err(e) => DlrWriteOutcome::failed(e),
        }
    }

    /// In transactions of at most `WAKE_BATCH` deliveries (each durable); a crash
    /// between them leaves the rest parked until the correlator wakes the account again.
    async fn wake_account(&self, account: &str, now: Timestamp) -> Result<u64, DlrError> {
        let account = account.to_string();
        self.run(move |i| {
            let mut total = 0;
            let mut after = None;
            loop {
                let (woken, last, more) =
                    i.write(Wait::Synced, |tx| tx.wake_account(&account, now, after, WAKE_BATCH))?;
                total += woken;
                if !more {
                    return Ok(total);
                }
                after = last;
            }
        })
        .await
    }

    async fn expire(&self, now: Timestamp, limit: usize) -> Result<ExpiryReport, DlrError> {
        if limit == 0 {
            return Ok(ExpiryReport::default());
        }
        self.run(move |i| i.write(Wait::Synced, |tx| tx.expire(now, limit)))
            .await
    }

    async fn stats(&self) -> Result<DlrStats, DlrError> {
        self.run(|i| i.stats()).await
    }

    async fn due_inbound_groups(&self, now: Timestamp, limit: usize) -> Result<Vec<InboundGroup>, DlrError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.run(move |i| i.due_inbound_groups(now, limit)).await
    }
}

impl Checkpoint for Inner {
    fn checkpoint(&self) -> Result<(), BackendFailure> {
        on_this_thread(&self.file, || self.checkpoint_uncovered())
    }
}

/// Apply the journal frames the file does not hold yet, durably. Runs on every (re)open,
/// before any caller sees the file.
fn recover(db: &Database, journal: &Journal, quick_repair: bool) -> Result<(), Fail> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    txn.set_quick_repair(quick_repair);
    let stored = get_counter(&txn.open_table(META)?, JOURNAL_LSN)?;
    let frames = journal.register(Stage::Dlr, stored).map_err(Fail::Located)?;
    for frame in &frames {
        redo::replay(&txn, &frame.payload, frame.lsn)?;
    }
    let lsn = journal.checkpoint_lsn();
    txn.open_table(META)?.insert(JOURNAL_LSN, lsn)?;
    txn.commit()?;
    journal.checkpointed(Stage::Dlr, lsn);
    if !frames.is_empty() {
        tracing::info!(file = %journal.location(), frames = frames.len(), "applied the dlr journal after an unclean stop");
    }
    Ok(())
}
