//! DlrCorrelator: owns the DLR store.
//!
//! It takes the Router's handoffs (provider correlations and receipt targets, one per
//! branch at its provider outcome), matches the provider receipts the workers forward,
//! and delivers each message's receipts downstream: as deliver_sm to a bound
//! receiver/transceiver session of the originating account (held until one binds,
//! within retention), or as an HTTP callback with retries. A provider's receipt is
//! acknowledged to the provider only after the store took it, so with a durable DLR
//! store a crash never loses an acknowledged receipt.

pub mod deliver;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use sendium_protocols::smpp::client::{Acker, DeliverAck};
use sendium_storage::failpoint;
use sendium_storage::{
    Delivery, DeliveryFinish, DlrStats, DlrStore, Handoff, ProviderReceipt, ReceiptMatch, ReplyPath, Timestamp,
};

use crate::context::Shared;
use crate::router::{BranchKey, RouterMsg};

/// Provider deliver_sm acknowledgements, sent once the receipts are stored.
///
/// Holds an [`Acker`], not a client handle: acknowledgements pending for a crashed
/// worker's sessions must not keep those sessions alive.
///
/// Dropped unanswered (the correlator died holding them), they answer with a temporary
/// error, so the provider keeps the receipts and sends them again.
pub struct ReceiptAcks {
    client: Acker,
    acks: Vec<DeliverAck>,
}

/// ESME_RX_T_APPN: temporary application error — the SMSC keeps the receipt and
/// sends it again later.
const TEMPORARY_ERROR: u32 = 0x64;

impl ReceiptAcks {
    pub fn new(client: Acker, acks: Vec<DeliverAck>) -> Self {
        Self { client, acks }
    }

    pub fn ok(self) {
        self.client.ack(self.acks.into_iter().map(|a| (a, 0)).collect());
    }

    pub fn fail(self) {
        self.client
            .ack(self.acks.into_iter().map(|a| (a, TEMPORARY_ERROR)).collect());
    }
}

/// Receipts from one destination.
pub struct ReceiptBatch {
    pub destination: String,
    pub receipts: Vec<ProviderReceipt>,
    pub acks: Option<ReceiptAcks>,
}

pub enum DlrMsg {
    HandOff(Vec<Handoff>),
    ProviderReceipts(ReceiptBatch),
    /// Claim and deliver due receipts.
    DeliverDue,
    /// An account bound a receiving session: its held receipts are due now.
    AccountBound(String),
    /// Results of delivery attempts (from delivery tasks).
    Delivered(Vec<DeliveryFinish>),
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
}

pub struct DlrState {
    shared: Arc<Shared>,
    store: Arc<dyn DlrStore>,
    http: reqwest::Client,
    in_flight: usize,
    deliver_scheduled: bool,
    ticks: u64,
}

pub struct DlrCorrelator;

/// Deliveries claimed per round, and at most in flight at once.
const CLAIM_BATCH: usize = 2_000;
const MAX_IN_FLIGHT: usize = 20_000;
/// A claimed delivery not reported back in this long becomes due again.
const LEASE: Duration = Duration::from_secs(60);
/// Concurrent HTTP callbacks.
const HTTP_CONCURRENCY: usize = 64;

impl DlrState {
    /// Coalesce delivery rounds: at most one `DeliverDue` waits in the mailbox. (A send
    /// can fail while this actor is still being installed; then nothing is pending.)
    fn schedule_delivery(&mut self) {
        if !self.deliver_scheduled {
            self.deliver_scheduled = self.shared.dir.dlr.send(DlrMsg::DeliverDue);
        }
    }

    async fn hand_off(&mut self, batch: Vec<Handoff>) {
        let keys: Vec<BranchKey> = batch
            .iter()
            .map(|h| BranchKey {
                unit: h.unit,
                branch: h.branch,
            })
            .collect();
        match self.store.hand_off(batch).await {
            Ok(()) => {
                self.shared.health.dlr.ok();
                failpoint::hit("after-dlr-handoff");
                metrics::counter!("sendium_dlr_handoffs_total").increment(keys.len() as u64);
                self.shared.dir.router.send(RouterMsg::HandedOff(keys));
                self.schedule_delivery();
            }
            Err(e) => {
                self.shared.health.dlr.failed("dlr", &e);
                self.shared.dir.router.send(RouterMsg::HandoffFailed(keys));
            }
        }
    }

    async fn receipts(&mut self, batch: ReceiptBatch) {
        let n = batch.receipts.len() as u64;
        match self.store.record_receipts(batch.receipts).await {
            Ok(matches) => {
                self.shared.health.dlr.ok();
                if let Some(acks) = batch.acks {
                    acks.ok();
                }
                let mut resolved = false;
                let (mut matched, mut duplicate, mut orphaned) = (0u64, 0u64, 0u64);
                for m in matches {
                    match m {
                        ReceiptMatch::Matched { resolved: r, .. } => {
                            matched += 1;
                            resolved |= r;
                        }
                        ReceiptMatch::Duplicate { .. } => duplicate += 1,
                        ReceiptMatch::Orphaned => orphaned += 1,
                    }
                }
                let dest = batch.destination;
                metrics::counter!("sendium_receipts_matched_total", "destination" => dest.clone()).increment(matched);
                metrics::counter!("sendium_receipts_duplicate_total", "destination" => dest.clone())
                    .increment(duplicate);
                metrics::counter!("sendium_receipts_unmatched_total", "destination" => dest).increment(orphaned);
                if resolved {
                    self.schedule_delivery();
                }
            }
            Err(e) => {
                tracing::warn!(receipts = n, error = %e, "could not store provider receipts; the provider will resend");
                self.shared.health.dlr.failed("dlr", &e);
                if let Some(acks) = batch.acks {
                    acks.fail();
                }
            }
        }
    }

    async fn deliver_due(&mut self) {
        self.deliver_scheduled = false;
        if self.in_flight >= MAX_IN_FLIGHT {
            return;
        }
        let limit = CLAIM_BATCH.min(MAX_IN_FLIGHT - self.in_flight);
        let claimed = match self.store.claim_due(Timestamp::now(), LEASE, limit).await {
            Ok(c) => {
                self.shared.health.dlr.ok();
                c
            }
            Err(e) => {
                self.shared.health.dlr.failed("dlr", &e);
                return;
            }
        };
        if claimed.is_empty() {
            return;
        }
        let full = claimed.len() == limit;
        self.in_flight += claimed.len();
        let mut smpp: HashMap<String, Vec<Delivery>> = HashMap::new();
        let mut http = Vec::new();
        let mut parked = Vec::new();
        for d in claimed {
            match &d.target.reply {
                ReplyPath::Smpp => {
                    if self.shared.sessions.receivers(&d.target.account) == 0 {
                        // Nobody to deliver to: hold it until the account binds.
                        parked.push(DeliveryFinish {
                            id: d.id,
                            attempt: d.attempt,
                            result: sendium_storage::DeliveryResult::Retry { at: d.expires_at },
                        });
                    } else {
                        smpp.entry(d.target.account.clone()).or_default().push(d);
                    }
                }
                ReplyPath::Http { .. } => http.push(d),
            }
        }
        if !parked.is_empty() {
            self.in_flight -= parked.len();
            self.finish(parked).await;
        }
        for (account, deliveries) in smpp {
            let shared = self.shared.clone();
            tokio::spawn(async move {
                let results = deliver::smpp(&shared.sessions, &account, &deliveries).await;
                shared.dir.dlr.send(DlrMsg::Delivered(results));
            });
        }
        if !http.is_empty() {
            let shared = self.shared.clone();
            let client = self.http.clone();
            tokio::spawn(async move {
                use futures::StreamExt;
                let results: Vec<DeliveryFinish> = futures::stream::iter(http)
                    .map(|d| {
                        let client = client.clone();
                        async move {
                            let url = match &d.target.reply {
                                ReplyPath::Http { url } => url.clone(),
                                ReplyPath::Smpp => String::new(),
                            };
                            deliver::http(&client, &url, &d).await
                        }
                    })
                    .buffer_unordered(HTTP_CONCURRENCY)
                    .collect()
                    .await;
                shared.dir.dlr.send(DlrMsg::Delivered(results));
            });
        }
        if full {
            self.schedule_delivery();
        }
    }

    async fn finish(&mut self, results: Vec<DeliveryFinish>) {
        let delivered = results
            .iter()
            .filter(|r| r.result == sendium_storage::DeliveryResult::Delivered)
            .count() as u64;
        let dead = results
            .iter()
            .filter(|r| r.result == sendium_storage::DeliveryResult::Dead)
            .count() as u64;
        if let Err(e) = self.store.finish(results).await {
            // The claims lapse and the receipts go again: at least once downstream.
            self.shared.health.dlr.failed("dlr", &e);
            return;
        }
        metrics::counter!("sendium_receipts_delivered_total").increment(delivered);
        if dead > 0 {
            metrics::counter!("sendium_receipts_dead_total").increment(dead);
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
        // The tick runs a delivery round itself, so a lost DeliverDue never stalls receipts.
        self.deliver_due().await;
        if self.ticks.is_multiple_of(10) {
            // Receipts parked for accounts that are bound now (a bind notice can be lost
            // while this actor restarts).
            self.wake_bound_accounts().await;
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
        let http = reqwest::Client::builder()
            .timeout(args.callback_timeout)
            .user_agent(concat!("sendium/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(DlrState {
            shared: args.shared,
            store: args.store,
            http,
            in_flight: 0,
            deliver_scheduled: false,
            ticks: 0,
        })
    }

    async fn post_start(&self, _myself: ActorRef<Self::Msg>, state: &mut DlrState) -> Result<(), ActorProcessingErr> {
        // Claims of a previous incarnation lapse by their lease; anything due goes now,
        // and receipts held for accounts bound meanwhile are due too.
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
                state.hand_off(batch).await;
            }
            DlrMsg::ProviderReceipts(batch) => state.receipts(batch).await,
            DlrMsg::DeliverDue => state.deliver_due().await,
            DlrMsg::AccountBound(account) => match state.store.wake_account(&account, Timestamp::now()).await {
                Ok(n) if n > 0 => state.schedule_delivery(),
                Ok(_) => {}
                Err(e) => state.shared.health.dlr.failed("dlr", &e),
            },
            DlrMsg::Delivered(results) => {
                state.in_flight = state.in_flight.saturating_sub(results.len());
                state.finish(results).await;
                state.schedule_delivery();
            }
            DlrMsg::Tick => state.tick().await,
            DlrMsg::Status(reply) => {
                let store = state.store.stats().await.ok();
                let _ = reply.send(DlrStatus {
                    store,
                    deliveries_in_flight: state.in_flight as u64,
                    reserved: state.store.reservations().map(|r| (r.held(), r.capacity())),
                });
            }
        }
        Ok(())
    }
}
