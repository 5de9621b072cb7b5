//! In-memory pending stage: explicitly non-durable, bounded by `max_records`.
//!
//! It outlives the Ingress actor (the supervisor holds it), so an actor restart loses
//! nothing; a process restart loses everything, as the memory profile documents.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;

use crate::backend::StageCapabilities;
use crate::error::PendingError;
use crate::ids::{IdMap, MessageId, ReadyCursor, ReadySeq, Timestamp, UnitId};
use crate::pending::{AdmitOutcome, Disposition, PendingCapabilities, PendingStats, PendingStore, ReadyUnit, Unit};
use crate::reassembly::{self, GroupView, KeyState, Placement};
use crate::record::{GroupKey, PendingRecord};

/// Limits of the pending stage that every backend applies at admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingLimits {
    /// Admission answers `Full` beyond this many source records.
    pub max_records: u64,
    /// How long an idempotency key keeps deduplicating after its first admission.
    pub idempotency_retention: Duration,
}

impl Default for PendingLimits {
    fn default() -> Self {
        Self {
            max_records: 500_000,
            idempotency_retention: Duration::from_secs(24 * 3600),
        }
    }
}

#[derive(Debug)]
struct UnitEntry {
    seq: ReadySeq,
    disposition: Disposition,
    members: Vec<MessageId>,
}

/// A multipart group: open while its parts arrive, then remembered until its deadline
/// once complete (see [`crate::reassembly`]).
#[derive(Debug, Default)]
struct Group {
    /// The number of parts, as the group's first part said.
    total: u8,
    /// seq → the records admitted for it.
    parts: BTreeMap<u8, GroupPart>,
    deadline: Timestamp,
}

#[derive(Debug)]
struct GroupPart {
    /// The first is the one whose payload is used.
    ids: Vec<MessageId>,
    /// The first's submission digest.
    digest: u64,
}

impl Group {
    fn members(&self) -> Vec<MessageId> {
        self.parts.values().flat_map(|p| p.ids.iter().copied()).collect()
    }

    fn view(&self, seq: u8) -> GroupView {
        GroupView {
            total: self.total,
            at_seq: self.parts.get(&seq).and_then(|p| Some((*p.ids.first()?, p.digest))),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// Boxed: a record is a few hundred bytes, and a B-tree node shifts its entries on
    /// every removal (records leave oldest first, from the front of their node).
    records: BTreeMap<MessageId, Box<PendingRecord>>,
    units: IdMap<UnitId, UnitEntry>,
    ready: BTreeMap<ReadySeq, UnitId>,
    groups: HashMap<GroupKey, Group>,
    deadlines: BTreeMap<(Timestamp, GroupKey), ()>,
    /// Completed groups, until their deadlines.
    completed: HashMap<GroupKey, Group>,
    completed_deadlines: BTreeMap<(Timestamp, GroupKey), ()>,
    /// (account, key) → first admission's id, retention deadline and submission digest.
    idempotency: HashMap<(String, String), (MessageId, Timestamp, u64)>,
    idempotency_expiry: BTreeMap<(Timestamp, String, String), ()>,
    receipt_requests: u64,
    next_seq: u64,
}

impl Inner {
    fn make_ready(&mut self, id: UnitId, disposition: Disposition, members: Vec<MessageId>, lane: u8) {
        self.next_seq += 1;
        let seq = ReadySeq::in_lane(lane, self.next_seq);
        self.ready.insert(seq, id);
        self.units.insert(
            id,
            UnitEntry {
                seq,
                disposition,
                members,
            },
        );
    }

    fn unit(&self, id: UnitId) -> Option<ReadyUnit> {
        let entry = self.units.get(&id)?;
        let parts = entry
            .members
            .iter()
            .filter_map(|m| self.records.get(m).map(|r| PendingRecord::clone(r)))
            .collect();
        Some(ReadyUnit {
            seq: entry.seq,
            unit: Unit {
                id,
                disposition: entry.disposition,
                parts,
            },
        })
    }

    /// Where `part` (with submission digest `digest`) goes (see [`crate::reassembly`]).
    fn place(&self, part: &PendingRecord, digest: u64, now: Timestamp) -> Placement {
        let (Some(gk), Some(info)) = (part.group_key(), part.part) else {
            return Placement::Join;
        };
        let known = match self.groups.get(&gk) {
            Some(open) => Some(KeyState::Open(open.view(info.seq))),
            None => self
                .completed
                .get(&gk)
                .filter(|c| c.deadline > now)
                .map(|c| KeyState::Completed(c.view(info.seq))),
        };
        reassembly::place(part, digest, known)
    }

    /// Close the open group of `gk` as incomplete: a ready unit that expires.
    fn close_incomplete(&mut self, gk: &GroupKey) -> bool {
        let Some(group) = self.groups.remove(gk) else {
            return false;
        };
        self.deadlines.remove(&(group.deadline, gk.clone()));
        let members = group.members();
        if let Some(first) = members.first().copied() {
            self.make_ready(first, Disposition::Expired, members, 0);
        }
        true
    }

    /// Forget the completed group of `gk`, if one is remembered.
    fn forget_completed(&mut self, gk: &GroupKey) {
        if let Some(c) = self.completed.remove(gk) {
            self.completed_deadlines.remove(&(c.deadline, gk.clone()));
        }
    }

    /// Forget completed groups whose deadline has passed.
    fn forget_completed_groups(&mut self, now: Timestamp) {
        while let Some(((at, gk), ())) = self.completed_deadlines.first_key_value() {
            if *at > now {
                break;
            }
            let key = (*at, gk.clone());
            self.completed_deadlines.remove(&key);
            if self.completed.get(&key.1).is_some_and(|c| c.deadline == key.0) {
                self.completed.remove(&key.1);
            }
        }
    }

    fn forget_idempotency(&mut self, now: Timestamp) {
        while let Some(((at, account, key), ())) = self.idempotency_expiry.first_key_value() {
            if *at > now {
                break;
            }
            let k = (account.clone(), key.clone());
            let at = *at;
            self.idempotency_expiry.remove(&(at, k.0.clone(), k.1.clone()));
            if self.idempotency.get(&k).is_some_and(|(_, exp, _)| *exp == at) {
                self.idempotency.remove(&k);
            }
        }
    }
}

/// The memory pending store.
#[derive(Debug)]
pub struct MemoryPendingStore {
    limits: PendingLimits,
    inner: Mutex<Inner>,
}

impl MemoryPendingStore {
    pub fn new(limits: PendingLimits) -> Self {
        Self {
            limits,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Admit a batch into the structures (after the commit's completions).
    fn admit_in(&self, inner: &mut Inner, batch: Vec<PendingRecord>) -> Vec<AdmitOutcome> {
        let now = Timestamp::now();
        let idem_expiry = now.saturating_add(self.limits.idempotency_retention);
        inner.forget_idempotency(now);
        inner.forget_completed_groups(now);
        let mut outcomes = Vec::with_capacity(batch.len());
        for record in batch {
            if let Some(key) = &record.idempotency_key
                && let Some((existing, _, digest)) = inner.idempotency.get(&(record.account.clone(), key.clone()))
            {
                let existing = *existing;
                outcomes.push(if *digest == record.submission_digest() {
                    AdmitOutcome::Duplicate { existing }
                } else {
                    AdmitOutcome::KeyReused { existing }
                });
                continue;
            }
            // Only parts are compared with other admissions.
            let digest = if record.part.is_some() {
                record.submission_digest()
            } else {
                0
            };
            let placement = inner.place(&record, digest, now);
            if let Placement::Retransmission { existing } = placement {
                outcomes.push(AdmitOutcome::Duplicate { existing });
                continue;
            }
            if inner.records.len() as u64 >= self.limits.max_records {
                outcomes.push(AdmitOutcome::Full);
                continue;
            }
            admit_one(inner, record, digest, placement, idem_expiry);
            outcomes.push(if placement == Placement::Supersede {
                AdmitOutcome::Superseding
            } else {
                AdmitOutcome::Admitted
            });
        }
        outcomes
    }
}

/// Remove completed units and their source records. Unknown ids are ignored.
fn complete_in(inner: &mut Inner, ids: &[UnitId]) {
    for id in ids {
        if let Some(entry) = inner.units.remove(id) {
            inner.ready.remove(&entry.seq);
            for m in entry.members {
                if let Some(rec) = inner.records.remove(&m)
                    && rec.wants_receipt()
                {
                    inner.receipt_requests = inner.receipt_requests.saturating_sub(1);
                }
            }
        }
    }
}

/// Admit one record into the structures (shared by every admission path), where
/// [`Inner::place`] put it (a retransmission is not admitted at all).
fn admit_one(inner: &mut Inner, record: PendingRecord, digest: u64, placement: Placement, idem_expiry: Timestamp) {
    let id = record.id;
    if record.wants_receipt() {
        inner.receipt_requests += 1;
    }
    if let Some(key) = &record.idempotency_key {
        let k = (record.account.clone(), key.clone());
        inner
            .idempotency_expiry
            .insert((idem_expiry, k.0.clone(), k.1.clone()), ());
        inner
            .idempotency
            .insert(k, (id, idem_expiry, record.submission_digest()));
    }
    let (Some(gk), Some(part)) = (record.group_key(), record.part) else {
        let lane = record.route_priority;
        inner.records.insert(id, Box::new(record));
        inner.make_ready(id, Disposition::Deliver, vec![id], lane);
        return;
    };
    if placement == Placement::Supersede {
        inner.close_incomplete(&gk);
    }
    if !inner.groups.contains_key(&gk) {
        // A new message with this reference: the completed one is no longer expected.
        inner.forget_completed(&gk);
    }
    let group = inner.groups.entry(gk.clone()).or_insert_with(|| Group {
        total: part.total,
        parts: BTreeMap::new(),
        deadline: part.expires_at,
    });
    group
        .parts
        .entry(part.seq)
        .or_insert_with(|| GroupPart {
            ids: Vec::new(),
            digest,
        })
        .ids
        .push(id);
    let complete = group.parts.len() == usize::from(group.total);
    let old_deadline = group.deadline;
    group.deadline = group.deadline.min(part.expires_at);
    let new_deadline = group.deadline;
    // A completed group's lane is that of the part completing it.
    let lane = record.route_priority;
    inner.records.insert(id, Box::new(record));
    inner.deadlines.remove(&(old_deadline, gk.clone()));
    if !complete {
        inner.deadlines.insert((new_deadline, gk), ());
        return;
    }
    if let Some(group) = inner.groups.remove(&gk) {
        let members = group.members();
        if let Some(first) = members.first().copied() {
            inner.make_ready(first, Disposition::Deliver, members, lane);
        }
        inner.completed_deadlines.insert((group.deadline, gk.clone()), ());
        inner.completed.insert(gk, group);
    }
}

#[async_trait]
impl PendingStore for MemoryPendingStore {
    fn capabilities(&self) -> PendingCapabilities {
        PendingCapabilities {
            stage: StageCapabilities::MEMORY,
            blocking_writer: None,
        }
    }

    async fn commit(&self, admit: Vec<PendingRecord>, complete: &[UnitId]) -> Result<Vec<AdmitOutcome>, PendingError> {
        let mut inner = self.inner.lock();
        complete_in(&mut inner, complete);
        Ok(self.admit_in(&mut inner, admit))
    }

    async fn ready_after(&self, after: ReadyCursor, limit: usize) -> Result<Vec<ReadyUnit>, PendingError> {
        let inner = self.inner.lock();
        let mut ids: Vec<UnitId> = Vec::new();
        for lane in (0..ReadySeq::LANES as u8).rev() {
            let from = ReadySeq(after.lane(lane).0.max(ReadySeq::in_lane(lane, 0).0).saturating_add(1));
            let room = limit - ids.len();
            ids.extend(
                inner
                    .ready
                    .range(from..ReadySeq::lane_end(lane))
                    .take(room)
                    .map(|(_, id)| *id),
            );
            if ids.len() >= limit {
                break;
            }
        }
        Ok(ids.into_iter().filter_map(|id| inner.unit(id)).collect())
    }

    async fn units(&self, ids: &[UnitId]) -> Result<Vec<ReadyUnit>, PendingError> {
        let inner = self.inner.lock();
        Ok(ids.iter().filter_map(|id| inner.unit(*id)).collect())
    }

    async fn expire_groups(&self, now: Timestamp, limit: usize) -> Result<usize, PendingError> {
        let mut inner = self.inner.lock();
        let mut expired = 0;
        while expired < limit {
            let Some(((deadline, gk), ())) = inner.deadlines.first_key_value() else {
                break;
            };
            if *deadline > now {
                break;
            }
            let key = (*deadline, gk.clone());
            inner.deadlines.remove(&key);
            if inner.close_incomplete(&key.1) {
                expired += 1;
            }
        }
        Ok(expired)
    }

    async fn stats(&self) -> Result<PendingStats, PendingError> {
        let inner = self.inner.lock();
        Ok(PendingStats {
            records: inner.records.len() as u64,
            ready_units: inner.units.len() as u64,
            incomplete_groups: inner.groups.len() as u64,
            receipt_requests: inner.receipt_requests,
            oldest_accepted_at: inner.records.first_key_value().map(|(_, r)| r.accepted_at),
        })
    }
}
