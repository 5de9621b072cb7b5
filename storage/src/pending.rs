//! The pending stage: accepted sources, kept until every branch and any DLR handoff
//! is terminal.
//!
//! Owned by the Ingress actor. Its one write is a batch: one call admits many messages
//! and completes many sources in one durable commit (for durable backends), for many
//! acknowledgements — that is how a durable profile reaches tens of thousands of
//! messages per second on a disk that does a few thousand fsyncs.
//!
//! Multipart parts are admitted one by one. The store tracks each group; when its last
//! part arrives the group becomes one *ready unit*. Single messages are ready at once.
//! A part that collides with an open group of an earlier message is placed by the rules
//! of [`crate::reassembly`].
//! Ready units get a [`ReadySeq`] in the lane of their route priority, so selection can
//! walk each lane incrementally with a cursor, urgent lanes first (a multipart group takes
//! the lane of the part that completes it; an expired group's failure, lane 0); an incomplete group whose saved deadline passes becomes a ready unit with
//! [`Disposition::Expired`], so it flows through the same pipeline to its failure
//! receipt and source completion.

use std::sync::Arc;

use async_trait::async_trait;

use crate::backend::StageCapabilities;
use crate::error::PendingError;
use crate::ids::{MessageId, ReadyCursor, ReadySeq, Timestamp, UnitId};
use crate::record::PendingRecord;

/// The result of admitting one record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdmitOutcome {
    /// Stored as promised; acknowledge with the record's id.
    Admitted,
    /// Stored as promised, as the first part of a new message: the open multipart group
    /// that had its reference was closed as incomplete (see [`crate::reassembly`]).
    /// Acknowledge with the record's id.
    Superseding,
    /// The account already submitted this idempotency key (and it is still retained),
    /// or this multipart part is a retransmission of one in its open group: nothing new
    /// was stored; answer with the earlier id.
    Duplicate { existing: MessageId },
    /// The account already used this idempotency key (still retained) for a different
    /// message ([`PendingRecord::submission_digest`](crate::record::PendingRecord::submission_digest)
    /// differs): nothing was stored. Answer 409 naming the key; `existing` is the first
    /// message's id.
    KeyReused { existing: MessageId },
    /// Not stored: the stage is at its configured capacity. Answer ESME_RMSGQFUL / 503.
    Full,
}

/// What should happen to a ready unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Disposition {
    /// Route and deliver it.
    Deliver,
    /// A multipart group that did not complete before its deadline: fail it (with a
    /// failure receipt to each part that asked for one) and complete its sources.
    Expired,
}

/// A routable unit: one message, or a multipart group's parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    pub id: UnitId,
    pub disposition: Disposition,
    /// Parts in sequence order (a single message has one). If a position holds more
    /// than one record (a retransmitted part stored as a record of its own), the later
    /// ones follow the first: each is owed a receipt, but the payload is not sent twice.
    pub parts: Vec<PendingRecord>,
}

impl Unit {
    /// Ids of every source record in the unit (what completion removes).
    pub fn member_ids(&self) -> Vec<MessageId> {
        self.parts.iter().map(|p| p.id).collect()
    }

    /// Does any submission in the unit expect a receipt?
    pub fn wants_receipt(&self) -> bool {
        self.parts.iter().any(|p| p.wants_receipt())
    }

    /// The parts whose payload makes up the message text: the first record of each
    /// sequence number (repeats excluded).
    pub fn distinct_parts(&self) -> impl Iterator<Item = &PendingRecord> {
        let mut last_seq = None;
        self.parts.iter().filter(move |p| {
            let seq = p.part.map(|i| i.seq);
            if seq.is_some() && seq == last_seq {
                return false;
            }
            last_seq = seq;
            true
        })
    }

    /// The whole message's user data, parts concatenated in order.
    pub fn payload(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for p in self.distinct_parts() {
            out.extend_from_slice(&p.payload);
        }
        out
    }
}

/// A unit and its place in the ready order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadyUnit {
    pub seq: ReadySeq,
    pub unit: Unit,
}

/// Counts for `/metrics`, `/admin/actors` and `sendium inspect`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PendingStats {
    /// Source records (messages and parts) held.
    pub records: u64,
    /// Units ready for selection or in processing.
    pub ready_units: u64,
    /// Multipart groups still waiting for parts.
    pub incomplete_groups: u64,
    /// Records whose submission asked for a receipt.
    pub receipt_requests: u64,
    /// Acceptance time of the oldest record.
    pub oldest_accepted_at: Option<Timestamp>,
}

/// What a pending store is, and how its commits are best driven.
#[derive(Clone)]
pub struct PendingCapabilities {
    pub stage: StageCapabilities,
    /// A writer that commits on the calling thread, for a backend whose commit blocks it
    /// anyway (file). The Ingress then runs its writer on a thread of its own and spares
    /// every commit the two thread hand-offs of an async call — time each client waiting
    /// for an acknowledgement pays. `None`: use [`PendingStore::commit`].
    pub blocking_writer: Option<Arc<dyn BlockingPendingWriter>>,
}

/// The pending stage contract: one write, the reads selection and restore use, and the
/// expiry of multipart groups. Implementations: memory, file (redb).
#[async_trait]
pub trait PendingStore: Send + Sync + 'static {
    fn capabilities(&self) -> PendingCapabilities;

    /// Complete units (remove them and their source records; unknown ids are ignored) and
    /// admit a batch, in one durable transition (for a durable backend). Capacity is
    /// decided after the completions. On `Ok`, each outcome says what happened to the
    /// record at the same index of `admit`, and every admitted record is stored as
    /// durably as the backend promises. On `Err`, nothing in the batch may be
    /// acknowledged.
    async fn commit(&self, admit: Vec<PendingRecord>, complete: &[UnitId]) -> Result<Vec<AdmitOutcome>, PendingError>;

    /// Up to `limit` ready units after `after`'s cursor of their lane, highest lane first
    /// and in ready order within a lane, for selection. A
    /// store whose database also holds the router-queue and routed-work stages
    /// (postgresql) returns only units neither of them holds, and only of the partitions
    /// this process works on: there, what to select is decided by the database, which is
    /// what several processes sharing it need.
    async fn ready_after(&self, after: ReadyCursor, limit: usize) -> Result<Vec<ReadyUnit>, PendingError>;

    /// The units with these ids that are still pending (missing ids are skipped: their
    /// sources completed). Used to restore staged and routed work after a restart.
    async fn units(&self, ids: &[UnitId]) -> Result<Vec<ReadyUnit>, PendingError>;

    /// Turn up to `limit` incomplete groups whose deadline is at or before `now` into
    /// ready units with [`Disposition::Expired`]. Returns how many groups expired.
    async fn expire_groups(&self, now: Timestamp, limit: usize) -> Result<usize, PendingError>;

    async fn stats(&self) -> Result<PendingStats, PendingError>;
}

/// [`PendingStore::commit`] as a blocking call (see [`PendingCapabilities::blocking_writer`]).
/// Never call it on an async runtime's worker thread.
pub trait BlockingPendingWriter: Send + Sync + 'static {
    /// [`PendingStore::commit`]. If the admissions' outcomes are durable before the
    /// commit's remaining work is done, `durable` is called with them then, so the
    /// clients can be answered without waiting for that work (the file store answers
    /// once the journal frame is synced, before applying the frame to its file); the
    /// same outcomes are returned either way. Once `durable` has been called its
    /// outcomes stand: if the store then fails while finishing the commit (a panic in
    /// the file store's apply, which invalidates the file so a reopen replays the frame),
    /// the commit returns that error, and the caller must not answer the clients again.
    fn commit(
        &self,
        admit: Vec<PendingRecord>,
        complete: &[UnitId],
        durable: &mut dyn FnMut(&[AdmitOutcome]),
    ) -> Result<Vec<AdmitOutcome>, PendingError>;

    /// Nothing has been handed to the writer for a while: do deferred work now, while
    /// no client waits for it (the file store checkpoints its journal).
    fn idle(&self) {}
}
