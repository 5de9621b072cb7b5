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
//!
//! What arrives is gathered into write steps in `steps.rs`; due deliveries are claimed
//! and sent on their way in `rounds.rs` (the sending itself is [`deliver`] and
//! [`kannel`]); the reports of both reach a restarted correlator through `handover.rs`;
//! `acks.rs` answers the providers.

mod acks;
pub mod deliver;
mod handover;
pub mod kannel;
mod rounds;
mod steps;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use sendium_protocols::callback::CallbackTargets;
use sendium_storage::failpoint;
use sendium_storage::ids::{IdMap, IdSet};
use sendium_storage::{
    DeliveryId, DlrCapabilities, DlrStats, DlrStore, Handoff, InboundPart, IntermediateReceipt, ProviderReceipt,
    RoutedInbound, Timestamp,
};

use crate::context::Shared;
pub use acks::ReceiptAcks;
pub use handover::{Handover, Report};
use steps::Step;

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
    inbound_in_flight: IdMap<DeliveryId, String>,
    /// Multipart groups queued or being written (not asked for again meanwhile).
    groups_writing: IdSet<u64>,
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

pub struct DlrCorrelator;

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
            inbound_in_flight: IdMap::default(),
            groups_writing: IdSet::default(),
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
