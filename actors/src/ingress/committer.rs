//! The pending stage's writer: a task that group-commits admissions and source
//! completions and answers the waiting clients itself.
//!
//! # Why a task beside the actor
//!
//! An acknowledgement waits for a commit, and a client arriving during a commit waits
//! for that one and then its own, so the time between two commits is latency every
//! client pays. The writer therefore loops on its own: when a commit returns it answers
//! its clients at once and starts the next commit with everything that arrived
//! meanwhile, without a round trip through the Ingress mailbox (where reads, ticks and
//! completions queue) in between. The actor forwards work here through an unbounded
//! channel; what bounds it is the clients' own windows (SMPP window, HTTP concurrency),
//! each of which waits for its answer.
//!
//! When the Ingress actor stops (or is restarted by the supervisor) its handle is
//! dropped; the writer still commits and answers what was already handed to it, then
//! ends. Nothing handed over is dropped unanswered.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use sendium_storage::failpoint;
use sendium_storage::{AdmitOutcome, MessageId, PendingRecord, UnitId};
use tokio::sync::mpsc;

use super::{Admission, AdmitRequest, IngressArgs, ReceiptPolicy, Refusal};

/// What the actor hands the writer.
pub(super) enum Work {
    Admit(AdmitRequest),
    /// Every branch and DLR handoff of these units is terminal: remove their sources.
    Complete(Vec<UnitId>),
    /// Retry completions a failed commit could not write (sent on the actor's tick).
    Retry,
}

/// The writer as the actor sees it.
pub(super) struct CommitterHandle {
    work: mpsc::UnboundedSender<Work>,
    gauges: Arc<Gauges>,
}

/// What `/status` and the metrics report about the writer.
#[derive(Default)]
pub(super) struct Gauges {
    /// Admission requests handed over and not yet in a commit.
    pub waiting: AtomicU64,
    pub committing: AtomicBool,
    /// Completions a failed commit left to retry.
    pub to_retry: AtomicU64,
}

impl CommitterHandle {
    /// Start the writer task; the Ingress's arguments decide admissions for its life.
    pub(super) fn spawn(policy: IngressArgs) -> Self {
        let (work, rx) = mpsc::unbounded_channel();
        let gauges = Arc::new(Gauges::default());
        tokio::spawn(run(policy, rx, gauges.clone()));
        Self { work, gauges }
    }

    /// Hand work over. False if the writer is gone, which happens only if it panicked
    /// (it otherwise ends when this handle is dropped): the work is dropped with it — a
    /// client's reply sender, so `admit` refuses; completions, which the Router sends
    /// again — and the actor must stop so the supervisor starts a new writer with it.
    #[must_use]
    pub(super) fn send(&self, work: Work) -> bool {
        // Counted before the send: the writer may take it (and count it down) at once.
        let admission = matches!(work, Work::Admit(_));
        if admission {
            self.gauges.waiting.fetch_add(1, Ordering::Relaxed);
        }
        if self.work.send(work).is_err() {
            if admission {
                self.gauges.waiting.fetch_sub(1, Ordering::Relaxed);
            }
            return false;
        }
        true
    }

    pub(super) fn gauges(&self) -> &Gauges {
        &self.gauges
    }
}

/// Requests in one store write, with what was decided before writing.
struct Prepared {
    reply: tokio::sync::oneshot::Sender<Vec<Admission>>,
    /// Per submission: `Ok((record id, reserved a receipt))` if it went to the store,
    /// `Err(refusal)` if it was refused before.
    slots: Vec<Result<(MessageId, bool), Refusal>>,
}

async fn run(policy: IngressArgs, mut rx: mpsc::UnboundedReceiver<Work>, gauges: Arc<Gauges>) {
    let mut retry: Vec<UnitId> = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut requests = Vec::new();
        let mut records = Vec::new();
        let mut completed = Vec::new();
        let mut take = |work: Work, retry: &mut Vec<UnitId>| match work {
            Work::Admit(req) => {
                gauges.waiting.fetch_sub(1, Ordering::Relaxed);
                requests.push(policy.prepare(req, &mut records));
            }
            Work::Complete(ids) => completed.extend(ids),
            Work::Retry => completed.append(retry),
        };
        take(first, &mut retry);
        while let Ok(work) = rx.try_recv() {
            take(work, &mut retry);
        }
        if requests.is_empty() && completed.is_empty() {
            continue;
        }
        gauges.committing.store(true, Ordering::Relaxed);
        if !completed.is_empty() {
            failpoint::hit("before-source-completion");
        }
        let result = if records.is_empty() && completed.is_empty() {
            Ok(Vec::new())
        } else {
            policy.store.commit(records, &completed).await
        };
        // Stored (or not) but nobody has been told yet.
        failpoint::hit("after-admit");
        if let Some(failed) = policy.finish(requests, completed, result) {
            retry.extend(failed);
        }
        gauges.to_retry.store(retry.len() as u64, Ordering::Relaxed);
        gauges.committing.store(false, Ordering::Relaxed);
    }
}

impl IngressArgs {
    fn prepare(&self, req: AdmitRequest, to_store: &mut Vec<PendingRecord>) -> Prepared {
        let mut slots = Vec::with_capacity(req.records.len());
        for record in req.records {
            if !self.accepting {
                slots.push(Err(Refusal::Unavailable));
                continue;
            }
            let mut reserved = false;
            if record.wants_receipt() {
                match self.receipts {
                    ReceiptPolicy::Refuse => {
                        slots.push(Err(Refusal::ReceiptsDisabled));
                        continue;
                    }
                    ReceiptPolicy::AcceptWithoutReceipt => {}
                    ReceiptPolicy::Track => {
                        if self.shared.health.dlr.is_failing() {
                            slots.push(Err(Refusal::ReceiptStoreUnavailable));
                            continue;
                        }
                        if let Some(gate) = &self.reservations {
                            if !gate.try_reserve(1) {
                                slots.push(Err(Refusal::ReceiptCapacity));
                                continue;
                            }
                            reserved = true;
                        }
                    }
                }
            }
            slots.push(Ok((record.id, reserved)));
            to_store.push(record);
        }
        Prepared {
            reply: req.reply,
            slots,
        }
    }

    /// Answer every client of the commit and pass the completions on. Returns the
    /// completions to retry if the commit failed.
    fn finish(
        &self,
        requests: Vec<Prepared>,
        completed: Vec<UnitId>,
        result: Result<Vec<AdmitOutcome>, sendium_storage::PendingError>,
    ) -> Option<Vec<UnitId>> {
        let mut retry = None;
        let mut outcomes = match result {
            Ok(o) => {
                self.shared.health.pending.ok();
                if !completed.is_empty() {
                    metrics::counter!("sendium_sources_completed_total").increment(completed.len() as u64);
                    self.shared
                        .dir
                        .router
                        .send(crate::router::RouterMsg::SourcesCompleted(completed));
                }
                Some(o.into_iter())
            }
            Err(e) => {
                self.shared.health.pending.failed("pending", &e);
                // Retried on the tick, so a failing store is not hammered.
                retry = Some(completed);
                None
            }
        };
        let mut admitted = 0u64;
        for prepared in requests {
            let mut answers = Vec::with_capacity(prepared.slots.len());
            for slot in prepared.slots {
                let answer = match slot {
                    Err(refusal) => Admission::Refused(refusal),
                    Ok((id, reserved)) => {
                        let outcome = outcomes.as_mut().and_then(|o| o.next());
                        let answer = match outcome {
                            Some(AdmitOutcome::Admitted) => {
                                admitted += 1;
                                Admission::Accepted(id)
                            }
                            Some(AdmitOutcome::Duplicate { existing }) => Admission::Duplicate(existing),
                            Some(AdmitOutcome::Full) => Admission::Refused(Refusal::QueueFull),
                            None => Admission::Refused(Refusal::Unavailable),
                        };
                        if reserved
                            && !matches!(answer, Admission::Accepted(_))
                            && let Some(gate) = &self.reservations
                        {
                            gate.release(1);
                        }
                        answer
                    }
                };
                if let Admission::Refused(r) = answer {
                    metrics::counter!("sendium_admissions_refused_total", "reason" => r.as_str()).increment(1);
                }
                answers.push(answer);
            }
            // A client that went away still had its messages stored: that is fine, it
            // will resubmit and at-least-once covers it.
            let _ = prepared.reply.send(answers);
        }
        if admitted > 0 {
            metrics::counter!("sendium_admitted_total").increment(admitted);
            failpoint::hit("after-ack");
            self.shared.dir.selector.send(crate::selector::SelectorMsg::Wake);
        }
        retry
    }
}
