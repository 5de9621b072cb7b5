//! DestinationWorker: one per configured destination.
//!
//! Holds a bounded in-memory window of branches (the Router gives it no more than its
//! credit), splits each into provider parts, submits them over the destination's
//! session(s) within window and TPS, retries transient refusals (ESME_RTHROTTLED,
//! ESME_RMSGQFUL, ESME_RSYSERR) with backoff, ends a branch on a permanent error, and
//! reports every branch outcome to the Router. A branch this destination cannot take is
//! handed back to the Router (*bounced*), which moves it to the next reachable
//! destination of its route or holds it until one is reachable:
//!
//! - at once when a submission of it was left unanswered: the session was lost, or
//!   no response came within the response timeout (the provider may still deliver
//!   it: at least once);
//! - when the destination has been unreachable for `failover-after`: everything the
//!   worker holds;
//! - when the provider has kept refusing it as throttled or full for `failover-after`.
//!
//! Receipts arriving from the provider go to the DlrCorrelator, and are acknowledged to
//! the provider only after the DLR store took them.
//!
//! A worker stores nothing: a crash loses its window, and the Router re-dispatches the
//! open branches (at least once: a part the provider accepted just before the crash is
//! sent again).
//!
//! A reload that removes or changes its destination *retires* the worker: it reports
//! itself down, gives back untried every branch none of whose parts the provider has
//! or may have (so the Router places it elsewhere, or on the replacement), lets the
//! submissions in flight finish, and stops once it holds nothing — at the latest after
//! [`RETIRE_LIMIT`]. A changed destination's new worker then binds with the new
//! settings.

pub mod outbound;
pub mod receipts;
mod simulator;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use sendium_protocols::http_provider::{HttpProvider, HttpProviderConfig, HttpSubmit};
use sendium_protocols::receipt::{IdFormat, resp_key};
use sendium_protocols::smpp::client::{ClientEvent, ClientEvents, OutboundSubmit, SmppClient, SubmitFailure};
use sendium_storage::failpoint;
use sendium_storage::ids::IdMap;
use sendium_storage::{BranchFailure, Unit};

use crate::context::Shared;
use crate::directory::Mailbox;
use crate::dlr_correlator::{InboundBatch, ReceiptAcks, ReceiptBatch};
use crate::inbound::{self, Arrival, MoEvent};
use crate::router::{BranchKey, RouterMsg, WorkerOutcome, WorkerResult};

pub use simulator::SimulatorConfig;

/// Inbound messages from one batch of provider events, to store before answering.
#[derive(Default)]
struct InboundArrivals {
    routed: Vec<sendium_storage::RoutedInbound>,
    parts: Vec<sendium_storage::InboundPart>,
    acks: Vec<sendium_protocols::smpp::client::DeliverAck>,
}

/// A branch given to a worker.
#[derive(Clone, Debug)]
pub struct BranchJob {
    pub key: BranchKey,
    pub unit: Arc<Unit>,
    /// Ask the provider for receipts (the message owes its client one).
    pub request_receipt: bool,
}

pub enum WorkerMsg {
    Dispatch(Vec<BranchJob>),
    /// Events from the provider session(s).
    Client(Vec<ClientEvent>),
    /// Simulated provider: acknowledge the parts of these jobs now.
    Tick,
    /// Tell the Router whether this destination is up.
    ReportState,
    /// A reload removed or changed this destination: finish and stop (see the module
    /// docs).
    Retire,
    Status(RpcReplyPort<WorkerStatus>),
}

#[derive(Clone, Debug, Default)]
pub struct WorkerStatus {
    pub up: bool,
    /// A reload removed or changed the destination: this worker is finishing.
    pub retiring: bool,
    /// When `up` last changed (or the worker started).
    pub since: Option<Instant>,
    pub branches: u64,
    pub parts_in_flight: u64,
    pub retries_waiting: u64,
    pub submitted_total: u64,
    /// An HTTP destination's requests by the class they ended in.
    pub http_results: Option<Vec<(&'static str, u64)>>,
}

/// How a destination is reached.
pub enum Provider {
    Smpp(SmppClient),
    Simulator(SimulatorConfig),
    /// An HTTP API; `split`: one request per SMS part, else one with the whole text.
    Http {
        client: HttpProvider,
        split: bool,
    },
}

pub struct WorkerArgs {
    pub shared: Arc<Shared>,
    pub name: String,
    /// Its mailbox in the directory.
    pub mailbox: Arc<Mailbox<WorkerMsg>>,
    pub id_format: IdFormat,
    pub provider: ProviderSpec,
    /// See [`crate::spec::DestinationSpec::failover_after`].
    pub failover_after: Duration,
}

/// How to build the provider connection when the worker (re)starts.
pub enum ProviderSpec {
    Smpp(sendium_protocols::smpp::client::ClientConfig),
    Simulator(SimulatorConfig),
    Http { config: HttpProviderConfig, split: bool },
}

/// Forwards session events into the worker's mailbox, one batch per wake-up.
struct EventSink {
    mailbox: Arc<Mailbox<WorkerMsg>>,
}

impl ClientEvents for EventSink {
    fn on_events(&self, events: Vec<ClientEvent>) {
        self.mailbox.send(WorkerMsg::Client(events));
    }
}

struct Part {
    pdu: OutboundSubmit,
    token: Option<u64>,
    provider_id: Option<String>,
}

struct Job {
    key: BranchKey,
    parts: Vec<Part>,
    attempts: u32,
    /// Since when the provider has refused it as throttled or full, without accepting
    /// any part in between.
    throttled_since: Option<Instant>,
}

pub struct WorkerState {
    shared: Arc<Shared>,
    name: String,
    mailbox: Arc<Mailbox<WorkerMsg>>,
    id_format: IdFormat,
    provider: Provider,
    up: bool,
    /// When `up` last changed (or the worker started).
    since: Instant,
    failover_after: Duration,
    jobs: IdMap<BranchKey, Job>,
    tokens: IdMap<u64, (BranchKey, usize)>,
    next_reference: u8,
    /// Parts waiting for their retry time (or for the session to come up).
    retry: BTreeMap<(Instant, u64), (BranchKey, usize)>,
    retry_seq: u64,
    outcomes: Vec<WorkerOutcome>,
    submitted_total: u64,
    sim: simulator::SimState,
    /// Since when the worker is retiring.
    retiring: Option<Instant>,
}

pub struct DestinationWorker;

/// The longest a retiring worker waits for its submissions in flight: what it still
/// holds then is handed back (and may reach the provider twice).
pub const RETIRE_LIMIT: Duration = Duration::from_secs(60);

/// Submit tokens are unique across worker incarnations, so a late event from a dead
/// incarnation's session can never be mistaken for one of the new incarnation's parts.
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

/// Transient failures are retried 200 ms, 400 ms, 800 ms … after, at most 5 s apart:
/// throttling and full queues clear quickly, and a lost session reconnects on its own
/// backoff, so a long wait here would only add latency.
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);

fn backoff(attempts: u32) -> Duration {
    let factor = 1u32 << attempts.saturating_sub(1).min(8);
    (RETRY_MIN * factor).min(RETRY_MAX)
}

impl WorkerState {
    fn dispatch(&mut self, jobs: Vec<BranchJob>) {
        if self.retiring.is_some() {
            for job in jobs {
                self.outcomes.push(WorkerOutcome {
                    key: job.key,
                    destination: self.name.clone(),
                    result: WorkerResult::Returned,
                });
            }
            return;
        }
        let mut send = Vec::new();
        for job in jobs {
            if self.jobs.contains_key(&job.key) {
                // Already in our window (a Router restart re-dispatched it).
                continue;
            }
            self.next_reference = self.next_reference.wrapping_add(1);
            let built = match &self.provider {
                Provider::Http { split: false, .. } => outbound::build_whole(&job.unit, job.request_receipt),
                _ => outbound::build_parts(&job.unit, job.request_receipt, self.next_reference),
            };
            let parts = match built {
                Ok(p) => p,
                Err(failure) => {
                    self.outcomes.push(WorkerOutcome {
                        key: job.key,
                        destination: self.name.clone(),
                        result: WorkerResult::Failed(failure),
                    });
                    continue;
                }
            };
            if let Provider::Simulator(cfg) = &self.provider {
                let result = self.sim.accept(cfg, &job, &parts, self.id_format);
                self.submitted_total += 1;
                self.outcomes.push(WorkerOutcome {
                    key: job.key,
                    destination: self.name.clone(),
                    result,
                });
                continue;
            }
            let key = job.key;
            self.jobs.insert(
                key,
                Job {
                    key,
                    parts: parts
                        .into_iter()
                        .map(|pdu| Part {
                            pdu,
                            token: None,
                            provider_id: None,
                        })
                        .collect(),
                    attempts: 0,
                    throttled_since: None,
                },
            );
            if let Some(job) = self.jobs.get(&key) {
                for i in 0..job.parts.len() {
                    send.push((key, i));
                }
            }
        }
        self.submit(send);
    }

    /// Submit parts now if the session is up, else park them until it is.
    fn submit(&mut self, parts: Vec<(BranchKey, usize)>) {
        if parts.is_empty() {
            return;
        }
        if matches!(self.provider, Provider::Simulator(_)) {
            return;
        }
        // Down, or stopping: park them (a stop lets what is in flight finish, and the
        // parked parts are in the durable stages for the next start).
        if !self.up || self.shared.stopping.holding_submissions() {
            let now = Instant::now();
            for p in parts {
                self.retry_seq += 1;
                self.retry.insert((now, self.retry_seq), p);
            }
            return;
        }
        let mut batch = Vec::with_capacity(parts.len());
        let is_http = matches!(self.provider, Provider::Http { .. });
        let mut part_ids = Vec::new();
        for (key, idx) in parts {
            let Some(job) = self.jobs.get_mut(&key) else {
                continue;
            };
            let Some(part) = job.parts.get_mut(idx) else {
                continue;
            };
            if part.provider_id.is_some() || part.token.is_some() {
                continue;
            }
            let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
            part.token = Some(token);
            self.tokens.insert(token, (key, idx));
            batch.push((token, part.pdu.clone()));
            // Sendium's own id of the part, the provider id unless an id-pointer says
            // otherwise: stable across retries and restarts.
            if is_http {
                part_ids.push(format!("{}-{}-{}", key.unit, key.branch, idx + 1));
            }
        }
        if !batch.is_empty() {
            match &self.provider {
                Provider::Smpp(client) => client.submit(batch),
                Provider::Http { client, .. } => client.submit(
                    batch
                        .into_iter()
                        .zip(part_ids)
                        .map(|((token, part), id)| (token, HttpSubmit { part, id }))
                        .collect(),
                ),
                Provider::Simulator(_) => {}
            }
            failpoint::hit("after-provider-submit");
        }
    }

    fn on_events(&mut self, events: Vec<ClientEvent>) {
        let mut receipts = Vec::new();
        let mut intermediate = Vec::new();
        let mut acks = Vec::new();
        let mut mo_acks = Vec::new();
        let mut refused = Vec::new();
        let mut arrived = InboundArrivals::default();
        let mo = self.shared.mo.current();
        let now = sendium_storage::Timestamp::now();
        for ev in events {
            match ev {
                ClientEvent::Up => {
                    tracing::info!(destination = %self.name, "destination bound");
                    if !self.up {
                        self.since = Instant::now();
                    }
                    self.up = true;
                    self.report_state();
                    self.retry_due(true);
                }
                ClientEvent::Down { reason } => {
                    if self.up {
                        tracing::warn!(destination = %self.name, %reason, "destination down");
                        self.since = Instant::now();
                    }
                    self.up = false;
                    self.report_state();
                }
                ClientEvent::SubmitResult { token, result } => self.submit_result(token, result),
                ClientEvent::Deliver { pdu, ack } => match receipts::classify(&self.name, self.id_format, &pdu) {
                    receipts::Inbound::Final(r) => {
                        receipts.push(r);
                        acks.push(ack);
                    }
                    receipts::Inbound::Intermediate(r) => {
                        intermediate.push(r);
                        mo_acks.push(ack);
                    }
                    receipts::Inbound::MobileOriginated => {
                        let counts = self.shared.mo.counts();
                        counts.add(MoEvent::Received, &self.name, 1);
                        match inbound::arrival(&mo, &self.name, &pdu, now) {
                            Arrival::Routed(r) => {
                                arrived.routed.push(r);
                                arrived.acks.push(ack);
                            }
                            Arrival::Part(p) => {
                                arrived.parts.push(p);
                                arrived.acks.push(ack);
                            }
                            Arrival::Unrouted => {
                                counts.add(MoEvent::Unrouted, &self.name, 1);
                                tracing::info!(destination = %self.name, "inbound message matches no [[mo-routes]] entry");
                                match mo.unrouted {
                                    sendium_profiles::MoUnrouted::Ack => mo_acks.push(ack),
                                    sendium_profiles::MoUnrouted::Reject => refused.push(ack),
                                }
                            }
                            Arrival::Malformed => {
                                counts.add(MoEvent::Malformed, &self.name, 1);
                                refused.push(ack);
                            }
                        }
                    }
                    receipts::Inbound::Unreadable => {
                        metrics::counter!("sendium_receipts_unreadable_total", "destination" => self.name.clone())
                            .increment(1);
                        mo_acks.push(ack);
                    }
                },
            }
        }
        if let Provider::Smpp(client) = &self.provider {
            if !mo_acks.is_empty() {
                client.ack(mo_acks.into_iter().map(|a| (a, 0)).collect());
            }
            if !refused.is_empty() {
                client.ack(refused.into_iter().map(|a| (a, inbound::REJECTED)).collect());
            }
            if !arrived.acks.is_empty() {
                let batch = InboundBatch {
                    destination: self.name.clone(),
                    routed: arrived.routed,
                    parts: arrived.parts,
                    acks: Some(ReceiptAcks::new(client.acker(), arrived.acks)),
                };
                // Acknowledged to the provider once stored; answered with a temporary
                // error (the provider sends them again) if the correlator is not running.
                self.shared.dir.dlr.send(crate::dlr_correlator::DlrMsg::Inbound(batch));
            }
            // Acknowledged at once, as every intermediate receipt is: stored as type 4
            // reports when a Kannel dlr-url asks for them (lost if the process stops before
            // that write).
            if !intermediate.is_empty() && self.shared.dlr_enabled {
                self.shared
                    .dir
                    .dlr
                    .send(crate::dlr_correlator::DlrMsg::Intermediate(intermediate));
            }
            if !receipts.is_empty() {
                metrics::counter!("sendium_provider_receipts_total", "destination" => self.name.clone())
                    .increment(receipts.len() as u64);
                let batch = ReceiptBatch {
                    destination: self.name.clone(),
                    receipts,
                    acks: Some(ReceiptAcks::new(client.acker(), acks)),
                };
                // If the correlator is not running the batch is answered with a
                // temporary error and the provider sends the receipts again.
                self.shared.send_receipts(batch);
            }
        }
    }

    fn submit_result(&mut self, token: u64, result: Result<String, SubmitFailure>) {
        let Some((key, idx)) = self.tokens.remove(&token) else {
            return;
        };
        let Some(job) = self.jobs.get_mut(&key) else {
            return;
        };
        let Some(part) = job.parts.get_mut(idx) else {
            return;
        };
        if part.token != Some(token) {
            return;
        }
        part.token = None;
        match result {
            Ok(provider_id) => {
                part.provider_id = Some(provider_id);
                job.throttled_since = None;
                if job.parts.iter().all(|p| p.provider_id.is_some()) {
                    self.finish_submitted(key);
                }
            }
            // Unanswered: the provider may have it, but cannot be asked. Move it on.
            Err(f @ (SubmitFailure::Disconnected | SubmitFailure::Timeout)) => {
                metrics::counter!("sendium_provider_retries_total", "destination" => self.name.clone(), "reason" => f.label())
                    .increment(1);
                self.bounce(key, f.label());
            }
            Err(f) if f.is_transient() => {
                metrics::counter!("sendium_provider_retries_total", "destination" => self.name.clone(), "reason" => f.label())
                    .increment(1);
                let now = Instant::now();
                if matches!(f, SubmitFailure::Status(_)) {
                    let since = *job.throttled_since.get_or_insert(now);
                    if now.duration_since(since) >= self.failover_after {
                        self.bounce(key, "throttled");
                        return;
                    }
                }
                job.attempts += 1;
                let at = now + backoff(job.attempts);
                self.retry_seq += 1;
                self.retry.insert((at, self.retry_seq), (key, idx));
            }
            Err(f) => {
                let status = f.status().unwrap_or(0);
                metrics::counter!("sendium_provider_rejections_total", "destination" => self.name.clone()).increment(1);
                self.finish(key, WorkerResult::Failed(BranchFailure::Rejected { status }));
            }
        }
    }

    fn finish_submitted(&mut self, key: BranchKey) {
        let Some(job) = self.jobs.get(&key) else {
            return;
        };
        let provider_ids: Vec<String> = job.parts.iter().filter_map(|p| p.provider_id.clone()).collect();
        let keys = provider_ids.iter().map(|id| resp_key(self.id_format, id)).collect();
        self.submitted_total += 1;
        self.finish(key, WorkerResult::Submitted { provider_ids, keys });
    }

    /// Hand a branch back to the Router to be placed elsewhere (see the module docs).
    fn bounce(&mut self, key: BranchKey, reason: &'static str) {
        metrics::counter!("sendium_branches_bounced_total", "destination" => self.name.clone(), "reason" => reason)
            .increment(1);
        self.finish(key, WorkerResult::Bounced);
    }

    /// Unreachable for `failover-after`: hand back everything this worker holds.
    fn bounce_if_unreachable(&mut self) {
        if self.up || self.jobs.is_empty() || self.since.elapsed() < self.failover_after {
            return;
        }
        let keys: Vec<BranchKey> = self.jobs.keys().copied().collect();
        for key in keys {
            self.bounce(key, "unreachable");
        }
    }

    fn finish(&mut self, key: BranchKey, result: WorkerResult) {
        if let Some(job) = self.jobs.remove(&key) {
            for p in job.parts {
                if let Some(t) = p.token {
                    self.tokens.remove(&t);
                }
            }
            debug_assert_eq!(job.key, key);
        }
        self.outcomes.push(WorkerOutcome {
            key,
            destination: self.name.clone(),
            result,
        });
    }

    /// The session's events reach this worker through its mailbox, which does not
    /// exist yet while the worker is starting: an `Up` sent then is lost. The client's
    /// own state is the truth; align with it.
    fn sync_up(&mut self) {
        let up = match &self.provider {
            Provider::Smpp(client) => client.is_up(),
            Provider::Http { client, .. } => client.is_up(),
            Provider::Simulator(_) => return,
        };
        if up != self.up {
            let event = if up {
                ClientEvent::Up
            } else {
                ClientEvent::Down {
                    reason: "session not bound".into(),
                }
            };
            self.on_events(vec![event]);
        }
    }

    /// Resubmit parts whose retry time has come (all parked ones when `all`).
    fn retry_due(&mut self, all: bool) {
        if !self.up || self.shared.stopping.holding_submissions() {
            return;
        }
        let now = Instant::now();
        let mut due = Vec::new();
        while let Some((&(at, seq), _)) = self.retry.first_key_value() {
            if !all && at > now {
                break;
            }
            if let Some(p) = self.retry.remove(&(at, seq)) {
                due.push(p);
            }
        }
        self.submit(due);
    }

    /// Tell the Router whether this destination can take work (never while retiring).
    fn report_state(&self) {
        let up = self.up && self.retiring.is_none();
        self.shared.links.set(&self.name, up);
        self.shared.dir.router.send(RouterMsg::DestinationState {
            name: self.name.clone(),
            up,
        });
    }

    /// Start retiring (see the module docs).
    fn retire(&mut self) {
        if self.retiring.is_none() {
            tracing::info!(destination = %self.name, "destination worker retiring");
            self.retiring = Some(Instant::now());
        }
        self.report_state();
        self.give_back_untried();
    }

    /// While retiring, give back every branch the provider has no part of and is not
    /// being asked about — every branch once the session is down or the limit passed.
    fn give_back_untried(&mut self) {
        let Some(since) = self.retiring else {
            return;
        };
        let all = !self.up || since.elapsed() >= RETIRE_LIMIT;
        let keys: Vec<BranchKey> = self
            .jobs
            .values()
            .filter(|j| all || j.parts.iter().all(|p| p.token.is_none() && p.provider_id.is_none()))
            .map(|j| j.key)
            .collect();
        for key in keys {
            self.retry.retain(|_, (k, _)| *k != key);
            self.finish(key, WorkerResult::Returned);
        }
    }

    /// Retiring and holding nothing more: time to stop.
    fn retired(&self) -> bool {
        self.retiring.is_some() && self.jobs.is_empty()
    }

    fn flush(&mut self) {
        if !self.outcomes.is_empty() {
            let outcomes = std::mem::take(&mut self.outcomes);
            self.shared.dir.router.send(RouterMsg::Outcomes(outcomes));
        }
        if let Provider::Simulator(_) = &self.provider {
            self.sim.flush(&self.shared, &self.name);
        }
    }
}

impl Actor for DestinationWorker {
    type Msg = WorkerMsg;
    type State = WorkerState;
    type Arguments = WorkerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: WorkerArgs,
    ) -> Result<WorkerState, ActorProcessingErr> {
        // Reachable before the session starts: its first events must not be lost.
        args.mailbox.install(myself);
        let (provider, up) = match args.provider {
            ProviderSpec::Smpp(cfg) => {
                let sink = Arc::new(EventSink {
                    mailbox: args.mailbox.clone(),
                });
                (Provider::Smpp(SmppClient::start(cfg, sink)), false)
            }
            ProviderSpec::Simulator(cfg) => (Provider::Simulator(cfg), true),
            ProviderSpec::Http { config, split } => {
                let sink = Arc::new(EventSink {
                    mailbox: args.mailbox.clone(),
                });
                (
                    Provider::Http {
                        client: HttpProvider::start(config, sink),
                        split,
                    },
                    false,
                )
            }
        };
        Ok(WorkerState {
            shared: args.shared,
            name: args.name,
            mailbox: args.mailbox,
            id_format: args.id_format,
            provider,
            up,
            since: Instant::now(),
            failover_after: args.failover_after,
            jobs: IdMap::default(),
            tokens: IdMap::default(),
            next_reference: 0,
            retry: BTreeMap::new(),
            retry_seq: 0,
            outcomes: Vec::new(),
            submitted_total: 0,
            sim: simulator::SimState::default(),
            retiring: None,
        })
    }

    async fn post_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut WorkerState,
    ) -> Result<(), ActorProcessingErr> {
        state.report_state();
        Ok(())
    }

    async fn post_stop(&self, _myself: ActorRef<Self::Msg>, state: &mut WorkerState) -> Result<(), ActorProcessingErr> {
        match &state.provider {
            Provider::Smpp(client) => client.stop(),
            Provider::Http { client, .. } => client.stop(),
            Provider::Simulator(_) => {}
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: WorkerMsg,
        state: &mut WorkerState,
    ) -> Result<(), ActorProcessingErr> {
        state.mailbox.took_one();
        match msg {
            WorkerMsg::Dispatch(jobs) => {
                failpoint::hit("actor-worker");
                state.dispatch(jobs);
            }
            WorkerMsg::Client(events) => state.on_events(events),
            WorkerMsg::Tick => {
                state.sync_up();
                state.retry_due(false);
                state.bounce_if_unreachable();
                state.give_back_untried();
            }
            WorkerMsg::ReportState => state.report_state(),
            WorkerMsg::Retire => state.retire(),
            WorkerMsg::Status(reply) => {
                let _ = reply.send(WorkerStatus {
                    up: state.up,
                    retiring: state.retiring.is_some(),
                    since: Some(state.since),
                    branches: state.jobs.len() as u64,
                    parts_in_flight: state.tokens.len() as u64,
                    retries_waiting: state.retry.len() as u64,
                    submitted_total: state.submitted_total,
                    http_results: match &state.provider {
                        Provider::Http { client, .. } => Some(client.results()),
                        _ => None,
                    },
                });
            }
        }
        state.flush();
        if state.retired() {
            tracing::info!(destination = %state.name, "destination worker retired");
            myself.stop(Some("retired".into()));
        }
        Ok(())
    }
}
