//! Ingress: owns the pending stage.
//!
//! A submission is acknowledged only after the pending store admitted it as durably as
//! the selected backend promises. Admissions are *group committed*: while one store
//! write is in flight, newly arriving requests (from every session) wait and all of
//! them go into the next write — one commit, one fsync for durable backends, many
//! acknowledgements. The writing is done by the `committer` (a task, or a thread of its
//! own for a file store), which answers the clients itself; the actor forwards
//! admissions and completions to it and serves the Selector's and Router's reads beside
//! it.
//!
//! Ingress stamps each admitted record with the priority of the route it resolves to
//! (the Router's live table, so a reload applies to what is admitted after it; stored
//! records keep theirs): the pending stage selects by that lane, and the Router's
//! destination queues order by it too.
//!
//! Ingress also completes sources (on the Router's word that every branch and any DLR
//! handoff is terminal) and expires incomplete multipart groups at their saved deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use sendium_profiles::RouteTable;

use crate::router::{record_text, route_of};
use sendium_storage::failpoint;
use sendium_storage::{
    MessageId, PendingError, PendingRecord, PendingStats, PendingStore, ReadyCursor, ReadyUnit, ReceiptReservations,
    Timestamp, UnitId,
};
use tokio::sync::oneshot;

use crate::context::Shared;
use crate::spec::LiveRoutes;

mod committer;

use committer::{CommitterHandle, Work};

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
    /// The idempotency key was used for a different message, still retained (HTTP 409
    /// naming `idempotency_key`; an outbox row with such an `event_id` is refused).
    IdempotencyKeyReused,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::QueueFull => "queue_full",
            Refusal::ReceiptCapacity => "receipt_capacity",
            Refusal::ReceiptStoreUnavailable => "receipt_store_unavailable",
            Refusal::ReceiptsDisabled => "receipts_disabled",
            Refusal::Unavailable => "unavailable",
            Refusal::IdempotencyKeyReused => "idempotency_key_reused",
        }
    }
}

/// A batch of submissions waiting for admission (one SMPP read, or one HTTP request).
pub struct AdmitRequest {
    pub records: Vec<PendingRecord>,
    /// Admit a prefix only: once one record is refused, every later record of the
    /// request is refused too (`Unavailable`), so a caller relaying ordered messages
    /// never sees a later one admitted ahead of an earlier one.
    pub in_order: bool,
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
    ReadyAfter {
        after: ReadyCursor,
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
    /// The Router's route table (replaced by a reload): what admission stamps
    /// `route_priority` from.
    pub routes: LiveRoutes,
}

pub struct IngressState {
    shared: Arc<Shared>,
    store: Arc<dyn PendingStore>,
    committer: CommitterHandle,
    routes: LiveRoutes,
    /// An expiry sweep is running.
    expiring: Arc<AtomicBool>,
}

pub struct Ingress;

/// How many incomplete groups one expiry sweep turns into failures.
const EXPIRY_SWEEP: usize = 1_000;

impl IngressState {
    /// Give the writer work; a writer that is gone (it panicked) stops this actor, and
    /// the supervisor's restart brings a new one.
    fn hand_over(&self, work: Work) -> Result<(), ActorProcessingErr> {
        if self.committer.send(work) {
            Ok(())
        } else {
            Err("the pending store's writer stopped".into())
        }
    }

    /// Expire incomplete groups past their deadline, off the actor (like reads, so an
    /// acknowledgement never waits behind it); one sweep at a time.
    fn expire(&self) {
        if self.expiring.swap(true, Ordering::AcqRel) {
            return;
        }
        let store = self.store.clone();
        let shared = self.shared.clone();
        let expiring = self.expiring.clone();
        tokio::spawn(async move {
            match store.expire_groups(Timestamp::now(), EXPIRY_SWEEP).await {
                Ok(0) => {}
                Ok(n) => {
                    metrics::counter!("sendium_multipart_groups_expired_total").increment(n as u64);
                    shared.dir.selector.send(crate::selector::SelectorMsg::Wake);
                }
                Err(e) => shared.health.pending.failed("pending", &e),
            }
            expiring.store(false, Ordering::Release);
        });
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
        let shared = args.shared.clone();
        let store = args.store.clone();
        let routes = args.routes.clone();
        let committer = CommitterHandle::spawn(args);
        Ok(IngressState {
            shared,
            store,
            committer,
            routes,
            expiring: Arc::new(AtomicBool::new(false)),
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
            IngressMsg::Admit(mut req) => {
                failpoint::hit("actor-ingress");
                stamp_priorities(&state.routes.current(), &mut req.records);
                state.hand_over(Work::Admit(req))?;
            }
            // Reads run beside the actor, not in it: a read of the pending store takes a
            // consistent snapshot and never waits for a commit, so the actor stays free to
            // hand the finished commit's acknowledgements out and start the next one.
            IngressMsg::ReadyAfter { after, limit, reply } => {
                let store = state.store.clone();
                tokio::spawn(async move {
                    let _ = reply.send(store.ready_after(after, limit).await);
                });
            }
            IngressMsg::Units { ids, reply } => {
                let store = state.store.clone();
                tokio::spawn(async move {
                    let _ = reply.send(store.units(&ids).await);
                });
            }
            IngressMsg::Complete(ids) => state.hand_over(Work::Complete(ids))?,
            IngressMsg::Tick => {
                state.expire();
                state.hand_over(Work::Retry)?;
            }
            IngressMsg::Status(reply) => {
                let gauges = state.committer.gauges();
                let mut status = IngressStatus {
                    waiting_requests: gauges.waiting.load(Ordering::Relaxed),
                    committing: gauges.committing.load(Ordering::Relaxed),
                    completions_to_retry: gauges.to_retry.load(Ordering::Relaxed),
                    pending: None,
                };
                let store = state.store.clone();
                tokio::spawn(async move {
                    status.pending = store.stats().await.ok();
                    let _ = reply.send(status);
                });
            }
        }
        Ok(())
    }
}

/// Set each record's `route_priority` to its route's priority in `routes`, resolved as
/// the Router resolves it. A multipart part is resolved with its own text (the joined
/// text is not known before the group completes); the group's lane in the pending stage
/// is that of the part completing it.
fn stamp_priorities(routes: &RouteTable, records: &mut [PendingRecord]) {
    for record in records {
        record.route_priority = route_of(routes, record, || record_text(record)).map_or(0, |r| r.priority);
    }
}

/// Admit a batch through the Ingress actor and wait for the answers. A pipeline that
/// is not running, or an Ingress that died before answering, refuses everything: a
/// submission is never acknowledged unless it was stored.
pub async fn admit(shared: &Shared, records: Vec<PendingRecord>) -> Vec<Admission> {
    admit_request(shared, records, false).await
}

/// [`admit`] a prefix of `records`: the answers are some admissions (or duplicates)
/// followed only by refusals. The outbox relay admits so, to keep a group's order.
pub async fn admit_in_order(shared: &Shared, records: Vec<PendingRecord>) -> Vec<Admission> {
    admit_request(shared, records, true).await
}

async fn admit_request(shared: &Shared, records: Vec<PendingRecord>, in_order: bool) -> Vec<Admission> {
    let n = records.len();
    let started = std::time::Instant::now();
    let (tx, rx) = oneshot::channel();
    if !shared.dir.ingress.send(IngressMsg::Admit(AdmitRequest {
        records,
        in_order,
        reply: tx,
    })) {
        return unavailable(n);
    }
    let answers = match tokio::time::timeout(ADMIT_TIMEOUT, rx).await {
        Ok(Ok(answers)) if answers.len() == n => answers,
        // The writer is gone with the request: nobody else will count it.
        Ok(Err(_)) => unavailable(n),
        // The writer still has the request and counts what its commit decides.
        _ => vec![Admission::Refused(Refusal::Unavailable); n],
    };
    // One observation per submission, not per batch: a stall that holds a batch of 50
    // back is 50 late answers, and the histogram must weigh it so to match what ESMEs see.
    metrics::histogram!("sendium_admission_seconds").record_many(started.elapsed().as_secs_f64(), n);
    answers
}

/// Longest a client waits for admission before being told to retry.
const ADMIT_TIMEOUT: Duration = Duration::from_secs(30);

/// `n` refusals for a request the pending writer will never answer (the Ingress not
/// running, or the writer gone with it), counted as the writer counts its own.
fn unavailable(n: usize) -> Vec<Admission> {
    let refusal = Refusal::Unavailable;
    metrics::counter!("sendium_admissions_refused_total", "reason" => refusal.as_str()).increment(n as u64);
    vec![Admission::Refused(refusal); n]
}

#[cfg(test)]
mod tests {
    use sendium_storage::{Address, Channel};

    use super::*;

    fn routes() -> RouteTable {
        let cfg = sendium_profiles::load_str(
            r#"
[[destinations]]
name = "a"
kind = "simulator"
[[routes]]
name = "otp"
destination-prefix = "44"
text-regex = "code"
to = ["a"]
priority = 9
[[routes]]
name = "uk"
destination-prefix = "44"
to = ["a"]
priority = 3
[[routes]]
name = "rest"
destination-prefix = ""
to = ["a"]
"#,
        )
        .unwrap();
        RouteTable::from_config(&cfg)
    }

    fn record(to: &str, text: &str) -> PendingRecord {
        PendingRecord {
            id: MessageId::generate(),
            account: "esme1".into(),
            channel: Channel::Smpp,
            source: Address::new(5, 0, "Shop"),
            destination: Address::new(1, 1, to),
            service_type: String::new(),
            esm_class: 0,
            protocol_id: 0,
            priority: 0,
            data_coding: 0,
            payload: text.as_bytes().to_vec(),
            part: None,
            registered_delivery: 0,
            callback_url: None,
            idempotency_key: None,
            accepted_at: Timestamp::now(),
            valid_until: None,
            dlr_mask: None,
            route_priority: 7,
            destination_hint: None,
            deliver_at: None,
        }
    }

    #[test]
    fn each_record_gets_the_priority_of_the_route_it_resolves_to() {
        let mut records = vec![
            record("447700900123", "your code is 1234"),
            record("447700900123", "big sale"),
            record("33612345678", "your code is 1234"),
        ];
        stamp_priorities(&routes(), &mut records);
        let got: Vec<u8> = records.iter().map(|r| r.route_priority).collect();
        assert_eq!(got, vec![9, 3, 0], "text rule, prefix rule, a route without priority");
    }
}
