//! The pending stage's writer: a task (or, for a store whose commit blocks, a thread)
//! that group-commits admissions and source completions and answers the waiting
//! clients itself.
//!
//! # Why a writer beside the actor
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
//! A file store commits with blocking calls (a journal `fdatasync`); through the async
//! API each commit would be two thread hand-offs (to the blocking pool and back), which
//! on a busy machine cost as much as the commit. Its writer is therefore a thread of its
//! own that waits on the channel, commits, and answers, with no hand-off at all. Its
//! commit answers the clients from inside (see [`BlockingPendingWriter::commit`]) as
//! soon as the journal frame is synced, before the records are applied to the store
//! file; the Selector is woken when the commit returns, once they are readable.
//!
//! When the Ingress actor stops (or is restarted by the supervisor) its handle is
//! dropped; the writer still commits and answers what was already handed to it, then
//! ends. Nothing handed over is dropped unanswered.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use sendium_storage::failpoint;
use sendium_storage::{AdmitOutcome, BlockingPendingWriter, MessageId, PendingRecord, UnitId};
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
    work: WorkSender,
    gauges: Arc<Gauges>,
}

/// The channel to the writer: a task's, or a thread's (which waits on it with a
/// timeout, without needing the runtime).
enum WorkSender {
    Task(mpsc::UnboundedSender<Work>),
    Thread(std::sync::mpsc::Sender<Work>),
}

impl WorkSender {
    /// Err(work) if the writer is gone.
    fn send(&self, work: Work) -> Result<(), Work> {
        match self {
            WorkSender::Task(tx) => tx.send(work).map_err(|e| e.0),
            WorkSender::Thread(tx) => tx.send(work).map_err(|e| e.0),
        }
    }
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
    /// Start the writer; the Ingress's arguments decide admissions for its life. With a
    /// store that commits on the calling thread (file) the writer is a thread of its
    /// own, otherwise a task.
    pub(super) fn spawn(policy: IngressArgs) -> Self {
        let gauges = Arc::new(Gauges::default());
        let work = match policy.store.capabilities().blocking_writer {
            Some(writer) => {
                let (work, rx) = std::sync::mpsc::channel();
                let g = gauges.clone();
                let spawned = std::thread::Builder::new()
                    .name("pending-writer".into())
                    .spawn(move || run_on_thread(policy, writer, rx, g));
                if let Err(e) = spawned {
                    // The work channel is closed with the closure: the actor's first
                    // hand-over fails and the supervisor restarts it (and tries again).
                    tracing::error!(error = %e, "cannot start the pending writer thread");
                }
                WorkSender::Thread(work)
            }
            None => {
                let (work, rx) = mpsc::unbounded_channel();
                tokio::spawn(run(policy, rx, gauges.clone()));
                WorkSender::Task(work)
            }
        };
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

/// One store write: what was taken from the channel, with what was decided before.
struct Batch {
    requests: Vec<Prepared>,
    records: Vec<PendingRecord>,
    completed: Vec<UnitId>,
    /// The clients have their answers (see [`Batch::answer`]).
    answered: bool,
    /// Records the answers accepted.
    admitted: u64,
}

/// Source completions beside admissions in one commit: this many, plus
/// [`COMPLETIONS_PER_ADMISSION`] per admitted record. Removing a source costs about what
/// storing one does, and a client waiting for its acknowledgement should not wait for a
/// burst of completions; in steady traffic completions arrive as fast as admissions, so
/// the share keeps up. A commit with no client waiting takes every completion.
const COMPLETIONS_BESIDE_ADMISSIONS: usize = 64;
const COMPLETIONS_PER_ADMISSION: usize = 2;
/// The most requests a batch is sized for before it is gathered (it grows beyond if more
/// come).
const MAX_PRESIZE: usize = 4096;

/// Split off the completions beyond a commit's share (none when no client waits).
fn beyond_share(completed: &mut Vec<UnitId>, clients_wait: bool, records: usize) -> Vec<UnitId> {
    let share = COMPLETIONS_BESIDE_ADMISSIONS + COMPLETIONS_PER_ADMISSION * records;
    if clients_wait && completed.len() > share {
        completed.split_off(share)
    } else {
        Vec::new()
    }
}

/// What the writer keeps between commits.
#[derive(Default)]
struct Backlog {
    /// Completions a failed commit could not write (retried on the actor's tick).
    retry: Vec<UnitId>,
    /// Completions beyond the last commit's share: written next, without waiting for
    /// new work.
    carried: Vec<UnitId>,
}

impl Batch {
    /// The carried completions, `first` and everything else waiting in the channel
    /// (completions to retry included if asked for). `None` if it all came to nothing
    /// to write or answer.
    fn gather(
        policy: &IngressArgs,
        first: Option<Work>,
        waiting: &mut dyn FnMut() -> Option<Work>,
        backlog: &mut Backlog,
        gauges: &Gauges,
    ) -> Option<Batch> {
        // Sized for the requests waiting now (the records of a request are usually one), so
        // the batch's records are not copied again at every doubling while it is gathered.
        let waiting_now = usize::try_from(gauges.waiting.load(Ordering::Relaxed))
            .unwrap_or(MAX_PRESIZE)
            .clamp(1, MAX_PRESIZE);
        let mut batch = Batch {
            requests: Vec::with_capacity(waiting_now),
            records: Vec::with_capacity(waiting_now),
            completed: std::mem::take(&mut backlog.carried),
            answered: false,
            admitted: 0,
        };
        let mut take = |work: Work, batch: &mut Batch| match work {
            Work::Admit(req) => {
                gauges.waiting.fetch_sub(1, Ordering::Relaxed);
                batch.requests.push(policy.prepare(req, &mut batch.records));
            }
            Work::Complete(ids) => batch.completed.extend(ids),
            Work::Retry => batch.completed.append(&mut backlog.retry),
        };
        if let Some(first) = first {
            take(first, &mut batch);
        }
        while let Some(work) = waiting() {
            take(work, &mut batch);
        }
        // Requests refused before the store (draining, receipt gates) only need their
        // answers: they do not make this a commit clients wait for.
        backlog.carried = beyond_share(&mut batch.completed, !batch.records.is_empty(), batch.records.len());
        if batch.requests.is_empty() && batch.completed.is_empty() {
            return None;
        }
        gauges.committing.store(true, Ordering::Relaxed);
        if !batch.completed.is_empty() {
            failpoint::hit("before-source-completion");
        }
        Some(batch)
    }

    /// The records to store, or `None` if the commit writes nothing (refused requests
    /// only need their answers). The completions stay in the batch for `settle`.
    fn take_write(&mut self) -> Option<Vec<PendingRecord>> {
        (!self.records.is_empty() || !self.completed.is_empty()).then(|| std::mem::take(&mut self.records))
    }

    /// Answer the clients, once: with the store's outcomes, or (`None`) as refused
    /// because the commit failed. Called as soon as the outcomes are durable, which for
    /// a file store is before its commit returns.
    fn answer(&mut self, policy: &IngressArgs, outcomes: Option<&[AdmitOutcome]>) {
        if self.answered {
            return;
        }
        self.answered = true;
        // Stored (or not) but nobody has been told yet.
        failpoint::hit("after-admit");
        self.admitted = policy.answer(std::mem::take(&mut self.requests), outcomes);
    }

    /// Answer the clients (unless done already) and, the commit done, pass its
    /// results on.
    fn settle(
        mut self,
        policy: &IngressArgs,
        result: Result<Vec<AdmitOutcome>, sendium_storage::PendingError>,
        backlog: &mut Backlog,
        gauges: &Gauges,
    ) {
        self.answer(policy, result.as_ref().ok().map(Vec::as_slice));
        if let Some(failed) = policy.finish(self.completed, result, self.admitted) {
            backlog.retry.extend(failed);
        }
        gauges.to_retry.store(backlog.retry.len() as u64, Ordering::Relaxed);
        gauges.committing.store(false, Ordering::Relaxed);
    }
}

async fn run(policy: IngressArgs, mut rx: mpsc::UnboundedReceiver<Work>, gauges: Arc<Gauges>) {
    let mut backlog = Backlog::default();
    loop {
        // Carried completions are written without waiting for new work.
        let first = if backlog.carried.is_empty() {
            let Some(work) = rx.recv().await else { break };
            Some(work)
        } else {
            None
        };
        let Some(mut batch) = Batch::gather(&policy, first, &mut || rx.try_recv().ok(), &mut backlog, &gauges) else {
            continue;
        };
        let result = match batch.take_write() {
            Some(records) => policy.store.commit(records, &batch.completed).await,
            None => Ok(Vec::new()),
        };
        batch.settle(&policy, result, &mut backlog, &gauges);
    }
}

/// How long the writer thread waits for work before it calls the store's
/// [`BlockingPendingWriter::idle`] (once per quiet spell). Long enough that a short
/// pause in traffic does not start a checkpoint that the next burst would wait for.
const WRITER_IDLE: std::time::Duration = std::time::Duration::from_millis(100);

/// [`run`] on a thread of its own, committing with a blocking call.
fn run_on_thread(
    policy: IngressArgs,
    writer: Arc<dyn BlockingPendingWriter>,
    rx: std::sync::mpsc::Receiver<Work>,
    gauges: Arc<Gauges>,
) {
    use std::sync::mpsc::RecvTimeoutError;
    let mut backlog = Backlog::default();
    loop {
        let first = if backlog.carried.is_empty() {
            let work = match rx.recv_timeout(WRITER_IDLE) {
                Ok(work) => work,
                Err(RecvTimeoutError::Timeout) => {
                    writer.idle();
                    let Ok(work) = rx.recv() else { break };
                    work
                }
                Err(RecvTimeoutError::Disconnected) => break,
            };
            Some(work)
        } else {
            None
        };
        let Some(mut batch) = Batch::gather(&policy, first, &mut || rx.try_recv().ok(), &mut backlog, &gauges) else {
            continue;
        };
        let result = match batch.take_write() {
            Some(records) => {
                let completed = std::mem::take(&mut batch.completed);
                let result = writer.commit(records, &completed, &mut |outcomes| {
                    batch.answer(&policy, Some(outcomes));
                });
                batch.completed = completed;
                result
            }
            None => Ok(Vec::new()),
        };
        batch.settle(&policy, result, &mut backlog, &gauges);
    }
}

impl IngressArgs {
    fn prepare(&self, req: AdmitRequest, to_store: &mut Vec<PendingRecord>) -> Prepared {
        let mut slots = Vec::with_capacity(req.records.len());
        for record in req.records {
            // In order, the first refusal refuses the rest (slots after it are all refused).
            let cut_off = req.in_order && matches!(slots.last(), Some(Err(_)));
            if !self.accepting || cut_off || self.shared.stopping.refusing_admissions() {
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

    /// Answer every client of a commit from its outcomes (`None`: the commit failed).
    /// Returns how many records were accepted.
    fn answer(&self, requests: Vec<Prepared>, outcomes: Option<&[AdmitOutcome]>) -> u64 {
        let mut outcomes = outcomes.map(|o| o.iter());
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
                            Some(AdmitOutcome::Superseding) => {
                                admitted += 1;
                                metrics::counter!("sendium_multipart_groups_superseded_total").increment(1);
                                Admission::Accepted(id)
                            }
                            Some(AdmitOutcome::Duplicate { existing }) => Admission::Duplicate(*existing),
                            Some(AdmitOutcome::KeyReused { .. }) => Admission::Refused(Refusal::IdempotencyKeyReused),
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
            failpoint::hit("after-ack");
        }
        admitted
    }

    /// The commit is done and its clients answered: report its health, pass the
    /// completions on and wake the Selector for what it admitted (only now: a file
    /// store answers before the admissions are readable). Returns the completions to
    /// retry if the commit failed.
    fn finish(
        &self,
        completed: Vec<UnitId>,
        result: Result<Vec<AdmitOutcome>, sendium_storage::PendingError>,
        admitted: u64,
    ) -> Option<Vec<UnitId>> {
        let mut retry = None;
        match result {
            Ok(_) => {
                self.shared.health.pending.ok();
                if !completed.is_empty() {
                    metrics::counter!("sendium_sources_completed_total").increment(completed.len() as u64);
                    self.shared
                        .dir
                        .router
                        .send(crate::router::RouterMsg::SourcesCompleted(completed));
                }
            }
            Err(e) => {
                self.shared.health.pending.failed("pending", &e);
                // Retried on the tick, so a failing store is not hammered.
                retry = Some(completed);
            }
        }
        if admitted > 0 {
            metrics::counter!("sendium_admitted_total").increment(admitted);
            self.shared.dir.selector.send(crate::selector::SelectorMsg::Wake);
        }
        retry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<UnitId> {
        (0..n).map(|_| MessageId::generate()).collect()
    }

    #[test]
    fn a_commit_with_waiting_clients_takes_its_share_of_completions_oldest_first() {
        let mut completed = ids(500);
        let all = completed.clone();
        let carried = beyond_share(&mut completed, true, 10);
        assert_eq!(
            completed.len(),
            COMPLETIONS_BESIDE_ADMISSIONS + 10 * COMPLETIONS_PER_ADMISSION
        );
        assert_eq!([completed, carried].concat(), all, "nothing lost, order kept");
    }

    #[test]
    fn a_commit_nobody_waits_for_takes_every_completion() {
        let mut completed = ids(500);
        assert!(beyond_share(&mut completed, false, 0).is_empty());
        assert_eq!(completed.len(), 500);
        // A share is a floor, not a cut when there are fewer.
        let mut few = ids(20);
        assert!(beyond_share(&mut few, true, 0).is_empty());
    }
}
