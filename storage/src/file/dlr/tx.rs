//! The file DLR store's tables and the work of each call inside one redb write
//! transaction. The semantics are the memory store's (see
//! [`MemoryDlrStore`](crate::memory::MemoryDlrStore)); the differences are only what a
//! durable, unbounded store can afford, listed in the [module docs](super).

mod inbound;

use std::time::Duration;

use redb::{ReadableTable, ReadableTableMetadata, TableDefinition, WriteTransaction};

use super::records::{
    DeliveryHeader, DeliveryRecord, OrphanRecord, PartState, StoredOutcome, StoredTarget, TrackKey, TrackRecord,
    corr_key, delivery_value, due_key, due_key_id, orphan_expiry_key, parse_delivery, track_expiry_key, track_key,
    track_of_expiry_key, track_unit,
};
use super::redo::{Logged, Redo, TableId};
use crate::dlr::{
    ClaimScope, Delivery, DeliveryContent, DeliveryFinish, DeliveryId, DeliveryResult, DlrRetention, ExpiryReport,
    Handoff, HandoffOutcome, IntermediateReceipt, ProviderReceipt, ReceiptMatch, ReceiptTarget, ReplyPath,
    accepted_reports, buffered_report,
};
use crate::envelope::{self, RecordKind};
use crate::file::engine::db::{Fail, META, check_layout, encode, get_counter};
use crate::file::engine::journaled::JOURNAL_LSN;
use crate::ids::{IdMap, Timestamp};

pub(crate) const TRACKS: TableDefinition<&[u8; 18], &[u8]> = TableDefinition::new("tracks");
pub(crate) const TRACK_EXPIRY: TableDefinition<&[u8; 26], ()> = TableDefinition::new("track_expiry");
pub(crate) const CORRELATIONS: TableDefinition<&[u8], &[u8; 18]> = TableDefinition::new("correlations");
pub(crate) const ORPHANS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("orphans");
pub(crate) const ORPHAN_EXPIRY: TableDefinition<&[u8], ()> = TableDefinition::new("orphan_expiry");
pub(crate) const DELIVERIES: TableDefinition<u64, &[u8]> = TableDefinition::new("deliveries");
pub(crate) const DUE: TableDefinition<&[u8; 16], ()> = TableDefinition::new("due");
pub(crate) const SMPP_BY_ACCOUNT: TableDefinition<(&str, u64), ()> = TableDefinition::new("smpp_by_account");
pub(crate) use self::inbound::{INBOUND_DUE, INBOUND_GROUPS, INBOUND_OPEN, INBOUND_PARTS, NEXT_GROUP, decode_group};

/// Table layout version of `dlr.redb`. The inbound tables came without a new layout: a
/// file of an earlier build gets them (empty) at its next open, and its delivery records
/// decode as receipts.
pub(crate) const LAYOUT: u64 = 1;
/// Meta counter: branches not yet resolved (the `tracks` table also holds resolved ones).
pub(crate) const AWAITING: &str = "awaiting";
/// Meta counter: the last delivery id handed out (ids are never reused).
pub(crate) const NEXT_DELIVERY: &str = "next_delivery";

/// Create the tables, check the layout, and check what is cheap to check: the first and
/// last record of each record table decode, index and record tables have the same
/// length (redb keeps lengths in the tree headers, so this is O(1)), no delivery id is
/// beyond the stored counter. A damaged or newer file stops the open instead of a later
/// call.
pub(crate) fn init(txn: &WriteTransaction) -> Result<(), Fail> {
    check_layout(txn, LAYOUT)?;
    let tracks = txn.open_table(TRACKS)?;
    let track_expiry = txn.open_table(TRACK_EXPIRY)?;
    txn.open_table(CORRELATIONS)?;
    let orphans = txn.open_table(ORPHANS)?;
    let orphan_expiry = txn.open_table(ORPHAN_EXPIRY)?;
    let deliveries = txn.open_table(DELIVERIES)?;
    let due = txn.open_table(DUE)?;
    txn.open_table(SMPP_BY_ACCOUNT)?;
    inbound::init(txn)?;
    let meta = txn.open_table(META)?;
    for entry in [tracks.first()?, tracks.last()?].into_iter().flatten() {
        decode_track(entry.1.value())?;
    }
    for entry in [orphans.first()?, orphans.last()?].into_iter().flatten() {
        decode_orphan(entry.1.value())?;
    }
    for entry in [deliveries.first()?, deliveries.last()?].into_iter().flatten() {
        decode_delivery(entry.1.value())?;
    }
    let same_len = |what: &str, a: u64, b: u64| {
        if a == b {
            Ok(())
        } else {
            Err(Fail::Invalid {
                table: "meta",
                detail: format!("{what}: {a} vs {b} entries (an index and its records disagree)"),
            })
        }
    };
    same_len("tracks / track_expiry", tracks.len()?, track_expiry.len()?)?;
    same_len("orphans / orphan_expiry", orphans.len()?, orphan_expiry.len()?)?;
    same_len("deliveries / due", deliveries.len()?, due.len()?)?;
    let awaiting = get_counter(&meta, AWAITING)?;
    if awaiting > tracks.len()? {
        return Err(Fail::Invalid {
            table: "meta",
            detail: format!(
                "{awaiting} branches awaiting receipts but only {} tracks",
                tracks.len()?
            ),
        });
    }
    if let Some((k, _)) = deliveries.last()?
        && k.value() > get_counter(&meta, NEXT_DELIVERY)?
    {
        return Err(Fail::Invalid {
            table: "deliveries",
            detail: "a delivery id is beyond the stored delivery counter".to_string(),
        });
    }
    Ok(())
}

pub(crate) fn decode_track(bytes: &[u8]) -> Result<TrackRecord, Fail> {
    envelope::decode(RecordKind::DlrTrack, bytes).map_err(|e| Fail::message_record("tracks", e))
}

fn decode_orphan(bytes: &[u8]) -> Result<OrphanRecord, Fail> {
    envelope::decode(RecordKind::DlrOrphan, bytes).map_err(|e| Fail::message_record("orphans", e))
}

/// Decode a whole `deliveries` value: its header, SMPP account and record.
pub(crate) fn decode_delivery(value: &[u8]) -> Result<(DeliveryHeader, DeliveryRecord), Fail> {
    let v = delivery_parts(value)?;
    let rec: DeliveryRecord =
        envelope::decode(RecordKind::DlrDelivery, v.record).map_err(|e| Fail::message_record("deliveries", e))?;
    if rec.content().is_none() {
        return Err(Fail::Invalid {
            table: "deliveries",
            detail: "a delivery carries no receipt, inbound message or progress report".to_string(),
        });
    }
    Ok((v.header, rec))
}

/// A delivery as the contract hands it out.
fn delivery_of(id: u64, attempt: u32, rec: DeliveryRecord) -> Result<Delivery, Fail> {
    let content = rec.content().ok_or_else(|| Fail::Invalid {
        table: "deliveries",
        detail: "a delivery carries no receipt, inbound message or progress report".to_string(),
    })?;
    Ok(Delivery {
        id: DeliveryId(id),
        attempt,
        target: rec.target.into(),
        content,
        created_at: rec.created_at,
        expires_at: rec.expires_at,
    })
}

/// Parse a `deliveries` value's header; a malformed one is corruption.
fn delivery_parts(value: &[u8]) -> Result<super::records::DeliveryValue<'_>, Fail> {
    parse_delivery(value).ok_or_else(|| Fail::Invalid {
        table: "deliveries",
        detail: "malformed delivery header".to_string(),
    })
}

/// A track as loaded into one transaction: decoded once, however many handoffs and
/// receipts of the batch touch it, and written back once at the end if it changed.
struct Cached {
    rec: Option<TrackRecord>,
    dirty: bool,
}

/// The tables of one write transaction, its counters and its track cache.
pub(crate) struct Tx<'t> {
    tracks: Logged<'t, &'static [u8; 18], &'static [u8]>,
    track_expiry: Logged<'t, &'static [u8; 26], ()>,
    corr: Logged<'t, &'static [u8], &'static [u8; 18]>,
    orphans: Logged<'t, &'static [u8], &'static [u8]>,
    orphan_expiry: Logged<'t, &'static [u8], ()>,
    deliveries: Logged<'t, u64, &'static [u8]>,
    due: Logged<'t, &'static [u8; 16], ()>,
    by_account: Logged<'t, (&'static str, u64), ()>,
    meta: Logged<'t, &'static str, u64>,
    txn: &'t WriteTransaction,
    redo: &'t Redo,
    /// The journal LSN the tables correspond to (see [`super`]'s durability).
    pub(crate) journal_lsn: u64,
    /// The inbound tables and counters, opened by the first inbound write of the
    /// transaction (a step of receipts alone does not pay for them).
    inbound: Option<inbound::InboundTables<'t>>,
    awaiting: u64,
    next_delivery: u64,
    counters_dirty: bool,
    cache: IdMap<TrackKey, Cached>,
    retention: DlrRetention,
    /// Deliveries this transaction creates already claimed for the caller (see
    /// [`DlrWrite::claim_created`](crate::DlrWrite::claim_created)).
    claim: Option<CreatedClaims>,
    /// Anything written: otherwise the transaction is aborted (no fsync).
    pub(crate) changed: bool,
}

/// The claims a write makes on the deliveries it creates: up to `limit`, each leased
/// until `lease_end` as [`Tx::claim_due`] would have leased it.
struct CreatedClaims {
    lease_end: Timestamp,
    limit: usize,
    claimed: Vec<Delivery>,
}

impl<'t> Tx<'t> {
    /// The tables of `txn`, every change to them recorded in `redo`.
    pub(crate) fn open(txn: &'t WriteTransaction, retention: DlrRetention, redo: &'t Redo) -> Result<Self, Fail> {
        let meta = Logged::open(txn, META, TableId::Meta, redo)?;
        let awaiting = get_counter(&*meta, AWAITING)?;
        let next_delivery = get_counter(&*meta, NEXT_DELIVERY)?;
        let journal_lsn = get_counter(&*meta, JOURNAL_LSN)?;
        Ok(Self {
            tracks: Logged::open(txn, TRACKS, TableId::Tracks, redo)?,
            track_expiry: Logged::open(txn, TRACK_EXPIRY, TableId::TrackExpiry, redo)?,
            corr: Logged::open(txn, CORRELATIONS, TableId::Correlations, redo)?,
            orphans: Logged::open(txn, ORPHANS, TableId::Orphans, redo)?,
            orphan_expiry: Logged::open(txn, ORPHAN_EXPIRY, TableId::OrphanExpiry, redo)?,
            deliveries: Logged::open(txn, DELIVERIES, TableId::Deliveries, redo)?,
            due: Logged::open(txn, DUE, TableId::Due, redo)?,
            by_account: Logged::open(txn, SMPP_BY_ACCOUNT, TableId::SmppByAccount, redo)?,
            meta,
            txn,
            redo,
            journal_lsn,
            inbound: None,
            awaiting,
            next_delivery,
            counters_dirty: false,
            cache: IdMap::default(),
            retention,
            claim: None,
            changed: false,
        })
    }

    /// Claim up to `limit` of the deliveries this transaction creates (attempt 1, leased
    /// for `lease` from `now`) instead of leaving them due: the caller sends them without
    /// a claim round. They are durable with the transaction, so its commit is the claim.
    pub(crate) fn claim_created(&mut self, now: Timestamp, lease: Duration, limit: usize) {
        self.claim = Some(CreatedClaims {
            lease_end: now.saturating_add(lease),
            limit,
            claimed: Vec::with_capacity(limit.min(4096)),
        });
    }

    /// The deliveries claimed by [`claim_created`](Self::claim_created) so far.
    pub(crate) fn take_claimed(&mut self) -> Vec<Delivery> {
        self.claim
            .as_mut()
            .map(|c| std::mem::take(&mut c.claimed))
            .unwrap_or_default()
    }

    /// Make room in the track cache for `n` more tracks (a batch's size), so a large
    /// step does not rehash it again and again.
    pub(crate) fn reserve(&mut self, n: usize) {
        self.cache.reserve(n);
    }

    /// Write back the changed tracks and counters. Call once, before committing.
    pub(crate) fn flush(mut self) -> Result<bool, Fail> {
        for (key, cached) in self.cache.drain() {
            if let (true, Some(rec)) = (cached.dirty, &cached.rec) {
                let bytes = encode(RecordKind::DlrTrack, "tracks", rec)?;
                self.tracks.insert(&key, bytes.as_slice())?;
                self.changed = true;
            }
        }
        if self.counters_dirty {
            self.meta.insert(AWAITING, self.awaiting)?;
            self.meta.insert(NEXT_DELIVERY, self.next_delivery)?;
            self.changed = true;
        }
        if let Some(t) = self.inbound.as_ref().filter(|t| t.counters_dirty) {
            self.meta.insert(NEXT_GROUP, t.next_group)?;
            self.meta.insert(INBOUND_PARTS, t.parts)?;
            self.changed = true;
        }
        Ok(self.changed)
    }

    // ---- tracks -----------------------------------------------------------------------

    fn load(&mut self, key: &TrackKey) -> Result<(), Fail> {
        if !self.cache.contains_key(key) {
            let rec = match self.tracks.get(key)? {
                Some(v) => Some(decode_track(v.value())?),
                None => None,
            };
            self.cache.insert(*key, Cached { rec, dirty: false });
        }
        Ok(())
    }

    fn cached(&mut self, key: &TrackKey) -> Option<&mut Cached> {
        self.cache.get_mut(key)
    }

    /// Put a branch's track in the cache: the stored one, or else `fresh`, written now.
    /// Returns whether it was created.
    ///
    /// Most handoffs are for a branch seen for the first time, so the fresh track is
    /// inserted straight away and the stored one looked at only if the insert replaced
    /// something (a repeated handoff: it is put back) — one B-tree descent instead of a
    /// failed lookup followed by an insert.
    fn load_or_create(&mut self, key: &TrackKey, fresh: impl FnOnce() -> TrackRecord) -> Result<bool, Fail> {
        if self.cache.contains_key(key) {
            return Ok(false);
        }
        let rec = fresh();
        let bytes = encode(RecordKind::DlrTrack, "tracks", &rec)?;
        let old = self.tracks.insert(key, bytes.as_slice())?.map(|v| v.value().to_vec());
        self.changed = true;
        if let Some(old) = old {
            self.tracks.insert(key, old.as_slice())?;
            let stored = decode_track(&old)?;
            self.cache.insert(
                *key,
                Cached {
                    rec: Some(stored),
                    dirty: false,
                },
            );
            return Ok(false);
        }
        self.track_expiry.insert(&track_expiry_key(rec.expires_at, key), ())?;
        self.awaiting += 1;
        self.counters_dirty = true;
        self.cache.insert(
            *key,
            Cached {
                rec: Some(rec),
                dirty: false,
            },
        );
        Ok(true)
    }

    /// Record one branch's provider outcome (see [`DlrStore::hand_off`](crate::DlrStore::hand_off)).
    pub(crate) fn hand_off(&mut self, h: Handoff, now: Timestamp) -> Result<(), Fail> {
        let key = track_key(h.unit, h.branch);
        let expires_at = h.handed_off_at.saturating_add(self.retention.retention);
        let accepted = accepted_reports(&h);
        let Handoff {
            destination,
            outcome,
            targets,
            ..
        } = h;
        let created = self.load_or_create(&key, || TrackRecord {
            destination: destination.clone(),
            parts: match &outcome {
                HandoffOutcome::Submitted { provider_keys } => provider_keys
                    .iter()
                    .map(|k| PartState {
                        key: k.clone(),
                        outcome: None,
                    })
                    .collect(),
                HandoffOutcome::Failed(_) => Vec::new(),
            },
            stale: Vec::new(),
            targets: targets.into_iter().map(Into::into).collect(),
            first_failure: match &outcome {
                HandoffOutcome::Failed(o) => Some(o.clone().into()),
                HandoffOutcome::Submitted { .. } => None,
            },
            expires_at,
            resolved: false,
        })?;
        match outcome {
            HandoffOutcome::Failed(outcome) => {
                if !created {
                    match self.cached(&key) {
                        // Resolved already (and kept until retention): a repeat changes nothing.
                        Some(Cached { rec: Some(t), .. }) if t.resolved => return Ok(()),
                        // An earlier attempt of this branch is awaiting receipts; the failure
                        // now decides the message.
                        Some(Cached { rec: Some(t), dirty }) => {
                            t.first_failure.get_or_insert(outcome.into());
                            *dirty = true;
                        }
                        _ => {}
                    }
                }
                self.resolve(&key, now)
            }
            HandoffOutcome::Submitted { provider_keys } => {
                if created {
                    for (target, content) in accepted {
                        self.create_delivery(target.into(), content, now)?;
                    }
                } else {
                    match self.cached(&key) {
                        Some(Cached { rec: Some(t), .. }) if t.resolved => return Ok(()),
                        Some(Cached { rec: Some(t), .. })
                            if t.destination == destination
                                && t.parts.len() == provider_keys.len()
                                && t.parts.iter().zip(&provider_keys).all(|(p, k)| &p.key == k) =>
                        {
                            return Ok(());
                        }
                        // Resubmitted: the new provider ids are the ones that count. The old
                        // ones stay correlated to this branch (a late receipt for them is
                        // recognised as this message's, and changes nothing).
                        Some(Cached { rec: Some(t), dirty }) => {
                            let old_destination = std::mem::replace(&mut t.destination, destination.clone());
                            for part in std::mem::take(&mut t.parts) {
                                let old = (old_destination.clone(), part.key);
                                if !t.stale.contains(&old) {
                                    t.stale.push(old);
                                }
                            }
                            t.stale
                                .retain(|(d, k)| !(d == &destination && provider_keys.contains(k)));
                            t.parts = provider_keys
                                .iter()
                                .map(|k| PartState {
                                    key: k.clone(),
                                    outcome: None,
                                })
                                .collect();
                            t.first_failure = None;
                            *dirty = true;
                        }
                        _ => {}
                    }
                }
                let mut resolved = false;
                for k in &provider_keys {
                    let ck = corr_key(&destination, k);
                    self.corr.insert(ck.as_slice(), &key)?;
                    self.changed = true;
                    if let Some(outcome) = self.take_orphan(&ck)? {
                        resolved |= self.apply(&key, k, outcome).1;
                    }
                }
                if provider_keys.is_empty() || resolved {
                    self.resolve(&key, now)?;
                }
                Ok(())
            }
        }
    }

    /// Apply a final outcome to one part of a loaded track. Returns (accepted, resolved).
    fn apply(&mut self, key: &TrackKey, part_key: &str, outcome: StoredOutcome) -> (bool, bool) {
        let Some(Cached { rec: Some(t), dirty }) = self.cache.get_mut(key) else {
            return (false, false);
        };
        if t.resolved {
            return (false, false);
        }
        let Some(slot) = t.parts.iter_mut().find(|p| p.key == part_key) else {
            return (false, false);
        };
        if slot.outcome.is_some() {
            return (false, false);
        }
        if !outcome.state.is_success() && t.first_failure.is_none() {
            t.first_failure = Some(outcome.clone());
        }
        slot.outcome = Some(outcome);
        *dirty = true;
        (true, t.resolution().is_some())
    }

    /// Decide a loaded track's message and create one pending delivery per receipt target
    /// (failure-only targets skipped when it was delivered). The track stays, resolved.
    fn resolve(&mut self, key: &TrackKey, now: Timestamp) -> Result<(), Fail> {
        let Some(Cached { rec: Some(t), dirty }) = self.cache.get_mut(key) else {
            return Ok(());
        };
        if t.resolved {
            return Ok(());
        }
        let Some(outcome) = t.resolution() else {
            return Ok(());
        };
        // Stripped to what a resolved track is kept for (see TrackRecord).
        t.resolved = true;
        let targets = std::mem::take(&mut t.targets);
        t.first_failure = None;
        for part in &mut t.parts {
            part.outcome = None;
        }
        *dirty = true;
        self.awaiting = self.awaiting.saturating_sub(1);
        self.counters_dirty = true;
        self.changed = true;
        for target in targets {
            if target.failure_only && outcome.state.is_success() {
                continue;
            }
            self.create_delivery(target, DeliveryContent::Receipt(outcome.clone().into()), now)?;
        }
        Ok(())
    }

    /// Type 4 reports of one intermediate receipt, when it matches a branch still awaiting
    /// its final receipt (see [`IntermediateReceipt`]). Returns whether it matched a
    /// correlation.
    pub(crate) fn record_intermediate(&mut self, r: &IntermediateReceipt, now: Timestamp) -> Result<bool, Fail> {
        let mut found = None;
        for k in &r.keys {
            if let Some(v) = self.corr.get(corr_key(&r.destination, k).as_slice())? {
                found = Some((*v.value(), k));
                break;
            }
        }
        let Some((tk, part_key)) = found else {
            return Ok(false);
        };
        self.load(&tk)?;
        let reports: Vec<(StoredTarget, DeliveryContent)> = match self.cached(&tk) {
            Some(Cached { rec: Some(t), .. }) if !t.resolved => t
                .targets
                .iter()
                .filter_map(|st| {
                    let target = ReceiptTarget::from(st.clone());
                    buffered_report(&target, r, part_key).map(|c| (st.clone(), c))
                })
                .collect(),
            _ => Vec::new(),
        };
        for (target, content) in reports {
            self.create_delivery(target, content, now)?;
        }
        Ok(true)
    }

    /// Match one provider receipt (see [`DlrStore::record_receipts`](crate::DlrStore::record_receipts)).
    pub(crate) fn record_receipt(&mut self, r: ProviderReceipt, now: Timestamp) -> Result<ReceiptMatch, Fail> {
        let mut found = None;
        for (i, k) in r.keys.iter().enumerate() {
            let ck = corr_key(&r.destination, k);
            if let Some(v) = self.corr.get(ck.as_slice())? {
                found = Some((*v.value(), i));
                break;
            }
        }
        let Some((tk, i)) = found else {
            if let Some(k) = r.keys.first() {
                let expires_at = now.saturating_add(self.retention.orphan_retention);
                self.add_orphan(&corr_key(&r.destination, k), r.outcome.into(), expires_at)?;
            }
            return Ok(ReceiptMatch::Orphaned);
        };
        self.load(&tk)?;
        if !matches!(self.cached(&tk), Some(Cached { rec: Some(_), .. })) {
            return Err(Fail::Invalid {
                table: "correlations",
                detail: "a correlation points at a branch that has no track".to_string(),
            });
        }
        let unit = track_unit(&tk);
        let (accepted, resolved) = self.apply(&tk, &r.keys[i], r.outcome.into());
        if !accepted {
            return Ok(ReceiptMatch::Duplicate { unit });
        }
        if resolved {
            self.resolve(&tk, now)?;
        }
        Ok(ReceiptMatch::Matched { unit, resolved })
    }

    // ---- orphans ----------------------------------------------------------------------

    /// Keep an uncorrelated receipt; a newer one for the same id replaces it (as memory).
    fn add_orphan(&mut self, ck: &[u8], outcome: StoredOutcome, expires_at: Timestamp) -> Result<(), Fail> {
        let old = match self.orphans.get(ck)? {
            Some(v) => Some(decode_orphan(v.value())?),
            None => None,
        };
        if let Some(old) = old {
            self.orphan_expiry
                .remove(orphan_expiry_key(old.expires_at, ck).as_slice())?;
        }
        let bytes = encode(RecordKind::DlrOrphan, "orphans", &OrphanRecord { outcome, expires_at })?;
        self.orphans.insert(ck, bytes.as_slice())?;
        self.orphan_expiry
            .insert(orphan_expiry_key(expires_at, ck).as_slice(), ())?;
        self.changed = true;
        Ok(())
    }

    fn take_orphan(&mut self, ck: &[u8]) -> Result<Option<StoredOutcome>, Fail> {
        // Usually there are none: the length is in the tree header, cheaper than a lookup.
        if self.orphans.len()? == 0 {
            return Ok(None);
        }
        let rec = match self.orphans.remove(ck)? {
            Some(v) => decode_orphan(v.value())?,
            None => return Ok(None),
        };
        self.orphan_expiry
            .remove(orphan_expiry_key(rec.expires_at, ck).as_slice())?;
        self.changed = true;
        Ok(Some(rec.outcome))
    }

    // ---- deliveries -------------------------------------------------------------------

    fn create_delivery(&mut self, target: StoredTarget, content: DeliveryContent, now: Timestamp) -> Result<(), Fail> {
        self.next_delivery += 1;
        let id = self.next_delivery;
        let expires_at = now.saturating_add(self.retention.retention);
        let smpp = target.reply == ReplyPath::Smpp;
        let lease_end = self
            .claim
            .as_ref()
            .filter(|c| c.claimed.len() < c.limit)
            .map(|c| c.lease_end);
        let header = match lease_end {
            Some(end) => DeliveryHeader {
                attempt: 1,
                due_at: end,
                leased_until: Some(end),
                expires_at,
                indexed: false,
            },
            None => DeliveryHeader {
                attempt: 0,
                due_at: now,
                leased_until: None,
                expires_at,
                indexed: false,
            },
        };
        let claimed = lease_end.is_some() && self.claim.is_some();
        let rec = DeliveryRecord::new(target, content, now, expires_at);
        let record = encode(RecordKind::DlrDelivery, "deliveries", &rec)?;
        let account = smpp.then_some(rec.target.account.as_str());
        self.deliveries
            .insert(id, delivery_value(header, account, &record).as_slice())?;
        self.due.insert(&due_key(header.due_at, id), ())?;
        if claimed {
            let d = delivery_of(id, header.attempt, rec)?;
            if let Some(claim) = self.claim.as_mut() {
                claim.claimed.push(d);
            }
        }
        self.counters_dirty = true;
        self.changed = true;
        Ok(())
    }

    /// Rewrite a delivery's header with `f` (one lookup, in place), moving its `due` key
    /// when the due time changes. `f` returns `None` to leave the delivery as it is.
    /// Returns the new header and, if `with_record`, the decoded record.
    fn update_delivery(
        &mut self,
        id: u64,
        with_record: bool,
        f: impl FnOnce(DeliveryHeader) -> Option<DeliveryHeader>,
    ) -> Result<Option<(DeliveryHeader, Option<DeliveryRecord>)>, Fail> {
        let (old, new, rec, index_account) = {
            let Some(mut guard) = self.deliveries.get_mut(id)? else {
                return Ok(None);
            };
            let mut value = guard.value().to_vec();
            let (old, account) = {
                let p = delivery_parts(&value)?;
                (p.header, p.smpp_account.map(str::to_string))
            };
            let rec = if with_record {
                Some(decode_delivery(&value)?.1)
            } else {
                None
            };
            let Some(mut new) = f(old) else {
                return Ok(None);
            };
            // Only SMPP deliveries are indexed by account, and an entry is never dropped
            // while the delivery lives.
            new.indexed = account.is_some() && (old.indexed || new.indexed);
            new.write_into(&mut value);
            guard.insert(value.as_slice())?;
            let index_account = account.filter(|_| new.indexed && !old.indexed);
            (old, new, rec, index_account)
        };
        if let Some(account) = index_account {
            self.by_account.insert((account.as_str(), id), ())?;
        }
        if old.due_at != new.due_at {
            self.due.remove(&due_key(old.due_at, id))?;
            self.due.insert(&due_key(new.due_at, id), ())?;
        }
        self.changed = true;
        Ok(Some((new, rec)))
    }

    /// Remove a delivery and its index entries, if `keep` does not object to its header.
    fn remove_delivery(&mut self, id: u64, keep: impl FnOnce(&DeliveryHeader) -> bool) -> Result<bool, Fail> {
        let (header, account) = {
            let Some(v) = self.deliveries.remove(id)? else {
                return Ok(false);
            };
            let bytes = v.value();
            let p = delivery_parts(bytes)?;
            if keep(&p.header) {
                // Rare (a stale result): put it back as it was.
                let bytes = bytes.to_vec();
                drop(v);
                self.deliveries.insert(id, bytes.as_slice())?;
                return Ok(false);
            }
            (
                p.header,
                p.smpp_account.filter(|_| p.header.indexed).map(str::to_string),
            )
        };
        self.due.remove(&due_key(header.due_at, id))?;
        if let Some(account) = account {
            self.by_account.remove((account.as_str(), id))?;
        }
        self.changed = true;
        Ok(true)
    }

    /// Claim up to `limit` deliveries due at `now`, in due-time order (the first keys of
    /// the `due` index): attempt + 1, due again at the lease's end.
    pub(crate) fn claim_due(
        &mut self,
        now: Timestamp,
        lease: Duration,
        limit: usize,
        scope: ClaimScope<'_>,
    ) -> Result<Vec<Delivery>, Fail> {
        let upper = due_key(now, u64::MAX);
        let mut picked = Vec::with_capacity(limit.min(4096));
        for item in self.due.range::<&[u8; 16]>(..=&upper)? {
            if picked.len() >= limit {
                break;
            }
            let id = due_key_id(item?.0.value());
            if scope != ClaimScope::All {
                let Some(value) = self.deliveries.get(id)? else {
                    continue;
                };
                if !scope.takes(delivery_parts(value.value())?.smpp_account) {
                    continue;
                }
            }
            picked.push(id);
        }
        let lease_end = now.saturating_add(lease);
        let mut out = Vec::with_capacity(picked.len());
        for id in picked {
            let claimed = self.update_delivery(id, true, |h| {
                Some(DeliveryHeader {
                    attempt: h.attempt.saturating_add(1),
                    due_at: lease_end,
                    leased_until: Some(lease_end),
                    ..h
                })
            })?;
            let Some((header, Some(rec))) = claimed else {
                return Err(Fail::Invalid {
                    table: "due",
                    detail: "a delivery is due but has no record".to_string(),
                });
            };
            out.push(delivery_of(id, header.attempt, rec)?);
        }
        Ok(out)
    }

    /// Make every delivery claimed within `lease` before `now` due at `now` (claims of a
    /// process that is gone). A claim's due time is its lease end, so only the due range
    /// up to `now + lease` is walked, not the parked deliveries behind it.
    pub(crate) fn release_claims(&mut self, now: Timestamp, lease: Duration) -> Result<u64, Fail> {
        let lower = due_key(now, 0);
        let upper = due_key(now.saturating_add(lease), u64::MAX);
        let mut ids = Vec::new();
        for item in self.due.range::<&[u8; 16]>(&lower..=&upper)? {
            ids.push(due_key_id(item?.0.value()));
        }
        let mut released = 0;
        for id in ids {
            let changed = self.update_delivery(id, false, |h| {
                h.leased_until.is_some().then_some(DeliveryHeader {
                    due_at: now,
                    leased_until: None,
                    ..h
                })
            })?;
            if changed.is_some() {
                released += 1;
            }
        }
        Ok(released)
    }

    /// Apply attempt results; a result quoting another attempt than the current one is
    /// stale (the delivery was claimed again since) and ignored.
    pub(crate) fn finish(&mut self, results: Vec<DeliveryFinish>) -> Result<(), Fail> {
        for f in results {
            let id = f.id.0;
            match f.result {
                DeliveryResult::Delivered | DeliveryResult::Dead => {
                    self.remove_delivery(id, |h| h.attempt != f.attempt)?;
                }
                DeliveryResult::Retry { at } => {
                    // A retried SMPP delivery may be parked for an unbound account: index
                    // it, so `wake_account` finds it.
                    self.update_delivery(id, false, |h| {
                        (h.attempt == f.attempt).then_some(DeliveryHeader {
                            due_at: at,
                            leased_until: None,
                            indexed: true,
                            ..h
                        })
                    })?;
                }
            }
        }
        Ok(())
    }

    /// Make up to `batch` of `account`'s SMPP deliveries after `after` due now (those
    /// neither leased nor due already). Returns (woken, last id looked at, more to look at).
    pub(crate) fn wake_account(
        &mut self,
        account: &str,
        now: Timestamp,
        after: Option<u64>,
        batch: usize,
    ) -> Result<(u64, Option<u64>, bool), Fail> {
        let start = match after {
            Some(u64::MAX) => return Ok((0, after, false)),
            Some(a) => a + 1,
            None => 0,
        };
        let mut ids = Vec::with_capacity(batch.min(4096));
        for item in self
            .by_account
            .range::<(&str, u64)>((account, start)..=(account, u64::MAX))?
            .take(batch)
        {
            ids.push(item?.0.value().1);
        }
        let mut woken = 0;
        for &id in &ids {
            let updated = self.update_delivery(id, false, |h| {
                let idle = h.leased_until.is_none_or(|l| l <= now) && h.due_at > now;
                idle.then_some(DeliveryHeader { due_at: now, ..h })
            })?;
            if updated.is_some() {
                woken += 1;
            }
        }
        Ok((woken, ids.last().copied(), ids.len() == batch))
    }

    /// Drop up to `limit` each of tracks, deliveries and orphans whose expiry is at or
    /// before `now`, taking the first keys of their expiry indexes.
    pub(crate) fn expire(&mut self, now: Timestamp, limit: usize) -> Result<ExpiryReport, Fail> {
        let mut report = ExpiryReport::default();

        let upper = track_expiry_key(now, &[0xff; 18]);
        let mut keys = Vec::new();
        for item in self.track_expiry.range::<&[u8; 26]>(..=&upper)?.take(limit) {
            keys.push(*item?.0.value());
        }
        for ek in keys {
            self.track_expiry.remove(&ek)?;
            self.changed = true;
            let tk = track_of_expiry_key(&ek);
            let rec = match self.tracks.remove(&tk)? {
                Some(v) => decode_track(v.value())?,
                None => continue,
            };
            for (d, k) in rec.correlated() {
                let ck = corr_key(d, k);
                let ours = self.corr.get(ck.as_slice())?.is_some_and(|v| *v.value() == tk);
                if ours {
                    self.corr.remove(ck.as_slice())?;
                }
            }
            if !rec.resolved {
                self.awaiting = self.awaiting.saturating_sub(1);
                self.counters_dirty = true;
                report.unresolved += 1;
            }
        }

        // Delivery ids grow with creation time and every delivery's expiry is its
        // creation plus the retention, so the first ids are the first to expire (the
        // memory store's rule). After a restart that shortened the retention, deliveries
        // created since wait behind older ones at most until those expire.
        let mut ids = Vec::new();
        for item in self.deliveries.iter()?.take(limit) {
            let (k, v) = item?;
            let id = k.value();
            if delivery_parts(v.value())?.header.expires_at > now {
                break;
            }
            ids.push(id);
        }
        for id in ids {
            if self.remove_delivery(id, |_| false)? {
                report.dead_deliveries += 1;
            }
        }

        let mut keys = Vec::new();
        {
            let range = match now.0.checked_add(1) {
                Some(next) => self.orphan_expiry.range::<&[u8]>(..next.to_be_bytes().as_slice())?,
                None => self.orphan_expiry.range::<&[u8]>(..)?,
            };
            for item in range.take(limit) {
                keys.push(item?.0.value().to_vec());
            }
        }
        for k in keys {
            self.orphan_expiry.remove(k.as_slice())?;
            self.changed = true;
            let Some((at, ck)) = k.split_first_chunk::<8>() else {
                continue;
            };
            let at = Timestamp(u64::from_be_bytes(*at));
            let expired = match self.orphans.get(ck)? {
                Some(v) => decode_orphan(v.value())?.expires_at == at,
                None => false,
            };
            if expired {
                self.orphans.remove(ck)?;
                report.orphans += 1;
            }
        }
        Ok(report)
    }
}
