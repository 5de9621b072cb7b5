//! The file DLR store (`<dir>/dlr.redb`): provider correlations, pending downstream
//! deliveries (receipts and inbound messages) and the parts of multipart inbound
//! messages, surviving a restart, for the database-free single-process deployment.
//!
//! Its own redb file in the [`DataDir`], so the DLR store has its own namespace and
//! lifecycle, separate from the SMS stages (and its commits do not queue behind theirs).
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
//! | `meta` | name | `layout`, `awaiting`, `next_delivery`, `next_inbound_group`, `inbound_parts` |
//!
//! An inbound delivery is a delivery like a receipt's (claims, retries, scope by SMPP
//! account, expiry), its record carrying the message instead of an outcome. A file of an
//! earlier build opens as it is: the inbound tables are created empty, and its delivery
//! records, which have no message field, decode as receipts.
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
//! nothing is aborted (no fsync): a repeated handoff, a batch of duplicate receipts, a
//! claim with nothing due.
//!
//! * `hand_off` and `record_receipts`: `Durability::Immediate`. The source SMS is
//!   completed only after `hand_off` returns, and the provider's `deliver_sm_resp` is sent
//!   only after `record_receipts` returns; from then on this file is the only copy. The
//!   same holds for inbound parts and messages: the step stores them durably before the
//!   provider's `deliver_sm` is acknowledged.
//! * `finish`: `Durability::Immediate`. A lost "delivered" would send an acknowledged
//!   receipt again after a crash, and a lost retry/park would forget the backoff; one
//!   fsync per result batch is cheap next to the deliveries it reports.
//! * `claim_due`: `Durability::None` (no fsync). A claim lost in a crash leaves the
//!   delivery exactly as it was before the claim — due, with the previous attempt number
//!   — so after the restart it is claimed again and sent again: at least once downstream,
//!   which a lapsed lease already implies. The lost attempt number cannot confuse the
//!   fencing: the only results quoting it belonged to the process that crashed. Any later
//!   durable commit (a handoff, a receipt, a `finish`) makes the claim durable too, and a
//!   `finish` always follows its claim, so no result is ever applied to a claim that is
//!   then rolled back.
//! * `wake_account`, `expire`: `Durability::Immediate` (rare calls; a lost wake would
//!   also be harmless, the correlator wakes bound accounts when it starts).
//!
//! # Quick repair
//!
//! Off by default ([`FileDlrStore::default_options`]): quick repair's second fsync is
//! paid by every commit (every handoff and receipt batch), while what it buys is only a
//! shorter reopen after an unclean stop. The ignored `bench_dlr_reopen_after_sigkill`
//! test measures that reopen, with and without quick repair, for 1M correlations (a
//! ~0.9 GB file).
//!
//! # Blocking
//!
//! redb is blocking: every call runs on tokio's blocking pool (see
//! [`crate::file::engine::db`]), once per batch.

mod records;
mod tx;

#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redb::{Durability, ReadableTable, ReadableTableMetadata};

use self::records::due_key;
use self::tx::{
    AWAITING, CORRELATIONS, DELIVERIES, INBOUND_DUE, INBOUND_GROUPS, INBOUND_PARTS, ORPHANS, Tx, decode_delivery,
    decode_group,
};
use super::engine::db::{Fail, FileOptions, META, StoreFile, blocking, get_counter};
use super::engine::dir::{DLR_FILE, DataDir};
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
    /// open, no quick repair (see the module docs for the measurement behind that).
    pub fn default_options() -> FileOptions {
        FileOptions {
            cache_size: Self::CACHE,
            verify_on_open: false,
            quick_repair: false,
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
        let file = StoreFile::open(dir, DLR_FILE, options, tx::init)?;
        Ok(Self {
            inner: Arc::new(Inner { file, retention }),
        })
    }

    /// Release the delivery claims a previous process left (it was killed between
    /// claiming receipts and recording their results): they are due again at once
    /// instead of after their lease. Only right after open: the data directory is
    /// exclusively locked, so every claim in the file belongs to a process that is gone.
    /// One durable transaction; returns how many were released.
    pub async fn release_claims(&self, lease: Duration) -> Result<u64, DlrError> {
        self.run(move |i| i.write(Durability::Immediate, |tx| tx.release_claims(Timestamp::now(), lease)))
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

    async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<R, BackendFailure> + Send + 'static,
    ) -> Result<R, DlrError> {
        Ok(blocking(&self.inner, |i| &i.file, f).await?)
    }
}

impl Inner {
    /// Run `f` over the tables in one write transaction committed with `durability`
    /// (aborted when nothing changed).
    fn write<R>(
        &self,
        durability: Durability,
        f: impl FnOnce(&mut Tx<'_>) -> Result<R, Fail>,
    ) -> Result<R, BackendFailure> {
        let retention = self.retention;
        self.file.write(durability, |txn| {
            let mut tx = Tx::open(txn, retention)?;
            let out = f(&mut tx)?;
            let changed = tx.flush()?;
            Ok((out, changed))
        })
    }

    fn stats(&self) -> Result<DlrStats, BackendFailure> {
        self.file.read(|txn| {
            let meta = txn.open_table(META)?;
            let deliveries = txn.open_table(DELIVERIES)?;
            let oldest = match deliveries.first()? {
                Some((k, v)) => Some(decode_delivery(k.value(), v.value())?.1.created_at),
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
                        detail: format!("group {no} is due but not held"),
                    });
                };
                out.push(decode_group(no, v.value())?.into_group(no));
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

    /// Committed without fsync: see the module docs for why a lost claim is harmless.
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
            i.write(Durability::None, |tx| tx.claim_due(now, lease, limit, scope))
        })
        .await
    }

    /// The whole step in one durable transaction: one commit (and one fsync) for every
    /// handoff, receipt and delivery result the correlator gathered meanwhile. Returns
    /// once it is on disk: the provider may then be acknowledged, and an acknowledged
    /// delivery is never sent again because its result was lost.
    async fn apply(&self, step: DlrWrite) -> DlrWriteOutcome {
        if step.is_empty() {
            return DlrWriteOutcome::committed(Vec::new(), Vec::new());
        }
        let result = self
            .run(move |i| {
                i.write(Durability::Immediate, |tx| {
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
                let (woken, last, more) = i.write(Durability::Immediate, |tx| {
                    tx.wake_account(&account, now, after, WAKE_BATCH)
                })?;
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
        self.run(move |i| i.write(Durability::Immediate, |tx| tx.expire(now, limit)))
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
