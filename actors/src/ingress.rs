//! Ingress: owns the pending stage.
//!
//! A submission is acknowledged only after the pending store admitted it as durably as
//! the selected backend promises. Admissions are *group committed*: while one store
//! write is in flight, newly arriving requests (from every session) wait in the actor's
//! buffer and all of them go into the next write — one commit, one fsync for durable
//! backends, many acknowledgements.
//!
//! Ingress also completes sources (on the Router's word that every branch and any DLR
//! handoff is terminal) and expires incomplete multipart groups at their saved deadline.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use sendium_storage::failpoint;
use sendium_storage::{
    AdmitOutcome, MessageId, PendingError, PendingRecord, PendingStats, PendingStore, ReadySeq, ReadyUnit,
    ReceiptReservations, Timestamp, UnitId,
};
use tokio::sync::oneshot;

use crate::context::Shared;

/// What a client is told about one submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Stored as promised: acknowledge with this id.
    Accepted(MessageId),
    /// Same account and idempotency key as an earlier submission: answer with its id.
    Duplicate(MessageId),
    Refused(Refusal),
}

/// Why a submission was not admitted. Nothing refused was stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The pending stage is at capacity (ESME_RMSGQFUL / HTTP 503).
    QueueFull,
    /// The bounded DLR store cannot reserve a receipt (ESME_RMSGQFUL / HTTP 503).
    ReceiptCapacity,
    /// The DLR store is failing (database down, disk error): a submission asking for a
    /// receipt is refused until it recovers, rather than piling up sources whose
    /// handoff cannot complete (ESME_RMSGQFUL / HTTP 503). Others are still admitted.
    ReceiptStoreUnavailable,
    /// DLR handling is disabled and configured to refuse receipt requests
    /// (ESME_RINVREGDLVFLG / HTTP 400).
    ReceiptsDisabled,
    /// The store failed or the pipeline is not running (ESME_RSYSERR / HTTP 503).
    Unavailable,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::QueueFull => "queue_full",
            Refusal::ReceiptCapacity => "receipt_capacity",
            Refusal::ReceiptStoreUnavailable => "receipt_store_unavailable",
            Refusal::ReceiptsDisabled => "receipts_disabled",
            Refusal::Unavailable => "unavailable",
        }
    }
}

/// A batch of submissions waiting for admission (one SMPP read, or one HTTP request).
pub struct AdmitRequest {
    pub records: Vec<PendingRecord>,
    pub reply: oneshot::Sender<Vec<Admission>>,
}

/// How receipt requests are treated when DLR handling is disabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReceiptPolicy {
    /// A DLR store is active.
    Track,
    /// Disabled: accept, never send a receipt.
    AcceptWithoutReceipt,
    /// Disabled: refuse submissions that ask for one.
    Refuse,
}

pub enum IngressMsg {
    Admit(AdmitRequest),
    /// A store write finished (sent by the commit task).
    Committed(Box<CommitBatch>),
    ReadyAfter {
        after: ReadySeq,
        limit: usize,
        reply: RpcReplyPort<Result<Vec<ReadyUnit>, PendingError>>,
    },
    Units {
        ids: Vec<UnitId>,
        reply: RpcReplyPort<Result<Vec<ReadyUnit>, PendingError>>,
    },
    /// Every branch and DLR handoff of these units is terminal: remove their sources.
    Complete(Vec<UnitId>),

    Tick,
    Status(RpcReplyPort<IngressStatus>),
}

/// Requests in one store write, with what was decided before writing.
pub struct CommitBatch {
    requests: Vec<Prepared>,
    /// Units whose sources this write completed.
    completed: Vec<UnitId>,
    result: Result<Vec<AdmitOutcome>, PendingError>,
}

struct Prepared {
    reply: oneshot::Sender<Vec<Admission>>,
    /// Per submission: `Ok((record id, reserved a receipt))` if it went to the store,
    /// `Err(refusal)` if it was refused before.
    slots: Vec<Result<(MessageId, bool), Refusal>>,
}

#[derive(Clone, Debug, Default)]
pub struct IngressStatus {
    pub waiting_requests: u64,
    pub committing: bool,
    pub completions_to_retry: u64,
    pub pending: Option<PendingStats>,
}

pub struct IngressArgs {
    pub shared: Arc<Shared>,
    pub store: Arc<dyn PendingStore>,
    pub reservations: Option<Arc<ReceiptReservations>>,
    pub receipts: ReceiptPolicy,
    /// False while draining: every admission is refused.
    pub accepting: bool,
}

pub struct IngressState {
    shared: Arc<Shared>,
    store: Arc<dyn PendingStore>,
    reservations: Option<Arc<ReceiptReservations>>,
    receipts: ReceiptPolicy,
    accepting: bool,
    waiting: Vec<AdmitRequest>,
    committing: bool,
    retry_complete: Vec<UnitId>,
    to_complete: Vec<UnitId>,
}

pub struct Ingress;

/// How many incomplete groups one expiry sweep turns into failures.
const EXPIRY_SWEEP: usize = 1_000;

impl IngressState {
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

    /// Start one store write with everything waiting.
    /// Start one store write with everything waiting: admissions and source
    /// completions share the commit (and its fsync).
    fn start_commit(&mut self) {
        if self.committing || (self.waiting.is_empty() && self.to_complete.is_empty()) {
            return;
        }
        let waiting = std::mem::take(&mut self.waiting);
        let completed = std::mem::take(&mut self.to_complete);
        let mut records = Vec::new();
        let requests: Vec<Prepared> = waiting.into_iter().map(|r| self.prepare(r, &mut records)).collect();
        self.committing = true;
        let store = self.store.clone();
        let shared = self.shared.clone();
        tokio::spawn(async move {
            if !completed.is_empty() {
                failpoint::hit("before-source-completion");
            }
            let result = if records.is_empty() && completed.is_empty() {
                Ok(Vec::new())
            } else {
                store.commit(records, &completed).await
            };
            // Stored (or not) but nobody has been told yet.
            failpoint::hit("after-admit");
            shared.dir.ingress.send(IngressMsg::Committed(Box::new(CommitBatch {
                requests,
                completed,
                result,
            })));
        });
    }

    fn finish_commit(&mut self, batch: CommitBatch) {
        self.committing = false;
        let completed = batch.completed;
        let mut outcomes = match batch.result {
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
                self.retry_complete.extend(completed);
                None
            }
        };
        let mut admitted = 0u64;
        for prepared in batch.requests {
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
        self.start_commit();
    }

    /// Queue source completions; they go with the next commit.
    fn complete(&mut self, ids: Vec<UnitId>) {
        self.to_complete.extend(ids);
        self.start_commit();
    }

    async fn expire(&mut self) {
        match self.store.expire_groups(Timestamp::now(), EXPIRY_SWEEP).await {
            Ok(0) => {}
            Ok(n) => {
                metrics::counter!("sendium_multipart_groups_expired_total").increment(n as u64);
                self.shared.dir.selector.send(crate::selector::SelectorMsg::Wake);
            }
            Err(e) => self.shared.health.pending.failed("pending", &e),
        }
    }
}

impl Actor for Ingress {
    type Msg = IngressMsg;
    type State = IngressState;
    type Arguments = IngressArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: IngressArgs,
    ) -> Result<IngressState, ActorProcessingErr> {
        // Reachable before startup work runs: replies to what pre_start sends must not be lost.
        args.shared.dir.ingress.install(myself);
        Ok(IngressState {
            shared: args.shared,
            store: args.store,
            reservations: args.reservations,
            receipts: args.receipts,
            accepting: args.accepting,
            waiting: Vec::new(),
            committing: false,
            retry_complete: Vec::new(),
            to_complete: Vec::new(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: IngressMsg,
        state: &mut IngressState,
    ) -> Result<(), ActorProcessingErr> {
        state.shared.dir.ingress.took_one();
        match msg {
            IngressMsg::Admit(req) => {
                failpoint::hit("actor-ingress");
                state.waiting.push(req);
                state.start_commit();
            }
            IngressMsg::Committed(batch) => state.finish_commit(*batch),
            IngressMsg::ReadyAfter { after, limit, reply } => {
                let _ = reply.send(state.store.ready_after(after, limit).await);
            }
            IngressMsg::Units { ids, reply } => {
                let _ = reply.send(state.store.units(&ids).await);
            }
            IngressMsg::Complete(ids) => state.complete(ids),
            IngressMsg::Tick => {
                state.expire().await;
                let retry = std::mem::take(&mut state.retry_complete);
                state.complete(retry);
                // A commit task that died with a panic would leave `committing` set;
                // the store write itself never panics, so this is only a safety net.
                state.start_commit();
            }
            IngressMsg::Status(reply) => {
                let pending = state.store.stats().await.ok();
                let _ = reply.send(IngressStatus {
                    waiting_requests: state.waiting.len() as u64,
                    committing: state.committing,
                    completions_to_retry: state.retry_complete.len() as u64,
                    pending,
                });
            }
        }
        Ok(())
    }
}

/// Admit a batch through the Ingress actor and wait for the answers. A pipeline that
/// is not running, or an Ingress that died before answering, refuses everything: a
/// submission is never acknowledged unless it was stored.
pub async fn admit(shared: &Shared, records: Vec<PendingRecord>) -> Vec<Admission> {
    let n = records.len();
    let (tx, rx) = oneshot::channel();
    if !shared
        .dir
        .ingress
        .send(IngressMsg::Admit(AdmitRequest { records, reply: tx }))
    {
        return vec![Admission::Refused(Refusal::Unavailable); n];
    }
    match tokio::time::timeout(ADMIT_TIMEOUT, rx).await {
        Ok(Ok(answers)) if answers.len() == n => answers,
        _ => vec![Admission::Refused(Refusal::Unavailable); n],
    }
}

/// Longest a client waits for admission before being told to retry.
const ADMIT_TIMEOUT: Duration = Duration::from_secs(30);
