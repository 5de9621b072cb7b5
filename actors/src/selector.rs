//! Selector: owns the router-queue stage.
//!
//! Select-and-stage picks a bounded batch of ready units after the selection cursor,
//! records batch and cursor in the router-queue store as one transition, and only then
//! hands the batch to the Router. Selection runs only while the Router has credit (free
//! in-flight slots), so a backlog of millions stays in the pending store and memory use
//! stays flat.
//!
//! After a restart, staged units are restored from the store without selecting again
//! (a durable router-queue), and selection resumes after the stored cursor. A memory
//! router-queue starts at cursor 0 after a process restart: accepted work is selected
//! again, skipping what a durable routed-work stage already holds.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use sendium_storage::failpoint;
use sendium_storage::ids::IdSet;
use sendium_storage::{
    PendingError, ReadyCursor, ReadySeq, ReadyUnit, RouterQueueStore, RouterQueueWrite, StagedUnit, UnitId,
};

use crate::context::Shared;
use crate::ingress::IngressMsg;
use crate::router::RouterMsg;

pub enum SelectorMsg {
    /// New ready units may exist.
    Wake,
    /// Sources completed: these in-flight slots are free again, and their staged
    /// entries can go.
    Completed(Vec<UnitId>),
    /// The Router durably recorded these units: their staged entries can go.
    Routed(Vec<UnitId>),
    /// The Router ignored units it already held: their slots are free.
    Credit(usize),
    /// Reconciliation (at startup and after the Router or Selector restarted): take the
    /// Router's free capacity as credit, skip `exclude` (units a durable routed-work stage
    /// holds), and re-send every staged unit (the Router drops those it already holds).
    Reconcile {
        free: usize,
        exclude: Vec<UnitId>,
    },
    /// The Router took over partitions of a shared database and restored `restored`
    /// routed units of theirs (slots they hold from now on): select their staged and
    /// ready units too.
    Rescan {
        restored: usize,
    },
    Tick,
    Status(RpcReplyPort<SelectorStatus>),
}

#[derive(Clone, Debug, Default)]
pub struct SelectorStatus {
    pub credit: u64,
    /// The furthest any priority lane's selection cursor reached (its counter).
    pub cursor: u64,
    pub staged: u64,
    pub selected_total: u64,
    pub restored_total: u64,
}

pub struct SelectorArgs {
    pub shared: Arc<Shared>,
    pub store: Arc<dyn RouterQueueStore>,
    pub batch_size: usize,
    /// With a durable routed-work stage, staged units are released once routed; with a
    /// memory one they stay staged until their sources complete, so a restart can reroute.
    pub release_on_routed: bool,
}

pub struct SelectorState {
    shared: Arc<Shared>,
    store: Arc<dyn RouterQueueStore>,
    /// The store keeps staged batches across a restart: its commits are paced.
    durable: bool,
    batch_size: usize,
    release_on_routed: bool,
    /// Where selection stands in each priority lane.
    cursor: ReadyCursor,
    credit: usize,
    /// Slots taken by units the Router restored on its own (partitions taken over):
    /// paid back from the next credit, so every unit holds one slot.
    debt: usize,
    /// Units a durable routed-work stage already holds at startup: not selected again.
    exclude: IdSet<UnitId>,
    selected_total: u64,
    restored_total: u64,
    /// Set when the Router has not told us its capacity yet: no selection until it does.
    waiting_for_router: bool,
    last_stage: Option<std::time::Instant>,
}

pub struct Selector;

/// Selection batches per handled message before yielding the mailbox.
const MAX_BATCHES_PER_TURN: usize = 8;
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

impl SelectorState {
    /// Units read from the pending stage through Ingress. `None` when the store failed
    /// (readiness says so) or Ingress is restarting: the tick tries again.
    async fn pending_units(
        &self,
        ask: impl FnOnce(RpcReplyPort<Result<Vec<ReadyUnit>, PendingError>>) -> IngressMsg,
    ) -> Option<Vec<ReadyUnit>> {
        match self.shared.dir.ingress.call(ask, CALL_TIMEOUT).await {
            Ok(Ok(units)) => Some(units),
            Ok(Err(e)) => {
                self.shared.health.pending.failed("pending", &e);
                None
            }
            Err(_) => None,
        }
    }

    /// Run select-and-stage while there is credit and ready work.
    async fn select(&mut self) {
        if self.waiting_for_router {
            return;
        }
        for _ in 0..MAX_BATCHES_PER_TURN {
            if self.credit == 0 {
                return;
            }
            let limit = self.credit.min(self.batch_size);
            let after = self.cursor;
            let Some(ready) = self
                .pending_units(|reply| IngressMsg::ReadyAfter { after, limit, reply })
                .await
            else {
                return;
            };
            if ready.is_empty() {
                return;
            }
            let mut next = self.cursor;
            for u in &ready {
                next.advance(u.seq);
            }
            let batch: Vec<ReadyUnit> = ready.into_iter().filter(|u| !self.exclude.remove(&u.unit.id)).collect();
            let staged: Vec<StagedUnit> = batch.iter().map(StagedUnit::from).collect();
            // Paced like the Router's writes (see `crate::pacing`).
            if self.durable {
                let wait = crate::pacing::gap_left(self.last_stage, std::time::Instant::now());
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
            }
            self.last_stage = Some(std::time::Instant::now());
            let write = RouterQueueWrite {
                stage: staged,
                cursor: Some(next),
                release: Vec::new(),
            };
            if let Err(e) = self.store.apply(write).await {
                self.shared.health.router_queue.failed("router-queue", &e);
                return;
            }
            self.shared.health.router_queue.ok();
            failpoint::hit("mid-select-and-stage");
            self.cursor = next;
            self.credit = self.credit.saturating_sub(batch.len());
            self.selected_total += batch.len() as u64;
            metrics::counter!("sendium_selected_total").increment(batch.len() as u64);
            if !batch.is_empty() {
                self.shared.dir.router.send(RouterMsg::Route(batch));
            }
        }
        // More may be ready: continue after other messages had their turn.
        self.shared.dir.selector.send(SelectorMsg::Wake);
    }

    fn add_credit(&mut self, n: usize) {
        let paid = n.min(self.debt);
        self.debt -= paid;
        self.credit += n - paid;
    }

    async fn release(&mut self, ids: &[UnitId]) {
        let write = RouterQueueWrite {
            release: ids.to_vec(),
            ..RouterQueueWrite::default()
        };
        if let Err(e) = self.store.apply(write).await {
            self.shared.health.router_queue.failed("router-queue", &e);
        }
    }

    /// Send every staged unit to the Router again (it ignores those it holds).
    async fn resend_staged(&mut self) {
        let mut after = ReadySeq(0);
        loop {
            let page = match self.store.staged_after(after, 1_000).await {
                Ok(p) => p,
                Err(e) => {
                    self.shared.health.router_queue.failed("router-queue", &e);
                    return;
                }
            };
            let Some(last) = page.last().map(|s| s.seq) else {
                return;
            };
            after = last;
            let ids: Vec<UnitId> = page.iter().map(|s| s.id).collect();
            let ask = ids.clone();
            let Some(units) = self.pending_units(|reply| IngressMsg::Units { ids: ask, reply }).await else {
                return;
            };
            // Staged entries whose sources are gone were completed before the crash
            // released them: release now.
            let present: HashSet<UnitId> = units.iter().map(|u| u.unit.id).collect();
            let gone: Vec<UnitId> = ids.into_iter().filter(|id| !present.contains(id)).collect();
            if !gone.is_empty() {
                self.release(&gone).await;
            }
            let (held, restored): (Vec<ReadyUnit>, Vec<ReadyUnit>) =
                units.into_iter().partition(|u| self.exclude.contains(&u.unit.id));
            // Already recorded in a durable routed-work stage: their staged entries are
            // done with (a release lost in the crash is repaired here).
            if self.release_on_routed && !held.is_empty() {
                let ids: Vec<UnitId> = held.iter().map(|u| u.unit.id).collect();
                self.release(&ids).await;
            }
            self.credit = self.credit.saturating_sub(restored.len());
            self.restored_total += restored.len() as u64;
            metrics::counter!("sendium_staged_restored_total").increment(restored.len() as u64);
            if !restored.is_empty() {
                self.shared.dir.router.send(RouterMsg::RouteRestored(restored));
            }
        }
    }
}

impl Actor for Selector {
    type Msg = SelectorMsg;
    type State = SelectorState;
    type Arguments = SelectorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: SelectorArgs,
    ) -> Result<SelectorState, ActorProcessingErr> {
        // Reachable before startup work runs: replies to what pre_start sends must not be lost.
        args.shared.dir.selector.install(myself);
        let cursor = args.store.cursor().await?;
        Ok(SelectorState {
            shared: args.shared,
            durable: args.store.capabilities().durable,
            store: args.store,
            batch_size: args.batch_size.max(1),
            release_on_routed: args.release_on_routed,
            cursor,
            credit: 0,
            debt: 0,
            exclude: IdSet::default(),
            selected_total: 0,
            restored_total: 0,
            waiting_for_router: true,
            last_stage: None,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: SelectorMsg,
        state: &mut SelectorState,
    ) -> Result<(), ActorProcessingErr> {
        state.shared.dir.selector.took_one();
        match msg {
            SelectorMsg::Wake | SelectorMsg::Tick => {
                failpoint::hit("actor-selector");
                state.select().await;
            }
            SelectorMsg::Completed(ids) => {
                state.add_credit(ids.len());
                if !state.release_on_routed {
                    state.release(&ids).await;
                }
                state.select().await;
            }
            SelectorMsg::Routed(ids) => {
                if state.release_on_routed {
                    state.release(&ids).await;
                }
            }
            SelectorMsg::Credit(n) => {
                state.add_credit(n);
                state.select().await;
            }
            SelectorMsg::Rescan { restored } => {
                let paid = restored.min(state.credit);
                state.credit -= paid;
                state.debt += restored - paid;
                // The taken-over partitions' units may lie before the cursor.
                state.cursor = ReadyCursor::START;
                state.resend_staged().await;
                state.select().await;
            }
            SelectorMsg::Reconcile { free, exclude } => {
                state.credit = free;
                state.debt = 0;
                state.exclude = exclude.into_iter().collect();
                state.waiting_for_router = false;
                state.resend_staged().await;
                state.shared.health.set_selector_reconciled();
                state.select().await;
            }
            SelectorMsg::Status(reply) => {
                let staged = state.store.stats().await.map(|s| s.staged).unwrap_or(0);
                let _ = reply.send(SelectorStatus {
                    credit: state.credit as u64,
                    cursor: state.cursor.furthest(),
                    staged,
                    selected_total: state.selected_total,
                    restored_total: state.restored_total,
                });
            }
        }
        Ok(())
    }
}
