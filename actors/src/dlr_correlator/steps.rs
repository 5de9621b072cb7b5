//! Write steps: what arrives is queued for the next step, and a step is committed while
//! the next one gathers (group commit). A step's outcome answers the providers, tells
//! the Router of its handoffs and sends on the deliveries it claimed.

use sendium_storage::failpoint;
use sendium_storage::{
    ClaimCreated, DeliveryFinish, DeliveryResult, DlrWrite, DlrWriteOutcome, Handoff, HandoffOutcome, InboundGroup,
    IntermediateReceipt, ReceiptMatch,
};

use super::handover::{Completion, Report};
use super::{
    CLAIM_BATCH, DlrMsg, DlrState, INTERMEDIATE_RETRY, INTERMEDIATE_TRIES, InboundBatch, MAX_IN_FLIGHT, ReceiptAcks,
    ReceiptBatch, kannel,
};
use crate::inbound::MoEvent;
use crate::router::{BranchKey, RouterMsg};

/// A batched write step and what to do with its outcome. The context travels with
/// the step, so a step that completes after this actor restarted is still answered.
#[derive(Default)]
pub(super) struct Step {
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
pub(super) struct AppliedStep {
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

impl DlrState {
    pub(super) fn queue_handoffs(&mut self, mut batch: Vec<Handoff>) {
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
    pub(super) fn queue_receipts(&mut self, batch: ReceiptBatch) {
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
    pub(super) fn queue_intermediate(&mut self, batch: Vec<(IntermediateReceipt, u8)>) {
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
    pub(super) fn retry_unmatched(&self, intermediate: &[(IntermediateReceipt, u8)], unmatched: &[usize]) {
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

    pub(super) fn queue_finishes(&mut self, results: Vec<DeliveryFinish>) {
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

    pub(super) fn queue_inbound(&mut self, batch: InboundBatch) {
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
    pub(super) fn queue_groups(&mut self, groups: Vec<InboundGroup>) {
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
    pub(super) fn write_queued(&mut self) {
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

    pub(super) fn completed(&mut self, done: Completion) {
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
    pub(super) fn take_over(&mut self) {
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

    pub(super) fn applied(&mut self, applied: AppliedStep) {
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
}
