//! DlrCorrelator: owns the DLR store.
//!
//! It takes the Router's handoffs (provider correlations and receipt targets, one per
//! branch at its provider outcome), matches the provider receipts the workers forward,
//! and delivers each message's receipts downstream: as deliver_sm to a bound
//! receiver/transceiver session of the originating account (held until one binds,
//! within retention), or as an HTTP callback with retries. A provider's receipt is
//! acknowledged to the provider only after the store took it, so with a durable DLR
//! store a crash never loses an acknowledged receipt.
//!
//! Inbound (MO) messages take the same road (see [`crate::inbound`]): stored in a step,
//! acknowledged to the provider after it, and delivered like receipts. A multipart
//! message's parts are held in the store; a step that completes a group, or a tick that
//! finds groups past their deadline, routes the assembled message and writes it in the
//! next step.

pub mod deliver;
mod handover;
pub mod kannel;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use sendium_protocols::callback::CallbackTargets;
use sendium_protocols::smpp::client::{Acker, DeliverAck};
use sendium_storage::failpoint;
use sendium_storage::ids::IdMap;
use sendium_storage::{
    ClaimCreated, ClaimScope, Delivery, DeliveryContent, DeliveryFinish, DeliveryId, DeliveryResult, DlrCapabilities,
    DlrStats, DlrStore, DlrWrite, DlrWriteOutcome, Handoff, HandoffOutcome, InboundGroup, InboundPart,
    IntermediateReceipt, ProviderReceipt, ReceiptMatch, ReplyPath, RoutedInbound, Timestamp,
};

use crate::context::Shared;
use crate::inbound::MoEvent;
use crate::router::{BranchKey, RouterMsg};
use handover::Completion;
pub use handover::{Handover, Report};

/// Provider deliver_sm acknowledgements, sent once the receipts are stored.
///
/// Holds an [`Acker`], not a client handle: acknowledgements pending for a crashed
/// worker's sessions must not keep those sessions alive.
///
/// Dropped unanswered (sent while no correlator was running, or left in the mailbox of
/// one that panicked), they answer with a temporary error, so the provider keeps the
/// receipts and sends them again. Unanswered, a deliver_sm would hold a slot of the
/// provider's window until its response timer ran out.
/// For an HTTP provider's posted receipts the answer is the HTTP response, waiting on a
/// oneshot: `true` once stored, `false` for a 503 the provider retries.
pub struct ReceiptAcks(Option<AckTo>);

enum AckTo {
    Smpp { client: Acker, acks: Vec<DeliverAck> },
    Http(tokio::sync::oneshot::Sender<bool>),
}

/// ESME_RX_T_APPN: temporary application error — the SMSC keeps the receipt and
/// sends it again later.
const TEMPORARY_ERROR: u32 = 0x64;

impl ReceiptAcks {
    pub fn new(client: Acker, acks: Vec<DeliverAck>) -> Self {
        Self(Some(AckTo::Smpp { client, acks }))
    }

    /// The answer to an HTTP request that posted receipts.
    pub fn http(answer: tokio::sync::oneshot::Sender<bool>) -> Self {
        Self(Some(AckTo::Http(answer)))
    }

    /// The receipts are stored.
    pub fn ok(mut self) {
        self.answer(true);
    }

    /// The receipts were not stored: the provider sends them again.
    pub fn fail(mut self) {
        self.answer(false);
    }

    fn answer(&mut self, stored: bool) {
        match self.0.take() {
            Some(AckTo::Smpp { client, acks }) => {
                let status = if stored { 0 } else { TEMPORARY_ERROR };
                client.ack(acks.into_iter().map(|a| (a, status)).collect());
            }
            Some(AckTo::Http(answer)) => {
                let _ = answer.send(stored);
            }
            None => {}
        }
    }
}

impl Drop for ReceiptAcks {
    fn drop(&mut self) {
        self.answer(false);
    }
}

/// Receipts from one destination.
pub struct ReceiptBatch {
    pub destination: String,
    pub receipts: Vec<ProviderReceipt>,
    pub acks: Option<ReceiptAcks>,
}

/// Inbound messages from one destination: whole ones routed, parts to hold.
pub struct InboundBatch {
    pub destination: String,
    pub routed: Vec<RoutedInbound>,
    pub parts: Vec<InboundPart>,
    /// Answered once the step storing them committed.
    pub acks: Option<ReceiptAcks>,
}

pub enum DlrMsg {
    HandOff(Vec<Handoff>),
    ProviderReceipts(ReceiptBatch),
    /// Intermediate provider receipts, acknowledged to the provider already: stored as
    /// type 4 reports for the Kannel targets that ask for them (see
    /// [`sendium_storage::IntermediateReceipt`]).
    Intermediate(Vec<IntermediateReceipt>),
    /// Intermediate receipts that matched no correlation, tried again (with how many
    /// times each was tried): their handoff may have been on its way.
    IntermediateAgain(Vec<(IntermediateReceipt, u8)>),
    Inbound(InboundBatch),
    /// Claim and deliver due receipts.
    DeliverDue,
    /// An account bound a receiving session: its held receipts are due now.
    AccountBound(String),
    /// A batched write step finished (from its write task), or delivery attempts did
    /// (from delivery tasks).
    Completed(Report),
    Tick,
    Status(RpcReplyPort<DlrStatus>),
}

#[derive(Clone, Debug, Default)]
pub struct DlrStatus {
    pub store: Option<DlrStats>,
    pub deliveries_in_flight: u64,
    pub reserved: Option<(u64, u64)>,
}

pub struct DlrArgs {
    pub shared: Arc<Shared>,
    pub store: Arc<dyn DlrStore>,
    pub callback_timeout: Duration,
    /// `dlr.claim-lease`.
    pub claim_lease: Duration,
    /// Where HTTP callbacks may connect.
    pub callback_targets: CallbackTargets,
    /// Reports an earlier incarnation did not read (the same one for every incarnation).
    pub handover: Arc<Handover>,
}

pub struct DlrState {
    shared: Arc<Shared>,
    store: Arc<dyn DlrStore>,
    /// What the store can do, read once: how many steps it commits at once, whether its
    /// writes claim what they create, its reservation gate.
    caps: DlrCapabilities,
    http: deliver::CallbackClient,
    /// Inbound messages' HTTP deliveries: their URLs are the operator's `[[mo-routes]]`,
    /// so the callback address restrictions do not apply.
    http_inbound: deliver::CallbackClient,
    /// Inbound deliveries in flight, with their route (for counts by route).
    inbound_in_flight: HashMap<DeliveryId, String>,
    /// Multipart groups queued or being written (not asked for again meanwhile).
    groups_writing: std::collections::HashSet<u64>,
    in_flight: usize,
    deliver_scheduled: bool,
    ticks: u64,
    /// Writes gathered while earlier steps are being committed.
    queued: Step,
    /// Steps being committed (at most the store's `write_concurrency`).
    writing: usize,
    /// This incarnation of the correlator: a step written by an earlier one (applied
    /// after a restart) is answered, but does not touch this one's write counters.
    incarnation: u64,
    /// A claimed delivery not reported back in this long becomes due again.
    lease: Duration,
    /// `dlr.callback-timeout`: the longest one HTTP attempt takes.
    callback_timeout: Duration,
    /// Callbacks in progress, over every delivery round.
    http_slots: Arc<tokio::sync::Semaphore>,
    /// When the last delivery round claimed, and whether it was full.
    last_claim: Option<(std::time::Instant, bool)>,
    /// Deliveries the steps being written may claim (counted against MAX_IN_FLIGHT).
    claimed_by_writes: usize,
    /// Provider ids handed off by the steps being written, per destination, with how
    /// many such steps hold each (destinations are configured names, provider ids are
    /// the provider's: SipHash for those).
    writing_ids: IdMap<String, HashMap<String, usize>>,
    /// Receipt batches for ids in `writing_ids`, waiting for those steps to commit.
    held_receipts: Vec<ReceiptBatch>,
    /// Intermediate receipts for ids in `writing_ids`, likewise (with their tries).
    held_intermediate: Vec<(IntermediateReceipt, u8)>,
    /// Reports of tasks an earlier incarnation started and did not read.
    handover: Arc<Handover>,
}

/// A batched write step and what to do with its outcome. The context travels with
/// the step, so a step that completes after this actor restarted is still answered.
#[derive(Default)]
struct Step {
    write: DlrWrite,
    handed_off: Vec<BranchKey>,
    receipt_batches: Vec<StepReceipts>,
    /// Inbound batches' acknowledgements, answered after the step.
    inbound_acks: Vec<ReceiptAcks>,
    /// Multipart groups the step writes or drops.
    groups: Vec<u64>,
    /// How many times each of `write.intermediate` was tried before.
    intermediate_tries: Vec<u8>,
}

/// One provider receipt batch's share of a step: where it came from, how many of the
/// step's receipts are its, and the acknowledgements owed to the provider once they are
/// stored.
struct StepReceipts {
    destination: String,
    receipts: usize,
    acks: Option<ReceiptAcks>,
}

/// The delivery results a step reports.
#[derive(Clone, Copy, Default)]
struct Finished {
    all: usize,
    delivered: u64,
    dead: u64,
}

/// A step's outcome, as the write task reports it, with what the step held (its write
/// went to the store).
pub struct AppliedStep {
    handed_off: Vec<BranchKey>,
    receipt_batches: Vec<StepReceipts>,
    inbound_acks: Vec<ReceiptAcks>,
    /// Routed inbound messages and parts the step stored.
    inbound: (usize, usize),
    groups: Vec<u64>,
    finished: Finished,
    /// How many deliveries the step was allowed to claim.
    claim_limit: usize,
    /// When the write started (the earliest its claims can have started).
    claimed_at: std::time::Instant,
    /// The incarnation that wrote it.
    incarnation: u64,
    /// The provider ids its handoffs counted in `writing_ids`.
    ids: Vec<(String, String)>,
    /// It may have created progress reports.
    progress: bool,
    /// Its intermediate receipts, with their tries before this step.
    intermediate: Vec<(IntermediateReceipt, u8)>,
    outcome: DlrWriteOutcome,
}

pub struct DlrCorrelator;

/// A branch the provider refused is stored as [`sendium_storage::DlrState::Refused`].
/// The Router hands it off as `Rejected`, the state its receipts show; a failed handoff
/// never comes from a provider's receipt, and Kannel's reports tell a refusal (16) from
/// a REJECTD receipt (2).
fn refused_as_such(h: &mut Handoff) {
    if let HandoffOutcome::Failed(outcome) = &mut h.outcome
        && outcome.state == sendium_storage::DlrState::Rejected
    {
        outcome.state = sendium_storage::DlrState::Refused;
    }
}

/// Numbers the correlator's incarnations (see `DlrState::incarnation`).
static INCARNATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Deliveries claimed per round, and at most in flight at once.
const CLAIM_BATCH: usize = 2_000;
const MAX_IN_FLIGHT: usize = 20_000;
/// Least time between a partial delivery round and the next.
const CLAIM_PACE: Duration = Duration::from_millis(10);
/// Concurrent HTTP callbacks (all rounds together).
const HTTP_CONCURRENCY: usize = 64;
/// An intermediate receipt that matched no correlation is written this many times in
/// all, this long apart: a provider may send it before the Router's handoff of the
/// message reached the store.
const INTERMEDIATE_TRIES: u8 = 5;
const INTERMEDIATE_RETRY: Duration = Duration::from_secs(1);

impl DlrState {
    /// Coalesce delivery rounds: at most one `DeliverDue` waits in the mailbox. (A send
    /// can fail while this actor is still being installed; then nothing is pending.)
    ///
    /// Rounds are paced: one that follows a partial round by less than [`CLAIM_PACE`]
    /// waits for the rest of it, so under load a claim takes the receipts resolved by
    /// many steps at once instead of one statement (or transaction) per step. After a
    /// full round the next one starts at once.
    fn schedule_delivery(&mut self) {
        if self.deliver_scheduled {
            return;
        }
        let wait = match self.last_claim {
            Some((at, false)) => CLAIM_PACE.saturating_sub(at.elapsed()),
            _ => Duration::ZERO,
        };
        if wait.is_zero() {
            self.deliver_scheduled = self.shared.dir.dlr.send(DlrMsg::DeliverDue);
        } else {
            self.deliver_scheduled = true;
            let shared = self.shared.clone();
            crate::pacing::send_after(wait, move || {
                // Without a correlator right now, its successor runs a round at start.
                let _ = shared.dir.dlr.send(DlrMsg::DeliverDue);
            });
        }
    }

    fn queue_handoffs(&mut self, mut batch: Vec<Handoff>) {
        for h in &mut batch {
            refused_as_such(h);
        }
        self.queued.handed_off.extend(batch.iter().map(|h| BranchKey {
            unit: h.unit,
            branch: h.branch,
        }));
        self.queued.write.handoffs.extend(batch);
        self.write_queued();
    }

    /// Queue a provider receipt batch for the next step — unless one of its receipts is
    /// for an id whose handoff a step is committing right now on another connection
    /// (PostgreSQL runs steps in parallel). Written beside that step, the receipt would
    /// find no correlation yet, try to store itself as an orphan, wait for the other
    /// transaction's lock on the id, and be redone: a writer stalled for a whole commit.
    /// Held until that step is applied, it goes in the next step and matches at once.
    fn queue_receipts(&mut self, batch: ReceiptBatch) {
        if !self.writing_ids.is_empty()
            && batch.receipts.iter().any(|r| {
                self.writing_ids
                    .get(&r.destination)
                    .is_some_and(|ids| r.keys.iter().any(|k| ids.contains_key(k)))
            })
        {
            self.held_receipts.push(batch);
            return;
        }
        let n = batch.receipts.len();
        self.queued.write.receipts.extend(batch.receipts);
        self.queued.receipt_batches.push(StepReceipts {
            destination: batch.destination,
            receipts: n,
            acks: batch.acks,
        });
        self.write_queued();
    }

    /// Queue intermediate receipts for the next step, holding those for an id a step is
    /// committing right now (as [`Self::queue_receipts`] does: written beside that step,
    /// they would not find its correlation, and be dropped).
    fn queue_intermediate(&mut self, batch: Vec<(IntermediateReceipt, u8)>) {
        for (r, tries) in batch {
            let writing = self
                .writing_ids
                .get(&r.destination)
                .is_some_and(|ids| r.keys.iter().any(|k| ids.contains_key(k)));
            if writing {
                self.held_intermediate.push((r, tries));
            } else {
                self.queued.write.intermediate.push(r);
                self.queued.intermediate_tries.push(tries);
            }
        }
        self.write_queued();
    }

    /// Try again, a while later, the step's intermediate receipts that matched nothing
    /// (or were not stored), up to [`INTERMEDIATE_TRIES`] writes each.
    fn retry_unmatched(&self, intermediate: &[(IntermediateReceipt, u8)], unmatched: &[usize]) {
        let again: Vec<(IntermediateReceipt, u8)> = unmatched
            .iter()
            .filter_map(|&i| intermediate.get(i))
            .filter(|(_, tries)| tries.saturating_add(1) < INTERMEDIATE_TRIES)
            .map(|(r, tries)| (r.clone(), tries.saturating_add(1)))
            .collect();
        if again.is_empty() {
            return;
        }
        let shared = self.shared.clone();
        tokio::spawn(async move {
            tokio::time::sleep(INTERMEDIATE_RETRY).await;
            shared.dir.dlr.send(DlrMsg::IntermediateAgain(again));
        });
    }

    fn queue_finishes(&mut self, results: Vec<DeliveryFinish>) {
        for r in &results {
            if let Some(route) = self.inbound_in_flight.remove(&r.id) {
                match r.result {
                    DeliveryResult::Delivered => self.shared.mo.counts().add(MoEvent::Delivered, &route, 1),
                    DeliveryResult::Dead => self.shared.mo.counts().add(MoEvent::Dead, &route, 1),
                    DeliveryResult::Retry { .. } => {}
                }
            }
        }
        self.queued.write.finishes.extend(results);
        self.write_queued();
    }

    fn queue_inbound(&mut self, batch: InboundBatch) {
        for r in &batch.routed {
            self.shared.mo.counts().add(MoEvent::Routed, &r.message.route, 1);
        }
        self.queued.write.inbound.extend(batch.routed);
        self.queued.write.inbound_parts.extend(batch.parts);
        if let Some(acks) = batch.acks {
            self.queued.inbound_acks.push(acks);
        }
        self.write_queued();
    }

    /// Multipart groups the store says are ready: each whole message routed and written
    /// with its group, or its group dropped when no rule takes the whole message.
    fn queue_groups(&mut self, groups: Vec<InboundGroup>) {
        let mo = self.shared.mo.current();
        for group in groups {
            if !self.groups_writing.insert(group.no) {
                continue;
            }
            self.queued.groups.push(group.no);
            match crate::inbound::route_group(&mo, &group) {
                Some(routed) => {
                    let counts = self.shared.mo.counts();
                    counts.add(MoEvent::Routed, &routed.message.route, 1);
                    if routed.message.incomplete {
                        counts.add(MoEvent::Incomplete, &routed.message.route, 1);
                    }
                    self.queued.write.inbound.push(routed);
                }
                None => {
                    self.shared
                        .mo
                        .counts()
                        .add(MoEvent::Unrouted, &group.key.from_destination, 1);
                    tracing::info!(
                        destination = %group.key.from_destination,
                        "multipart inbound message matches no [[mo-routes]] entry; dropped"
                    );
                    self.queued.write.inbound_dropped.push(group.no);
                }
            }
        }
        self.write_queued();
    }

    /// Start committing what is queued, unless the store is already writing as many
    /// steps as it takes at once: then the queue grows and goes as one step later
    /// (group commit).
    fn write_queued(&mut self) {
        if self.queued.write.is_empty() || self.writing >= self.caps.write_concurrency.max(1) {
            return;
        }
        let Step {
            mut write,
            handed_off,
            receipt_batches,
            inbound_acks,
            groups,
            intermediate_tries,
        } = std::mem::take(&mut self.queued);
        let intermediate: Vec<(IntermediateReceipt, u8)> =
            write.intermediate.iter().cloned().zip(intermediate_tries).collect();
        let inbound = (write.inbound.len(), write.inbound_parts.len());
        // What the step resolves is claimed in the same write where the store can (one
        // statement less per receipt), within what may be in flight: each step writing
        // at once gets its share of the room left.
        let room =
            MAX_IN_FLIGHT.saturating_sub(self.in_flight + self.claimed_by_writes) / self.caps.write_concurrency.max(1);
        let limit = if self.caps.claims_in_writes {
            room.min(CLAIM_BATCH)
        } else {
            0
        };
        if limit > 0 {
            write.claim_created = Some(ClaimCreated {
                lease: self.lease,
                limit,
            });
            self.claimed_by_writes += limit;
        }
        let count = |r: DeliveryResult| write.finishes.iter().filter(|f| f.result == r).count() as u64;
        let finished = Finished {
            all: write.finishes.len(),
            delivered: count(DeliveryResult::Delivered),
            dead: count(DeliveryResult::Dead),
        };
        self.writing += 1;
        // Only worth tracking where steps overlap; one writer commits them in turn.
        let mut ids: Vec<(String, String)> = Vec::new();
        if self.caps.write_concurrency > 1 {
            for h in &write.handoffs {
                if let HandoffOutcome::Submitted { provider_keys } = &h.outcome {
                    let held = self.writing_ids.entry(h.destination.clone()).or_default();
                    for k in provider_keys {
                        *held.entry(k.clone()).or_insert(0) += 1;
                        ids.push((h.destination.clone(), k.clone()));
                    }
                }
            }
        }
        let store = self.store.clone();
        let shared = self.shared.clone();
        let incarnation = self.incarnation;
        let handover = self.handover.clone();
        // Progress reports the step may create are not all claimed in the write (the
        // PostgreSQL store leaves them due): a claim round after it sends them.
        let progress = !write.intermediate.is_empty() || write.handoffs.iter().any(kannel::owes_accepted);
        tokio::spawn(async move {
            // Before the write: a lease the store grants in it ends no earlier than this
            // plus the lease, which is what the callback deadline is counted from.
            let claimed_at = std::time::Instant::now();
            let outcome = store.apply(write).await;
            let step = Box::new(AppliedStep {
                handed_off,
                receipt_batches,
                inbound_acks,
                inbound,
                groups,
                finished,
                claim_limit: limit,
                claimed_at,
                incarnation,
                ids,
                progress,
                intermediate,
                outcome,
            });
            shared
                .dir
                .dlr
                .send(DlrMsg::Completed(Report::new(Completion::Applied(step), &handover)));
        });
        // With `=panic`: the correlator dies while its step is being committed.
        failpoint::hit("dlr-step-started");
    }

    fn completed(&mut self, done: Completion) {
        match done {
            Completion::Applied(step) => self.applied(*step),
            Completion::Delivered { incarnation, results } => {
                if incarnation == self.incarnation {
                    self.in_flight = self.in_flight.saturating_sub(results.len());
                }
                self.queue_finishes(results);
            }
        }
    }

    /// Take over the reports parked by tasks of earlier incarnations.
    fn take_over(&mut self) {
        let parked = self.handover.take();
        if parked.is_empty() {
            return;
        }
        tracing::info!(
            reports = parked.len(),
            "took over the reports of a restarted correlator's tasks"
        );
        for done in parked {
            self.completed(done);
        }
    }

    fn applied(&mut self, applied: AppliedStep) {
        let AppliedStep {
            handed_off,
            receipt_batches,
            inbound_acks,
            inbound,
            groups,
            finished:
                Finished {
                    all: finished,
                    delivered,
                    dead,
                },
            claim_limit,
            claimed_at,
            incarnation,
            ids,
            progress,
            intermediate,
            mut outcome,
        } = applied;
        // A failed step stored none of them: all are tried again.
        let unmatched = match outcome.receipts {
            Ok(_) => std::mem::take(&mut outcome.unmatched_intermediate),
            Err(_) => (0..intermediate.len()).collect(),
        };
        self.retry_unmatched(&intermediate, &unmatched);
        for no in &groups {
            self.groups_writing.remove(no);
        }
        if incarnation == self.incarnation {
            self.writing = self.writing.saturating_sub(1);
            self.claimed_by_writes = self.claimed_by_writes.saturating_sub(claim_limit);
            for (destination, id) in ids {
                let Some(held) = self.writing_ids.get_mut(&destination) else {
                    continue;
                };
                if let Some(n) = held.get_mut(&id) {
                    *n -= 1;
                    if *n == 0 {
                        held.remove(&id);
                    }
                }
                if held.is_empty() {
                    self.writing_ids.remove(&destination);
                }
            }
        }
        // `created`: the step may have created deliveries (a handoff's failure receipt,
        // a resolution); `due`: a claim round should run.
        let (mut created, mut due) = (false, false);
        if progress && outcome.handoffs.is_ok() && outcome.receipts.is_ok() {
            due = true;
        }
        if !handed_off.is_empty() {
            match outcome.handoffs {
                Ok(()) => {
                    self.shared.health.dlr.ok();
                    failpoint::hit("after-dlr-handoff");
                    metrics::counter!("sendium_dlr_handoffs_total").increment(handed_off.len() as u64);
                    self.shared.dir.router.send(RouterMsg::HandedOff(handed_off));
                    created = true;
                }
                Err(e) => {
                    self.shared.health.dlr.failed("dlr", &e);
                    self.shared.dir.router.send(RouterMsg::HandoffFailed(handed_off));
                }
            }
        }
        match outcome.receipts {
            Ok(matches) => {
                if !receipt_batches.is_empty() {
                    self.shared.health.dlr.ok();
                }
                let mut matches = matches.into_iter();
                for StepReceipts {
                    destination: dest,
                    receipts: n,
                    acks,
                } in receipt_batches
                {
                    if let Some(acks) = acks {
                        acks.ok();
                        failpoint::hit("after-receipts-acked");
                    }
                    let (mut matched, mut duplicate, mut orphaned) = (0u64, 0u64, 0u64);
                    for m in matches.by_ref().take(n) {
                        match m {
                            ReceiptMatch::Matched { resolved: r, .. } => {
                                matched += 1;
                                created |= r;
                            }
                            ReceiptMatch::Duplicate { .. } => duplicate += 1,
                            ReceiptMatch::Orphaned => orphaned += 1,
                        }
                    }
                    metrics::counter!("sendium_receipts_matched_total", "destination" => dest.clone())
                        .increment(matched);
                    metrics::counter!("sendium_receipts_duplicate_total", "destination" => dest.clone())
                        .increment(duplicate);
                    metrics::counter!("sendium_receipts_unmatched_total", "destination" => dest).increment(orphaned);
                }
            }
            Err(e) => {
                let n: usize = receipt_batches.iter().map(|b| b.receipts).sum();
                tracing::warn!(receipts = n, error = %e, "could not store provider receipts; the provider will resend");
                self.shared.health.dlr.failed("dlr", &e);
                for StepReceipts { acks, .. } in receipt_batches {
                    if let Some(acks) = acks {
                        acks.fail();
                    }
                }
            }
        }
        if inbound != (0, 0) || !inbound_acks.is_empty() || !groups.is_empty() {
            match &outcome.inbound {
                Ok(()) => {
                    self.shared.health.dlr.ok();
                    for acks in inbound_acks {
                        acks.ok();
                    }
                    created |= inbound.0 > 0;
                }
                Err(e) => {
                    tracing::warn!(
                        messages = inbound.0,
                        parts = inbound.1,
                        error = %e,
                        "could not store inbound messages; the provider will resend"
                    );
                    self.shared.health.dlr.failed("dlr", e);
                    for acks in inbound_acks {
                        acks.fail();
                    }
                }
            }
        }
        if !outcome.complete_groups.is_empty() {
            let ready = std::mem::take(&mut outcome.complete_groups);
            self.queue_groups(ready);
        }
        if finished > 0 {
            match outcome.finishes {
                Ok(()) => {
                    metrics::counter!("sendium_receipts_delivered_total").increment(delivered);
                    if dead > 0 {
                        metrics::counter!("sendium_receipts_dead_total").increment(dead);
                    }
                    // Delivery slots were freed.
                    due = true;
                }
                // The claims lapse and the receipts go again: at least once downstream.
                Err(e) => self.shared.health.dlr.failed("dlr", &e),
            }
        }
        // A step that claimed fewer than it was allowed left nothing it created unclaimed
        // (only stores that claim in their writes are allowed any): no claim round is
        // needed for those.
        if created && outcome.claimed.len() >= claim_limit {
            due = true;
        }
        // Claimed by the write itself: on their way now, without a claim round.
        if !outcome.claimed.is_empty() {
            metrics::counter!("sendium_dlr_claimed_in_write_total").increment(outcome.claimed.len() as u64);
            self.dispatch(outcome.claimed, claimed_at);
        }
        // Receipts held for this step's ids go into the queue now (or wait on for
        // another step still being written) — after the dispatch above, so a step they
        // start sees those deliveries in flight.
        let held = std::mem::take(&mut self.held_intermediate);
        if !held.is_empty() {
            self.queue_intermediate(held);
        }
        for batch in std::mem::take(&mut self.held_receipts) {
            self.queue_receipts(batch);
        }
        if due {
            self.schedule_delivery();
        }
        self.write_queued();
    }

    /// When to try a receipt again whose account has no receiver bound here: alone,
    /// hold it until the account binds (the bind wakes it), within retention; with
    /// several processes on the store, it is due again at once for the process the
    /// account is bound to (only that one claims it).
    fn no_session_until(&self, d: &Delivery) -> Timestamp {
        if self.shared.partitions.is_some() {
            Timestamp::now()
        } else {
            d.expires_at
        }
    }

    async fn deliver_due(&mut self) {
        self.deliver_scheduled = false;
        // Steps being written may still claim what they create: their share counts.
        let busy = self.in_flight + self.claimed_by_writes;
        if busy >= MAX_IN_FLIGHT {
            return;
        }
        let limit = CLAIM_BATCH.min(MAX_IN_FLIGHT - busy);
        let claimed_at = std::time::Instant::now();
        // With several processes on the store, each claims the SMPP receipts of the
        // accounts bound to it (and any HTTP receipt).
        let bound = self
            .shared
            .partitions
            .as_ref()
            .map(|_| self.shared.sessions.receiving_accounts());
        let scope = bound.as_deref().map_or(ClaimScope::All, ClaimScope::SmppAccounts);
        let claimed = match self.store.claim_due(Timestamp::now(), self.lease, limit, scope).await {
            Ok(c) => {
                self.shared.health.dlr.ok();
                self.last_claim = Some((std::time::Instant::now(), c.len() == limit));
                c
            }
            Err(e) => {
                self.shared.health.dlr.failed("dlr", &e);
                return;
            }
        };
        let full = claimed.len() == limit;
        self.dispatch(claimed, claimed_at);
        if full {
            self.schedule_delivery();
        }
    }

    /// Send claimed deliveries on their way (SMPP sessions of the account, or HTTP);
    /// each result comes back as [`DlrMsg::Delivered`]. `claimed_at`: no later than
    /// the start of their claims' lease.
    fn dispatch(&mut self, claimed: Vec<Delivery>, claimed_at: std::time::Instant) {
        if claimed.is_empty() {
            return;
        }
        let claims = claimed.len();
        self.in_flight += claims;
        let mut smpp: HashMap<String, Vec<Delivery>> = HashMap::new();
        let mut http = Vec::new();
        let mut parked = Vec::new();
        for d in claimed {
            if let DeliveryContent::Inbound(m) = &d.content {
                self.inbound_in_flight.insert(d.id, m.route.clone());
            }
            if matches!(d.content, DeliveryContent::Progress(_)) && !matches!(d.target.reply, ReplyPath::Kannel { .. })
            {
                // Only a Kannel dlr-url is owed progress reports; no store creates others.
                parked.push(DeliveryFinish {
                    id: d.id,
                    attempt: d.attempt,
                    result: DeliveryResult::Delivered,
                });
                continue;
            }
            match &d.target.reply {
                ReplyPath::Smpp => {
                    if self.shared.sessions.receivers(&d.target.account) == 0 {
                        parked.push(DeliveryFinish {
                            id: d.id,
                            attempt: d.attempt,
                            result: DeliveryResult::Retry {
                                at: self.no_session_until(&d),
                            },
                        });
                    } else if let Some(batch) = smpp.get_mut(&d.target.account) {
                        batch.push(d);
                    } else {
                        // Sized for the whole claim when it is the first account (most
                        // claims are one account's), so its batch does not grow step by step.
                        let mut batch = Vec::with_capacity(if smpp.is_empty() { claims } else { 1 });
                        let account = d.target.account.clone();
                        batch.push(d);
                        smpp.insert(account, batch);
                    }
                }
                ReplyPath::Http { .. } | ReplyPath::Kannel { .. } => {
                    if http.is_empty() {
                        http.reserve(claims);
                    }
                    http.push(d)
                }
            }
        }
        if !parked.is_empty() {
            self.in_flight -= parked.len();
            self.queue_finishes(parked);
        }
        let incarnation = self.incarnation;
        for (account, deliveries) in smpp {
            let shared = self.shared.clone();
            let handover = self.handover.clone();
            tokio::spawn(async move {
                let shared_store = shared.partitions.is_some();
                let results = deliver::smpp(&shared.sessions, &account, &deliveries, shared_store).await;
                let done = Completion::Delivered { incarnation, results };
                shared.dir.dlr.send(DlrMsg::Completed(Report::new(done, &handover)));
            });
        }
        if !http.is_empty() {
            let shared = self.shared.clone();
            let client = self.http.clone();
            let inbound_client = self.http_inbound.clone();
            let slots = self.http_slots.clone();
            let handover = self.handover.clone();
            // A callback may start only while its claim has time left for a whole attempt:
            // a round of many slow endpoints can outlast the lease, and a lapsed claim may
            // already be another round's (a second, concurrent delivery). Those go back
            // unattempted, due at once, and the next round claims them afresh.
            let last_start = claimed_at + self.lease.saturating_sub(self.callback_timeout);
            tokio::spawn(async move {
                use futures::StreamExt;
                let mut results = futures::stream::iter(http)
                    .map(|d| {
                        let client = match d.content {
                            DeliveryContent::Inbound(_) => inbound_client.clone(),
                            DeliveryContent::Receipt(_) | DeliveryContent::Progress(_) => client.clone(),
                        };
                        let slots = slots.clone();
                        async move {
                            // At most HTTP_CONCURRENCY callbacks at once, across rounds.
                            let _slot = slots.acquire_owned().await;
                            if std::time::Instant::now() > last_start {
                                return DeliveryFinish {
                                    id: d.id,
                                    attempt: d.attempt,
                                    result: DeliveryResult::Retry { at: Timestamp::now() },
                                };
                            }
                            match &d.target.reply {
                                ReplyPath::Kannel { url, mask } => kannel::receipt(&client, url, *mask, &d).await,
                                other => deliver::http(&client, other.url().unwrap_or_default(), &d).await,
                            }
                        }
                    })
                    .buffer_unordered(HTTP_CONCURRENCY)
                    // Results are recorded as they come, not when the slowest is done.
                    .ready_chunks(HTTP_CONCURRENCY);
                while let Some(results) = results.next().await {
                    let done = Completion::Delivered { incarnation, results };
                    shared.dir.dlr.send(DlrMsg::Completed(Report::new(done, &handover)));
                }
            });
        }
    }

    async fn wake_bound_accounts(&mut self) {
        let mut accounts: Vec<String> = self.shared.sessions.sessions().into_iter().map(|s| s.account).collect();
        accounts.sort();
        accounts.dedup();
        for account in accounts {
            if self.shared.sessions.receivers(&account) == 0 {
                continue;
            }
            match self.store.wake_account(&account, Timestamp::now()).await {
                Ok(n) if n > 0 => self.schedule_delivery(),
                Ok(_) => {}
                Err(e) => self.shared.health.dlr.failed("dlr", &e),
            }
        }
    }

    async fn tick(&mut self) {
        self.ticks += 1;
        // A report of the previous incarnation may be parked after this one started.
        self.take_over();
        // The tick runs a delivery round itself, so a lost DeliverDue never stalls receipts.
        self.deliver_due().await;
        if self.ticks.is_multiple_of(10) {
            // Receipts parked for accounts that are bound now (a bind notice can be lost
            // while this actor restarts).
            self.wake_bound_accounts().await;
        }
        // Multipart inbound groups past their deadline, or left complete by a crash or a
        // failed step.
        match self.store.due_inbound_groups(Timestamp::now(), 1_000).await {
            Ok(groups) if !groups.is_empty() => self.queue_groups(groups),
            Ok(_) => {}
            Err(e) => self.shared.health.dlr.failed("dlr", &e),
        }
        if self.ticks.is_multiple_of(30) {
            match self.store.expire(Timestamp::now(), 10_000).await {
                Ok(r) => {
                    if r.unresolved + r.dead_deliveries + r.orphans > 0 {
                        tracing::info!(
                            unresolved = r.unresolved,
                            dead = r.dead_deliveries,
                            orphans = r.orphans,
                            "receipt retention expired entries"
                        );
                        metrics::counter!("sendium_receipts_expired_total", "what" => "unresolved")
                            .increment(r.unresolved);
                        metrics::counter!("sendium_receipts_expired_total", "what" => "undelivered")
                            .increment(r.dead_deliveries);
                        metrics::counter!("sendium_receipts_expired_total", "what" => "unmatched").increment(r.orphans);
                    }
                }
                Err(e) => self.shared.health.dlr.failed("dlr", &e),
            }
        }
    }
}

impl Actor for DlrCorrelator {
    type Msg = DlrMsg;
    type State = DlrState;
    type Arguments = DlrArgs;

    async fn pre_start(&self, myself: ActorRef<Self::Msg>, args: DlrArgs) -> Result<DlrState, ActorProcessingErr> {
        args.shared.dir.dlr.install(myself);
        let http = deliver::CallbackClient::new(args.callback_timeout, args.callback_targets)?;
        let http_inbound = deliver::CallbackClient::new(args.callback_timeout, CallbackTargets::anywhere())?;
        Ok(DlrState {
            shared: args.shared,
            caps: args.store.capabilities(),
            store: args.store,
            http,
            http_inbound,
            inbound_in_flight: HashMap::new(),
            groups_writing: std::collections::HashSet::new(),
            in_flight: 0,
            deliver_scheduled: false,
            ticks: 0,
            queued: Step::default(),
            writing: 0,
            incarnation: INCARNATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            last_claim: None,
            claimed_by_writes: 0,
            writing_ids: IdMap::default(),
            held_receipts: Vec::new(),
            held_intermediate: Vec::new(),
            handover: args.handover,
            lease: args.claim_lease,
            callback_timeout: args.callback_timeout,
            http_slots: Arc::new(tokio::sync::Semaphore::new(HTTP_CONCURRENCY)),
        })
    }

    async fn post_start(&self, _myself: ActorRef<Self::Msg>, state: &mut DlrState) -> Result<(), ActorProcessingErr> {
        // What the previous incarnation's tasks reported after it stopped is taken over;
        // other claims of it lapse by their lease. Anything due goes now, and receipts
        // held for accounts bound meanwhile are due too.
        state.take_over();
        state.wake_bound_accounts().await;
        state.schedule_delivery();
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: DlrMsg,
        state: &mut DlrState,
    ) -> Result<(), ActorProcessingErr> {
        state.shared.dir.dlr.took_one();
        match msg {
            DlrMsg::HandOff(batch) => {
                failpoint::hit("actor-dlr-correlator");
                state.queue_handoffs(batch);
            }
            DlrMsg::ProviderReceipts(batch) => state.queue_receipts(batch),
            DlrMsg::Intermediate(batch) => state.queue_intermediate(batch.into_iter().map(|r| (r, 0)).collect()),
            DlrMsg::IntermediateAgain(batch) => state.queue_intermediate(batch),
            DlrMsg::Inbound(batch) => state.queue_inbound(batch),
            DlrMsg::DeliverDue => state.deliver_due().await,
            DlrMsg::AccountBound(account) => match state.store.wake_account(&account, Timestamp::now()).await {
                Ok(n) if n > 0 => state.schedule_delivery(),
                Ok(_) => {}
                Err(e) => state.shared.health.dlr.failed("dlr", &e),
            },
            DlrMsg::Completed(report) => {
                if let Some(done) = report.open() {
                    state.completed(done);
                }
            }
            DlrMsg::Tick => state.tick().await,
            DlrMsg::Status(reply) => {
                let store = state.store.stats().await.ok();
                let _ = reply.send(DlrStatus {
                    store,
                    deliveries_in_flight: state.in_flight as u64,
                    reserved: state.caps.reservations.as_ref().map(|r| (r.held(), r.capacity())),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn receipt_acks_dropped_unanswered_ask_the_provider_to_resend() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        drop(ReceiptAcks::http(tx));
        assert_eq!(rx.await, Ok(false));
        let (tx, rx) = tokio::sync::oneshot::channel();
        ReceiptAcks::http(tx).ok();
        assert_eq!(rx.await, Ok(true));
    }
}
