//! The DLR store: provider correlations and pending downstream receipt deliveries.
//!
//! Owned by the DlrCorrelator actor and independent of the outbound stages. Once a
//! source completes, this store alone owns its receipt.
//!
//! * [`DlrStore::hand_off`] records, at a branch's provider outcome, one correlation per
//!   provider part (keyed by destination + canonical provider id) and the receipt
//!   targets — one per submission that asked for a receipt. A failed outcome resolves at
//!   once. Repeating a handoff is harmless (a restart between provider submit and source
//!   completion resubmits and hands off again).
//! * [`DlrStore::record_receipts`] matches provider receipts. A part's final state is
//!   accepted once; when every part is final the message resolves: DELIVRD only when
//!   every provider part is delivered, otherwise the first final failure. Resolution
//!   creates one pending delivery per receipt target. A receipt whose id is not (yet)
//!   correlated is kept as an orphan for a while and matched by a later handoff.
//! * Deliveries are claimed with a lease and an attempt number; a result reported with a
//!   stale attempt is ignored (fencing).
//! * Inbound (MO) messages from providers are deliveries too (see [`crate::inbound`]):
//!   [`DlrWrite::inbound`] stores a routed one, [`DlrWrite::inbound_parts`] holds a
//!   multipart message's parts until [`DlrStore::due_inbound_groups`] or the step's
//!   [`DlrWriteOutcome::complete_groups`] says its group is ready to be written.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::backend::Backend;
use crate::error::DlrError;
use crate::ids::{MessageId, Timestamp, UnitId};
use crate::inbound::{InboundGroup, InboundMessage, InboundPart, RoutedInbound};
use crate::record::Address;

/// Final delivery states a receipt can report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DlrState {
    Delivered,
    Expired,
    Deleted,
    Undeliverable,
    Unknown,
    /// The provider's receipt said REJECTD.
    Rejected,
    /// The provider refused the submission itself (an error submit_sm_resp). Receipts
    /// show it as REJECTD like [`DlrState::Rejected`]; it is its own state because
    /// Kannel's `dlr-url` reports the two differently (16 and 2).
    Refused,
}

impl DlrState {
    pub fn is_success(self) -> bool {
        matches!(self, DlrState::Delivered)
    }
}

/// Where a receipt goes back to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReplyPath {
    /// A `deliver_sm` to a bound receiver/transceiver session of the account.
    Smpp,
    /// An HTTP POST to this URL.
    Http { url: String },
    /// A Kannel `dlr-url`: an HTTP GET of the URL with its `%` escape codes filled in,
    /// for the report types in `mask` (Kannel's `dlr-mask`).
    Kannel { url: String, mask: u8 },
}

impl ReplyPath {
    /// The URL an HTTP delivery goes to; `None` for SMPP.
    pub fn url(&self) -> Option<&str> {
        match self {
            ReplyPath::Smpp => None,
            ReplyPath::Http { url } | ReplyPath::Kannel { url, .. } => Some(url),
        }
    }
}

/// One submission that is owed a receipt; for an inbound message, whom it goes to
/// (`submit_id` is the inbound message's id, `source` the subscriber, `destination` the
/// number the subscriber wrote to, `submitted_at` its arrival).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReceiptTarget {
    /// The id this submission was acknowledged with; the receipt carries it.
    pub submit_id: MessageId,
    pub account: String,
    pub reply: ReplyPath,
    /// Addresses of the original submission (a deliver_sm receipt swaps them).
    pub source: Address,
    pub destination: Address,
    pub submitted_at: Timestamp,
    /// registered_delivery asked for a receipt on failure only.
    pub failure_only: bool,
}

/// A final state with its error code and time.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReceiptOutcome {
    pub state: DlrState,
    /// Receipt `err:` field, usually 3 digits.
    pub error: String,
    pub done_at: Timestamp,
}

/// The provider outcome of a branch, as handed to the DLR store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HandoffOutcome {
    /// Canonical provider ids, one per provider part.
    Submitted { provider_keys: Vec<String> },
    /// The branch failed without reaching the provider's receipt flow.
    Failed(ReceiptOutcome),
}

/// Correlation state for one branch at its provider outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handoff {
    pub unit: UnitId,
    pub branch: u16,
    /// Destination name the ids belong to ("" when the branch never reached one).
    pub destination: String,
    pub outcome: HandoffOutcome,
    pub targets: Vec<ReceiptTarget>,
    pub handed_off_at: Timestamp,
}

/// A final receipt from a provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderReceipt {
    pub destination: String,
    /// Candidate canonical ids, best first (see protocols' id formats).
    pub keys: Vec<String>,
    pub outcome: ReceiptOutcome,
}

/// What happened to one provider receipt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReceiptMatch {
    /// Correlated; `resolved` when it completed the message's state.
    Matched { unit: UnitId, resolved: bool },
    /// Correlated, but that part's final state was already recorded.
    Duplicate { unit: UnitId },
    /// Not correlated (yet): kept for the orphan retention, matched by a later handoff.
    Orphaned,
}

/// Identity of a pending downstream delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DeliveryId(pub u64);

/// What a delivery carries downstream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeliveryContent {
    /// A receipt: the message's final state.
    Receipt(ReceiptOutcome),
    /// An inbound (MO) message.
    Inbound(Box<InboundMessage>),
    /// A Kannel `dlr-url` report about a message still on its way.
    Progress(ProgressReport),
}

/// Kannel report type 8: the provider accepted the submission (its submit_sm_resp).
pub const PROGRESS_ACCEPTED: u8 = 8;
/// Kannel report type 4: the provider's receipt said the message is still on its way
/// (ENROUTE, ACCEPTD, BUFFRED).
pub const PROGRESS_BUFFERED: u8 = 4;

/// A report to a Kannel `dlr-url` before the message's final receipt: created when the
/// handoff recording the provider's ids is stored (type 8), or when an intermediate
/// receipt matches a message awaiting its final one (type 4), for the receipt targets
/// whose `dlr-mask` asks for that type. Stored, claimed and retried like a receipt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgressReport {
    /// [`PROGRESS_ACCEPTED`] or [`PROGRESS_BUFFERED`].
    pub kind: u8,
    /// Kannel's `%A`: `ACK/` for type 8, the provider's receipt text for type 4.
    pub text: String,
    /// The destination the message went to (Kannel's `%i`, the smsc-id).
    pub smsc: String,
    /// The provider's message id (Kannel's `%F`).
    pub foreign_id: String,
    pub at: Timestamp,
}

/// A provider receipt that reports no final state (ENROUTE, ACCEPTD, BUFFRED, or an
/// intermediate message_state). It changes nothing of the message's state, and is
/// reported to the `dlr-url`s whose mask has 4 while the message awaits its final
/// receipt. One that matches no correlation is not kept (no orphan): the step names it in
/// [`DlrWriteOutcome::unmatched_intermediate`], and the caller may write it again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntermediateReceipt {
    pub destination: String,
    /// Candidate canonical ids, best first, as a [`ProviderReceipt`]'s.
    pub keys: Vec<String>,
    /// The receipt's text as the provider sent it.
    pub text: String,
    pub at: Timestamp,
}

/// The type 8 reports a handoff owes: one per Kannel target whose mask has 8, when the
/// provider accepted the submission. Every backend creates them with the handoff's new
/// correlation (not for a repeat of a stored one).
pub fn accepted_reports(h: &Handoff) -> Vec<(ReceiptTarget, DeliveryContent)> {
    let HandoffOutcome::Submitted { provider_keys } = &h.outcome else {
        return Vec::new();
    };
    h.targets
        .iter()
        .filter(|t| matches!(t.reply, ReplyPath::Kannel { mask, .. } if mask & PROGRESS_ACCEPTED != 0))
        .map(|t| {
            let report = ProgressReport {
                kind: PROGRESS_ACCEPTED,
                text: "ACK/".to_string(),
                smsc: h.destination.clone(),
                foreign_id: provider_keys.first().cloned().unwrap_or_default(),
                at: h.handed_off_at,
            };
            (t.clone(), DeliveryContent::Progress(report))
        })
        .collect()
}

/// The type 4 report an intermediate receipt owes `target`, when its mask asks for it.
/// `key`: the provider id it matched.
pub fn buffered_report(target: &ReceiptTarget, r: &IntermediateReceipt, key: &str) -> Option<DeliveryContent> {
    matches!(target.reply, ReplyPath::Kannel { mask, .. } if mask & PROGRESS_BUFFERED != 0).then(|| {
        DeliveryContent::Progress(ProgressReport {
            kind: PROGRESS_BUFFERED,
            text: r.text.clone(),
            smsc: r.destination.clone(),
            foreign_id: key.to_string(),
            at: r.at,
        })
    })
}

/// A receipt or an inbound message to deliver downstream, as claimed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub id: DeliveryId,
    /// Incremented by every claim; a result must quote it.
    pub attempt: u32,
    pub target: ReceiptTarget,
    pub content: DeliveryContent,
    pub created_at: Timestamp,
    /// After this the delivery is given up (dead).
    pub expires_at: Timestamp,
}

/// Which due deliveries a claim may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimScope<'a> {
    /// Every due delivery: one process serves the store.
    All,
    /// HTTP deliveries, and the SMPP deliveries of these accounts only. With several
    /// processes on one store, each claims the SMPP receipts of the accounts bound to
    /// it: a receipt goes to the process its ESME is bound to, and one whose ESME is
    /// bound nowhere waits, claimed by none, until it binds somewhere.
    SmppAccounts(&'a [String]),
}

impl ClaimScope<'_> {
    /// Whether a delivery (SMPP to `smpp_account`, or HTTP when `None`) is in scope.
    pub fn takes(&self, smpp_account: Option<&str>) -> bool {
        match (self, smpp_account) {
            (ClaimScope::All, _) | (_, None) => true,
            (ClaimScope::SmppAccounts(accounts), Some(a)) => accounts.iter().any(|x| x == a),
        }
    }
}

/// The result of one delivery attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryResult {
    Delivered,
    /// Try again at this time (also used to park an SMPP receipt until its account binds).
    Retry {
        at: Timestamp,
    },
    /// Give up.
    Dead,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeliveryFinish {
    pub id: DeliveryId,
    pub attempt: u32,
    pub result: DeliveryResult,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DlrStats {
    /// Messages (branches) waiting for provider receipts.
    pub awaiting_receipts: u64,
    /// Provider-id correlations held.
    pub correlations: u64,
    pub pending_deliveries: u64,
    pub oldest_pending_delivery: Option<Timestamp>,
    pub orphans: u64,
    /// Parts of multipart inbound messages held until their group is written.
    pub inbound_parts: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpiryReport {
    /// Branches whose receipts never all arrived within retention.
    pub unresolved: u64,
    /// Deliveries given up after retention.
    pub dead_deliveries: u64,
    pub orphans: u64,
}

/// Retention settings every backend honours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DlrRetention {
    /// How long a correlation and an undelivered receipt are kept.
    pub retention: Duration,
    /// How long an uncorrelated receipt waits for its handoff.
    pub orphan_retention: Duration,
}

/// One step of the correlator's writes, batched while the previous step was being
/// committed: handoffs first, then intermediate receipts, then final provider receipts,
/// then delivery results, then inbound parts, then routed inbound messages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DlrWrite {
    pub handoffs: Vec<Handoff>,
    /// Intermediate receipts: type 4 reports for the Kannel targets that ask for them.
    pub intermediate: Vec<IntermediateReceipt>,
    pub receipts: Vec<ProviderReceipt>,
    pub finishes: Vec<DeliveryFinish>,
    /// Parts of multipart inbound messages, placed in their groups (see
    /// [`crate::inbound`]).
    pub inbound_parts: Vec<InboundPart>,
    /// Inbound messages to deliver, one delivery each (due at once; claimed in the step
    /// when `claim_created` asks, like a receipt's). One assembled from a group removes
    /// the group in the same step, and is not created if the group is gone.
    pub inbound: Vec<RoutedInbound>,
    /// Multipart groups to remove without a delivery (no route takes the message),
    /// after `inbound`; a group already gone is ignored.
    pub inbound_dropped: Vec<u64>,
    /// Claim the deliveries this step creates for the caller, as [`DlrStore::claim_due`]
    /// would (attempt 1, leased), in the same write. A backend may ignore it (see
    /// [`DlrCapabilities::claims_in_writes`]); the deliveries are then due at once and the
    /// next `claim_due` takes them.
    pub claim_created: Option<ClaimCreated>,
}

/// See [`DlrWrite::claim_created`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClaimCreated {
    pub lease: Duration,
    /// At most this many; the rest stay due.
    pub limit: usize,
}

impl DlrWrite {
    pub fn is_empty(&self) -> bool {
        self.handoffs.is_empty()
            && self.intermediate.is_empty()
            && self.receipts.is_empty()
            && self.finishes.is_empty()
            && self.inbound_parts.is_empty()
            && self.inbound.is_empty()
            && self.inbound_dropped.is_empty()
    }
}

/// What [`DlrStore::apply`] did with each part of a [`DlrWrite`]. A backend that commits
/// the whole step in one transaction reports the same outcome for every part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DlrWriteOutcome {
    pub handoffs: Result<(), DlrError>,
    /// One result per final receipt, in order; `Err` also when the intermediate receipts
    /// could not be stored.
    pub receipts: Result<Vec<ReceiptMatch>, DlrError>,
    pub finishes: Result<(), DlrError>,
    /// The inbound parts and messages: stored (durable as the store is) when `Ok`. The
    /// provider's acknowledgement waits for it. When `Err`, no part and no message
    /// without a group was stored (the provider resends them); the writes and drops of
    /// groups may have been applied all the same (a bounded store applies them because
    /// they make room), which is harmless: writing a group again creates nothing.
    pub inbound: Result<(), DlrError>,
    /// Groups the step's parts made complete, or closed (a conflicting part), as stored
    /// after the step: the caller writes each as a [`RoutedInbound`] with its `group`.
    /// Empty when the step failed.
    pub complete_groups: Vec<InboundGroup>,
    /// Deliveries the step created and claimed for the caller (see
    /// [`DlrWrite::claim_created`]); `claim_due` does not return them until their lease
    /// lapses. Empty when the step failed or the backend does not claim in its writes.
    pub claimed: Vec<Delivery>,
    /// The positions in [`DlrWrite::intermediate`] of the intermediate receipts that
    /// matched no correlation (their handoff may not be stored yet). Empty when the step
    /// failed.
    pub unmatched_intermediate: Vec<usize>,
}

impl DlrWriteOutcome {
    /// A step committed as one transaction.
    pub fn committed(receipts: Vec<ReceiptMatch>, claimed: Vec<Delivery>) -> Self {
        Self {
            handoffs: Ok(()),
            receipts: Ok(receipts),
            finishes: Ok(()),
            inbound: Ok(()),
            complete_groups: Vec::new(),
            claimed,
            unmatched_intermediate: Vec::new(),
        }
    }

    /// A step whose one transaction failed: every part failed with it.
    pub fn failed(e: DlrError) -> Self {
        Self {
            handoffs: Err(e.clone()),
            receipts: Err(e.clone()),
            finishes: Err(e.clone()),
            inbound: Err(e),
            complete_groups: Vec::new(),
            claimed: Vec::new(),
            unmatched_intermediate: Vec::new(),
        }
    }
}

/// What a DLR store is, and how the correlator drives it.
#[derive(Clone, Debug)]
pub struct DlrCapabilities {
    pub backend: Backend,
    /// Correlations and pending deliveries survive a process restart.
    pub durable: bool,
    /// The reservation gate of a bounded store (memory); `None` when unbounded.
    pub reservations: Option<Arc<ReceiptReservations>>,
    /// Whether [`DlrStore::apply`] honours [`DlrWrite::claim_created`]: then a step that
    /// claimed fewer than its limit left none of the deliveries it created unclaimed.
    pub claims_in_writes: bool,
    /// How many [`DlrStore::apply`] calls the correlator may run at once: one for a
    /// single-writer store, more where concurrent transactions commit in parallel.
    pub write_concurrency: usize,
}

impl DlrCapabilities {
    /// A store with one writer that does not claim in its writes and takes no
    /// reservations.
    pub fn single_writer(backend: Backend, durable: bool) -> Self {
        Self {
            backend,
            durable,
            reservations: None,
            claims_in_writes: false,
            write_concurrency: 1,
        }
    }
}

/// The DLR store contract: one write (a step of handoffs, receipts and delivery
/// results), the claims and maintenance the correlator runs beside it, and stats.
/// Implementations: memory (bounded), file (redb), postgresql.
#[async_trait]
pub trait DlrStore: Send + Sync + 'static {
    fn capabilities(&self) -> DlrCapabilities;

    /// Apply a batched step, in this order (a receipt may match a handoff of the same
    /// step); durable parts are durable when it returns:
    ///
    /// - handoffs: provider outcomes. Idempotent per (unit, branch): a repeat with the
    ///   same provider ids changes nothing; a repeat with new ids (the branch was
    ///   resubmitted) replaces the expected parts while earlier ids keep matching. A
    ///   branch's first submitted handoff creates its [`accepted_reports`];
    /// - intermediate receipts: each matched like a final one, reported to the Kannel
    ///   targets of a message still awaiting its final receipt (see
    ///   [`IntermediateReceipt`]), nothing else changed;
    /// - final provider receipts, matched: one result per receipt, in order;
    /// - delivery results; results quoting a stale attempt are ignored;
    /// - inbound parts, each placed in its group by the rule in [`crate::inbound`];
    ///   groups made complete or closed are returned in `complete_groups`;
    /// - routed inbound messages, one delivery each (a delivery of an assembled group
    ///   only if the group was still held, and the group removed);
    /// - dropped groups, removed.
    ///
    /// A backend commits the step together where it can, which is what lets the
    /// correlator keep up: its writes coalesce while one is being committed, so commits
    /// per second stay bounded by the disk or database, not by the message rate.
    async fn apply(&self, step: DlrWrite) -> DlrWriteOutcome;

    /// Claim up to `limit` deliveries due at `now` within `scope`; each claim increments
    /// its attempt and hides it for `lease` (a crashed deliverer's claim lapses by
    /// itself).
    async fn claim_due(
        &self,
        now: Timestamp,
        lease: Duration,
        limit: usize,
        scope: ClaimScope<'_>,
    ) -> Result<Vec<Delivery>, DlrError>;

    /// Make every SMPP delivery of `account` due now (it just bound). Returns how many.
    async fn wake_account(&self, account: &str, now: Timestamp) -> Result<u64, DlrError>;

    /// Drop correlations, orphans and deliveries past retention, at most `limit` of each.
    /// An inbound delivery past retention is dead like a receipt's (counted in
    /// `dead_deliveries`). Multipart groups are never dropped here: past their deadline
    /// they are due, and the caller writes them, incomplete.
    async fn expire(&self, now: Timestamp, limit: usize) -> Result<ExpiryReport, DlrError>;

    /// Multipart inbound groups due at `now` (complete, closed, or past their deadline),
    /// at most `limit`: complete and closed ones first, then the others oldest deadline
    /// first. Those a crash or a lost step left behind, and those whose last part never
    /// came. Reading changes nothing; the caller writes each as a [`RoutedInbound`] with
    /// its `group`. Found through an index on the due time, never a scan of every group.
    async fn due_inbound_groups(&self, now: Timestamp, limit: usize) -> Result<Vec<InboundGroup>, DlrError>;

    async fn stats(&self) -> Result<DlrStats, DlrError>;
}

/// Capacity reservations of a bounded DLR store.
///
/// The memory DLR store holds at most `capacity` outstanding receipts. A receipt is
/// reserved when its submission is admitted (by Ingress, before acknowledging), so a
/// DLR-requesting submission that cannot be given a receipt is refused instead of
/// accepted silently unreceipted. The DLR store releases a reservation when that receipt
/// is delivered, skipped (failure-only and delivered) or given up.
///
/// Inbound messages share the bound: the store itself reserves one per multipart part it
/// holds and one per inbound delivery, in the step that stores them (refusing the step's
/// inbound messages when full), and releases them when the delivery ends or a group's
/// parts become its one delivery.
#[derive(Debug)]
pub struct ReceiptReservations {
    capacity: u64,
    held: AtomicU64,
}

impl ReceiptReservations {
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            held: AtomicU64::new(0),
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Reserve `n` receipts, all or nothing.
    pub fn try_reserve(&self, n: u64) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                let next = held.checked_add(n)?;
                (next <= self.capacity).then_some(next)
            })
            .is_ok()
    }

    /// Reserve regardless of capacity: receipts already owed (recovered from a durable
    /// pending stage at startup) must be tracked even if that overfills the store; new
    /// admissions are then refused until it drains.
    pub fn force_reserve(&self, n: u64) {
        self.held.fetch_add(n, Ordering::AcqRel);
    }

    pub fn release(&self, n: u64) {
        let _ = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| Some(held.saturating_sub(n)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_all_or_nothing() {
        let r = ReceiptReservations::new(3);
        assert!(r.try_reserve(2));
        assert!(!r.try_reserve(2));
        assert!(r.try_reserve(1));
        assert_eq!(r.held(), 3);
        r.release(5);
        assert_eq!(r.held(), 0);
        r.force_reserve(4);
        assert!(!r.try_reserve(1));
    }
}
