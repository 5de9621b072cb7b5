//! Bounded in-memory DLR store.
//!
//! Correlates and delivers receipts while the process runs; correlations, retries and
//! undelivered receipts disappear on restart (the memory DLR profile says so). Bounded:
//! at most `capacity` outstanding receipts (reserved at admission through
//! [`ReceiptReservations`]), and uncorrelated receipts are capped too, oldest evicted.
//! A resolved message's correlations are dropped at once to stay within the bound; a late
//! duplicate receipt is then absorbed as an orphan, so it still never produces a second
//! downstream receipt.
//!
//! Inbound messages share the bound: each multipart part held and each inbound delivery
//! takes a reservation in the step that stores it, and a step whose parts and messages
//! do not fit is refused with `Full` as a whole (the provider is answered with a
//! temporary error and resends). Writes and drops of groups are applied even then: they
//! never need room (a written group's parts give their reservations to its delivery),
//! they make some.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;

use crate::backend::Backend;
use crate::dlr::{
    ClaimScope, Delivery, DeliveryContent, DeliveryFinish, DeliveryId, DeliveryResult, DlrCapabilities, DlrRetention,
    DlrState, DlrStats, DlrStore, DlrWrite, DlrWriteOutcome, ExpiryReport, Handoff, HandoffOutcome,
    IntermediateReceipt, ProviderReceipt, ReceiptMatch, ReceiptOutcome, ReceiptReservations, ReceiptTarget, ReplyPath,
    accepted_reports, buffered_report,
};
use crate::error::{BackendFailure, DlrError, FailureKind};
use crate::ids::{IdMap, IdSet, Timestamp, UnitId};
use crate::inbound::{InboundGroup, InboundGroupKey, InboundPart, RoutedInbound, StepGroups};

type TrackKey = (UnitId, u16);
type CorrKey = (String, String);

#[derive(Debug)]
struct Track {
    destination: String,
    /// Canonical provider id and its final outcome, per provider part.
    parts: Vec<(String, Option<ReceiptOutcome>)>,
    targets: Vec<ReceiptTarget>,
    first_failure: Option<ReceiptOutcome>,
    expires_at: Timestamp,
}

impl Track {
    /// The whole message's state once known: the first final failure, or DELIVRD when
    /// every provider part is delivered.
    fn resolution(&self) -> Option<ReceiptOutcome> {
        if let Some(f) = &self.first_failure {
            return Some(f.clone());
        }
        let mut done_at = Timestamp(0);
        for (_, outcome) in &self.parts {
            let o = outcome.as_ref()?;
            done_at = done_at.max(o.done_at);
        }
        Some(ReceiptOutcome {
            state: DlrState::Delivered,
            error: "000".to_string(),
            done_at,
        })
    }
}

#[derive(Debug)]
struct DeliveryRec {
    target: ReceiptTarget,
    content: DeliveryContent,
    attempt: u32,
    due_at: Timestamp,
    leased_until: Option<Timestamp>,
    created_at: Timestamp,
    expires_at: Timestamp,
}

#[derive(Debug, Default)]
struct Inner {
    tracks: IdMap<TrackKey, Track>,
    track_expiry: BTreeSet<(Timestamp, TrackKey)>,
    /// Recently resolved branches, so a repeated handoff does not start over.
    resolved: IdSet<TrackKey>,
    resolved_order: VecDeque<TrackKey>,
    /// Correlations by destination, then canonical provider key: looked up by `&str`s
    /// without building an owned key per candidate. Destinations are configured names
    /// ([`IdMap`]); provider ids are chosen by the provider, so they keep SipHash.
    corr: IdMap<String, HashMap<String, TrackKey>>,
    orphans: HashMap<CorrKey, (ReceiptOutcome, Timestamp)>,
    orphan_order: BTreeSet<(Timestamp, CorrKey)>,
    /// Boxed: a delivery is a few hundred bytes, and a B-tree node shifts its entries on
    /// every removal (deliveries mostly leave oldest first).
    deliveries: BTreeMap<DeliveryId, Box<DeliveryRec>>,
    due: BTreeSet<(Timestamp, DeliveryId)>,
    smpp_by_account: IdMap<String, BTreeSet<DeliveryId>>,
    next_delivery: u64,
    /// Multipart inbound groups held, by number.
    groups: BTreeMap<u64, InboundGroup>,
    /// Each key's open group.
    open_groups: HashMap<InboundGroupKey, u64>,
    /// (due time, group number): see [`InboundGroup::due_at`].
    group_due: BTreeSet<(Timestamp, u64)>,
    next_group: u64,
    /// Parts held in `groups`.
    inbound_parts: u64,
    /// While a step runs with [`DlrWrite::claim_created`]: the deliveries it creates are
    /// claimed for the caller, up to the limit (see [`CreatedClaims`]).
    claim: Option<CreatedClaims>,
}

/// Claims a step makes on the deliveries it creates: up to `limit`, each leased until
/// `lease_end`, as [`DlrStore::claim_due`] would have leased it.
#[derive(Debug)]
struct CreatedClaims {
    lease_end: Timestamp,
    limit: usize,
    claimed: Vec<Delivery>,
}

/// The bounded memory DLR store.
#[derive(Debug)]
pub struct MemoryDlrStore {
    retention: DlrRetention,
    reservations: Arc<ReceiptReservations>,
    max_orphans: usize,
    inner: Mutex<Inner>,
}

impl MemoryDlrStore {
    /// `capacity`: outstanding receipts the store may owe at once.
    pub fn new(capacity: u64, retention: DlrRetention) -> Self {
        let max_orphans = usize::try_from(capacity / 4).unwrap_or(usize::MAX).max(1_000);
        Self {
            retention,
            reservations: Arc::new(ReceiptReservations::new(capacity)),
            max_orphans,
            inner: Mutex::new(Inner::default()),
        }
    }
}

impl Inner {
    fn remove_delivery(&mut self, id: DeliveryId) -> Option<DeliveryRec> {
        let rec = self.deliveries.remove(&id)?;
        self.due.remove(&(rec.due_at, id));
        if rec.target.reply == ReplyPath::Smpp
            && let Some(set) = self.smpp_by_account.get_mut(&rec.target.account)
        {
            set.remove(&id);
            if set.is_empty() {
                self.smpp_by_account.remove(&rec.target.account);
            }
        }
        Some(*rec)
    }

    /// Remove a multipart group (written or dropped) and its index entries.
    fn remove_group(&mut self, no: u64) -> Option<InboundGroup> {
        let g = self.groups.remove(&no)?;
        self.group_due.remove(&(g.due_at(), no));
        if self.open_groups.get(&g.key) == Some(&no) {
            self.open_groups.remove(&g.key);
        }
        self.inbound_parts = self.inbound_parts.saturating_sub(g.parts.len() as u64);
        Some(g)
    }

    fn set_due(&mut self, id: DeliveryId, at: Timestamp) {
        if let Some(rec) = self.deliveries.get_mut(&id) {
            self.due.remove(&(rec.due_at, id));
            rec.due_at = at;
            self.due.insert((at, id));
        }
    }

    fn remove_track(&mut self, key: TrackKey) -> Option<Track> {
        let track = self.tracks.remove(&key)?;
        self.track_expiry.remove(&(track.expires_at, key));
        if let Some(by_key) = self.corr.get_mut(&track.destination) {
            for (k, _) in &track.parts {
                // One lookup: the key is almost always this branch's; when a later
                // branch took it over, it goes back.
                if let Some(other) = by_key.remove(k.as_str())
                    && other != key
                {
                    by_key.insert(k.clone(), other);
                }
            }
        }
        Some(track)
    }

    /// The branch `destination` correlated with provider key `key`.
    fn correlated(&self, destination: &str, key: &str) -> Option<TrackKey> {
        self.corr.get(destination)?.get(key).copied()
    }

    fn correlate(&mut self, destination: &str, key: &str, track: TrackKey) {
        let by_key = match self.corr.get_mut(destination) {
            Some(by_key) => by_key,
            None => self.corr.entry(destination.to_owned()).or_default(),
        };
        by_key.insert(key.to_owned(), track);
    }

    fn remember_resolved(&mut self, key: TrackKey, cap: usize) {
        if self.resolved.insert(key) {
            self.resolved_order.push_back(key);
            while self.resolved_order.len() > cap {
                if let Some(old) = self.resolved_order.pop_front() {
                    self.resolved.remove(&old);
                }
            }
        }
    }

    fn add_orphan(&mut self, key: CorrKey, outcome: ReceiptOutcome, expires_at: Timestamp, cap: usize) {
        if let Some((_, old_exp)) = self.orphans.insert(key.clone(), (outcome, expires_at)) {
            self.orphan_order.remove(&(old_exp, key.clone()));
        }
        self.orphan_order.insert((expires_at, key));
        while self.orphans.len() > cap {
            let Some((exp, k)) = self.orphan_order.pop_first() else {
                break;
            };
            if self.orphans.get(&k).is_some_and(|(_, e)| *e == exp) {
                self.orphans.remove(&k);
            }
        }
    }

    fn take_orphan(&mut self, key: &CorrKey) -> Option<ReceiptOutcome> {
        let (outcome, exp) = self.orphans.remove(key)?;
        self.orphan_order.remove(&(exp, key.clone()));
        Some(outcome)
    }
}

impl MemoryDlrStore {
    /// Apply a final outcome to one part of a track. Returns (accepted, resolved).
    fn apply(inner: &mut Inner, key: TrackKey, part_key: &str, outcome: ReceiptOutcome) -> (bool, bool) {
        let Some(track) = inner.tracks.get_mut(&key) else {
            return (false, false);
        };
        let Some(slot) = track.parts.iter_mut().find(|(k, _)| k == part_key) else {
            return (false, false);
        };
        if slot.1.is_some() {
            return (false, false);
        }
        if !outcome.state.is_success() && track.first_failure.is_none() {
            track.first_failure = Some(outcome.clone());
        }
        slot.1 = Some(outcome);
        (true, track.resolution().is_some())
    }

    /// Turn a resolved track into pending deliveries and forget its correlations.
    fn resolve(&self, inner: &mut Inner, key: TrackKey, now: Timestamp) {
        let Some(track) = inner.remove_track(key) else {
            return;
        };
        let Some(outcome) = track.resolution() else {
            return;
        };
        let cap = usize::try_from(self.reservations.capacity())
            .unwrap_or(usize::MAX)
            .max(1_000);
        inner.remember_resolved(key, cap);
        self.create_deliveries(inner, track.targets, outcome, now);
    }

    fn create_deliveries(
        &self,
        inner: &mut Inner,
        targets: Vec<ReceiptTarget>,
        outcome: ReceiptOutcome,
        now: Timestamp,
    ) {
        for target in targets {
            if target.failure_only && outcome.state.is_success() {
                self.reservations.release(1);
                continue;
            }
            self.create_delivery(inner, target, DeliveryContent::Receipt(outcome.clone()), now);
        }
    }

    /// A progress report's delivery. It holds a reservation like a receipt's, taken
    /// regardless of capacity (the message was admitted already), so finishing it
    /// releases one like any delivery.
    fn create_progress(&self, inner: &mut Inner, target: ReceiptTarget, content: DeliveryContent, now: Timestamp) {
        self.reservations.force_reserve(1);
        self.create_delivery(inner, target, content, now);
    }

    /// One pending delivery, due at once or claimed for the caller (see [`CreatedClaims`]).
    fn create_delivery(&self, inner: &mut Inner, target: ReceiptTarget, content: DeliveryContent, now: Timestamp) {
        inner.next_delivery += 1;
        let id = DeliveryId(inner.next_delivery);
        if target.reply == ReplyPath::Smpp {
            match inner.smpp_by_account.get_mut(target.account.as_str()) {
                Some(ids) => {
                    ids.insert(id);
                }
                None => {
                    inner.smpp_by_account.insert(target.account.clone(), [id].into());
                }
            }
        }
        let expires_at = now.saturating_add(self.retention.retention);
        let lease_end = inner
            .claim
            .as_ref()
            .filter(|c| c.claimed.len() < c.limit)
            .map(|c| c.lease_end);
        if let Some(claim) = inner.claim.as_mut().filter(|_| lease_end.is_some()) {
            claim.claimed.push(Delivery {
                id,
                attempt: 1,
                target: target.clone(),
                content: content.clone(),
                created_at: now,
                expires_at,
            });
        }
        let due_at = lease_end.unwrap_or(now);
        inner.due.insert((due_at, id));
        inner.deliveries.insert(
            id,
            Box::new(DeliveryRec {
                target,
                content,
                attempt: u32::from(lease_end.is_some()),
                due_at,
                leased_until: lease_end,
                created_at: now,
                expires_at,
            }),
        );
    }
}

/// The receipt parts of a step, each under the lock on its own (nothing here is durable,
/// so a step need not be one transaction).
impl MemoryDlrStore {
    fn hand_off(&self, batch: Vec<Handoff>) -> Result<(), DlrError> {
        let now = Timestamp::now();
        let mut inner = self.inner.lock();
        for h in batch {
            let key = (h.unit, h.branch);
            if inner.resolved.contains(&key) {
                continue;
            }
            let accepted = accepted_reports(&h);
            match h.outcome {
                HandoffOutcome::Failed(outcome) => {
                    match inner.tracks.entry(key) {
                        // An earlier attempt of this branch is awaiting receipts; the
                        // failure now decides the message.
                        Entry::Occupied(mut t) => {
                            t.get_mut().first_failure.get_or_insert(outcome);
                        }
                        Entry::Vacant(v) => {
                            v.insert(Track {
                                destination: h.destination,
                                parts: Vec::new(),
                                targets: h.targets,
                                first_failure: Some(outcome),
                                expires_at: h.handed_off_at.saturating_add(self.retention.retention),
                            });
                        }
                    }
                    self.resolve(&mut inner, key, now);
                }
                HandoffOutcome::Submitted { provider_keys } => {
                    if let Some(existing) = inner.tracks.get(&key) {
                        let same = existing.parts.len() == provider_keys.len()
                            && existing.parts.iter().zip(&provider_keys).all(|((a, _), b)| a == b);
                        if same {
                            continue;
                        }
                        // Resubmitted: the new provider ids are the ones that count.
                        let mut old = inner.remove_track(key);
                        if let Some(t) = old.as_mut() {
                            t.parts = provider_keys.iter().map(|k| (k.clone(), None)).collect();
                            t.first_failure = None;
                        }
                        if let Some(t) = old {
                            inner.track_expiry.insert((t.expires_at, key));
                            inner.tracks.insert(key, t);
                        }
                    } else {
                        let expires_at = h.handed_off_at.saturating_add(self.retention.retention);
                        inner.track_expiry.insert((expires_at, key));
                        inner.tracks.insert(
                            key,
                            Track {
                                destination: h.destination.clone(),
                                parts: provider_keys.iter().map(|k| (k.clone(), None)).collect(),
                                targets: h.targets,
                                first_failure: None,
                                expires_at,
                            },
                        );
                        for (target, content) in accepted {
                            self.create_progress(&mut inner, target, content, now);
                        }
                    }
                    let mut resolved = false;
                    for k in &provider_keys {
                        inner.correlate(&h.destination, k, key);
                        if inner.orphans.is_empty() {
                            continue;
                        }
                        if let Some(outcome) = inner.take_orphan(&(h.destination.clone(), k.clone())) {
                            let (_, r) = Self::apply(&mut inner, key, k, outcome);
                            resolved |= r;
                        }
                    }
                    if provider_keys.is_empty() || resolved {
                        self.resolve(&mut inner, key, now);
                    }
                }
            }
        }
        Ok(())
    }

    /// Type 4 reports of intermediate receipts for messages awaiting their final one.
    /// Returns the positions of those that matched no correlation.
    fn record_intermediate(&self, batch: Vec<IntermediateReceipt>) -> Vec<usize> {
        let mut unmatched = Vec::new();
        if batch.is_empty() {
            return unmatched;
        }
        let now = Timestamp::now();
        let mut inner = self.inner.lock();
        for (i, r) in batch.into_iter().enumerate() {
            let found = r
                .keys
                .iter()
                .find_map(|k| inner.correlated(&r.destination, k).map(|t| (t, k.clone())));
            let Some((key, part_key)) = found else {
                unmatched.push(i);
                continue;
            };
            let reports: Vec<(ReceiptTarget, DeliveryContent)> = inner
                .tracks
                .get(&key)
                .filter(|t| t.resolution().is_none())
                .map(|t| {
                    t.targets
                        .iter()
                        .filter_map(|target| buffered_report(target, &r, &part_key).map(|c| (target.clone(), c)))
                        .collect()
                })
                .unwrap_or_default();
            for (target, content) in reports {
                self.create_progress(&mut inner, target, content, now);
            }
        }
        unmatched
    }

    fn record_receipts(&self, batch: Vec<ProviderReceipt>) -> Result<Vec<ReceiptMatch>, DlrError> {
        let now = Timestamp::now();
        let mut inner = self.inner.lock();
        let mut out = Vec::with_capacity(batch.len());
        for r in batch {
            let found = r
                .keys
                .iter()
                .find_map(|k| inner.correlated(&r.destination, k).map(|t| (t, k)));
            match found {
                Some((track, part_key)) => {
                    let (accepted, resolved) = Self::apply(&mut inner, track, part_key, r.outcome);
                    if !accepted {
                        out.push(ReceiptMatch::Duplicate { unit: track.0 });
                        continue;
                    }
                    if resolved {
                        self.resolve(&mut inner, track, now);
                    }
                    out.push(ReceiptMatch::Matched {
                        unit: track.0,
                        resolved,
                    });
                }
                None => {
                    if let Some(k) = r.keys.first() {
                        let exp = now.saturating_add(self.retention.orphan_retention);
                        inner.add_orphan((r.destination.clone(), k.clone()), r.outcome, exp, self.max_orphans);
                    }
                    out.push(ReceiptMatch::Orphaned);
                }
            }
        }
        Ok(out)
    }

    fn finish(&self, results: Vec<DeliveryFinish>) -> Result<(), DlrError> {
        let mut inner = self.inner.lock();
        for f in results {
            let Some(rec) = inner.deliveries.get(&f.id) else {
                continue;
            };
            if rec.attempt != f.attempt {
                continue;
            }
            match f.result {
                DeliveryResult::Delivered | DeliveryResult::Dead => {
                    if inner.remove_delivery(f.id).is_some() {
                        self.reservations.release(1);
                    }
                }
                DeliveryResult::Retry { at } => {
                    if let Some(rec) = inner.deliveries.get_mut(&f.id) {
                        rec.leased_until = None;
                    }
                    inner.set_due(f.id, at);
                }
            }
        }
        Ok(())
    }
}

/// The inbound part of a step, under the lock at once: parts, then routed messages, then
/// dropped groups.
impl MemoryDlrStore {
    fn inbound(
        &self,
        parts: Vec<InboundPart>,
        messages: Vec<RoutedInbound>,
        dropped: Vec<u64>,
    ) -> (Result<(), DlrError>, Vec<InboundGroup>) {
        if parts.is_empty() && messages.is_empty() && dropped.is_empty() {
            return (Ok(()), Vec::new());
        }
        let now = Timestamp::now();
        let mut inner = self.inner.lock();

        // Place the parts on copies of their keys' open groups: nothing changes until
        // the room for them is reserved.
        let mut keys: Vec<&InboundGroupKey> = parts.iter().map(|p| &p.key).collect();
        keys.sort_unstable();
        keys.dedup();
        let open: Vec<InboundGroup> = keys
            .iter()
            .filter_map(|k| inner.open_groups.get(*k))
            .filter_map(|no| inner.groups.get(no).cloned())
            .collect();
        let mut step = StepGroups::new(open);
        for part in parts {
            step.place(part);
        }

        // Room: a reservation per part stored and per message without a group. The
        // groups this step writes or drops give theirs back (a written one keeps one for
        // its delivery), so what they free before the step counts as room already.
        let need = (step.stored_parts() + messages.iter().filter(|m| m.group.is_none()).count()) as u64;
        let mut freed = 0u64;
        let mut seen = HashSet::new();
        let removals = messages.iter().filter_map(|m| m.group.map(|no| (no, true)));
        for (no, routed) in removals.chain(dropped.iter().map(|no| (*no, false))) {
            if seen.insert(no)
                && let Some(g) = inner.groups.get(&no)
            {
                freed += (g.parts.len() as u64).saturating_sub(u64::from(routed));
            }
        }
        let beyond = need.saturating_sub(freed);
        let fits = beyond == 0 || self.reservations.try_reserve(beyond);
        if fits {
            self.reservations.force_reserve(need - beyond);
        }

        let mut ready = Vec::new();
        if fits {
            let mut numbered = inner.next_group;
            step.number(|| {
                numbered += 1;
                numbered
            });
            inner.next_group = numbered;
            for t in step.into_touched() {
                if !t.changed() {
                    continue;
                }
                inner.inbound_parts += t.added.len() as u64;
                if let Some(due) = t.due_before {
                    inner.group_due.remove(&(due, t.group.no));
                }
                inner.group_due.insert((t.group.due_at(), t.group.no));
                if t.closed_now && inner.open_groups.get(&t.group.key) == Some(&t.group.no) {
                    inner.open_groups.remove(&t.group.key);
                }
                if !t.group.closed {
                    inner.open_groups.insert(t.group.key.clone(), t.group.no);
                }
                if t.ready() {
                    ready.push(t.group.no);
                }
                inner.groups.insert(t.group.no, t.group);
            }
        }
        for m in messages {
            let target = m.target();
            let message = match m.group {
                Some(no) => {
                    // A written group's parts give their reservations to its delivery.
                    let Some(g) = inner.remove_group(no) else {
                        continue;
                    };
                    match g.parts.len() as u64 {
                        0 => self.reservations.force_reserve(1),
                        n => self.reservations.release(n - 1),
                    }
                    g.deliver_as(m.message)
                }
                None if !fits => continue,
                None => m.message,
            };
            self.create_delivery(&mut inner, target, DeliveryContent::Inbound(Box::new(message)), now);
        }
        for no in dropped {
            if let Some(g) = inner.remove_group(no) {
                self.reservations.release(g.parts.len() as u64);
            }
        }
        if !fits {
            let failure = BackendFailure::new(
                FailureKind::Full,
                "memory dlr store",
                format_args!(
                    "{} of {} receipts and inbound messages held; no room for {need} more inbound",
                    self.reservations.held(),
                    self.reservations.capacity()
                ),
            );
            return (Err(DlrError::from(failure)), Vec::new());
        }
        let complete = ready.iter().filter_map(|no| inner.groups.get(no).cloned()).collect();
        (Ok(()), complete)
    }
}

#[async_trait]
impl DlrStore for MemoryDlrStore {
    fn capabilities(&self) -> DlrCapabilities {
        DlrCapabilities {
            reservations: Some(self.reservations.clone()),
            claims_in_writes: true,
            ..DlrCapabilities::single_writer(Backend::Memory, false)
        }
    }

    /// Claims in its writes, like the file store: a resolved branch's deliveries come
    /// back claimed with the step, so the correlator sends them without a claim round.
    async fn apply(&self, step: DlrWrite) -> DlrWriteOutcome {
        if let Some(c) = step.claim_created {
            self.inner.lock().claim = Some(CreatedClaims {
                lease_end: Timestamp::now().saturating_add(c.lease),
                limit: c.limit,
                claimed: Vec::with_capacity(c.limit.min(4096)),
            });
        }
        let handoffs = self.hand_off(step.handoffs);
        let unmatched_intermediate = self.record_intermediate(step.intermediate);
        let receipts = self.record_receipts(step.receipts);
        let finishes = self.finish(step.finishes);
        let (inbound, complete_groups) = self.inbound(step.inbound_parts, step.inbound, step.inbound_dropped);
        let claimed = self.inner.lock().claim.take().map(|c| c.claimed).unwrap_or_default();
        DlrWriteOutcome {
            handoffs,
            receipts,
            finishes,
            inbound,
            complete_groups,
            claimed,
            unmatched_intermediate,
        }
    }

    async fn claim_due(
        &self,
        now: Timestamp,
        lease: Duration,
        limit: usize,
        scope: ClaimScope<'_>,
    ) -> Result<Vec<Delivery>, DlrError> {
        let mut inner = self.inner.lock();
        let due: Vec<DeliveryId> = inner
            .due
            .iter()
            .take_while(|(at, _)| *at <= now)
            .filter(|(_, id)| {
                inner.deliveries.get(id).is_some_and(|rec| {
                    scope.takes((rec.target.reply == ReplyPath::Smpp).then_some(rec.target.account.as_str()))
                })
            })
            .take(limit)
            .map(|(_, id)| *id)
            .collect();
        let lease_end = now.saturating_add(lease);
        let mut out = Vec::with_capacity(due.len());
        for id in due {
            inner.set_due(id, lease_end);
            if let Some(rec) = inner.deliveries.get_mut(&id) {
                rec.attempt += 1;
                rec.leased_until = Some(lease_end);
                out.push(Delivery {
                    id,
                    attempt: rec.attempt,
                    target: rec.target.clone(),
                    content: rec.content.clone(),
                    created_at: rec.created_at,
                    expires_at: rec.expires_at,
                });
            }
        }
        Ok(out)
    }

    async fn wake_account(&self, account: &str, now: Timestamp) -> Result<u64, DlrError> {
        let mut inner = self.inner.lock();
        let ids: Vec<DeliveryId> = inner
            .smpp_by_account
            .get(account)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        let mut woken = 0;
        for id in ids {
            let idle = inner
                .deliveries
                .get(&id)
                .is_some_and(|r| r.leased_until.is_none_or(|l| l <= now) && r.due_at > now);
            if idle {
                inner.set_due(id, now);
                woken += 1;
            }
        }
        Ok(woken)
    }

    async fn expire(&self, now: Timestamp, limit: usize) -> Result<ExpiryReport, DlrError> {
        let mut inner = self.inner.lock();
        let mut report = ExpiryReport::default();
        let expired_tracks: Vec<TrackKey> = inner
            .track_expiry
            .iter()
            .take_while(|(at, _)| *at <= now)
            .take(limit)
            .map(|(_, k)| *k)
            .collect();
        for key in expired_tracks {
            if let Some(track) = inner.remove_track(key) {
                self.reservations.release(track.targets.len() as u64);
                report.unresolved += 1;
            }
        }
        let dead: Vec<DeliveryId> = inner
            .deliveries
            .iter()
            // Ids grow with creation time and retention is fixed, so expiry order is id order.
            .take_while(|(_, r)| r.expires_at <= now)
            .take(limit)
            .map(|(id, _)| *id)
            .collect();
        for id in dead {
            if inner.remove_delivery(id).is_some() {
                self.reservations.release(1);
                report.dead_deliveries += 1;
            }
        }
        while let Some((exp, key)) = inner.orphan_order.first().cloned() {
            if exp > now || report.orphans >= limit as u64 {
                break;
            }
            inner.orphan_order.pop_first();
            if inner.orphans.get(&key).is_some_and(|(_, e)| *e == exp) {
                inner.orphans.remove(&key);
                report.orphans += 1;
            }
        }
        Ok(report)
    }

    async fn stats(&self) -> Result<DlrStats, DlrError> {
        let inner = self.inner.lock();
        Ok(DlrStats {
            awaiting_receipts: inner.tracks.len() as u64,
            correlations: inner.corr.values().map(HashMap::len).sum::<usize>() as u64,
            pending_deliveries: inner.deliveries.len() as u64,
            oldest_pending_delivery: inner.deliveries.first_key_value().map(|(_, r)| r.created_at),
            orphans: inner.orphans.len() as u64,
            inbound_parts: inner.inbound_parts,
        })
    }

    async fn due_inbound_groups(&self, now: Timestamp, limit: usize) -> Result<Vec<InboundGroup>, DlrError> {
        let inner = self.inner.lock();
        Ok(inner
            .group_due
            .iter()
            .take_while(|(at, _)| *at <= now)
            .take(limit)
            .filter_map(|(_, no)| inner.groups.get(no).cloned())
            .collect())
    }
}
