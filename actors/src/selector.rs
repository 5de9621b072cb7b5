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
    /// The pause between two stage commits is over (see `SelectorState::select`).
    StageDue,
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
    /// Least time between the starts of two stage commits of a durable store
    /// ([`crate::pacing::WRITE_GAP`]).
    pub stage_gap: Duration,
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
    /// A [`SelectorMsg::StageDue`] is on its way: selection waits for it.
    stage_due: bool,
    stage_gap: Duration,
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
            // Paced like the Router's writes (see `crate::pacing`). The pause is a
            // message to come, not a sleep in this handler: the releases and completions
            // queued meanwhile are handled at once, so a routed unit's staged entry goes
            // with the next release instead of after every pause queued before it (its
            // entry would otherwise be live at the next checkpoint, written to the file
            // and removed again at the one after). A stage commit in progress still holds
            // them up, for the few milliseconds of its journal sync.
            if self.durable {
                let wait = crate::pacing::gap_left(self.stage_gap, self.last_stage, std::time::Instant::now());
                if !wait.is_zero() {
                    self.stage_after(wait);
                    return;
                }
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

    /// Select again once `wait` has passed (one timer at a time).
    fn stage_after(&mut self, wait: Duration) {
        if self.stage_due {
            return;
        }
        self.stage_due = true;
        let shared = self.shared.clone();
        crate::pacing::send_after(wait, move || {
            shared.dir.selector.send(SelectorMsg::StageDue);
        });
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
            stage_due: false,
            stage_gap: args.stage_gap,
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
            SelectorMsg::StageDue => {
                state.stage_due = false;
                state.select().await;
            }
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

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use async_trait::async_trait;
    use sendium_protocols::smpp::server::SessionRegistry;
    use sendium_storage::memory::MemoryRouterQueueStore;
    use sendium_storage::{Backend, Disposition, RouterQueueError, RouterQueueStats, StageCapabilities, Unit, UnitId};
    use tokio::sync::mpsc;

    use super::*;
    use crate::context::{DestinationLinks, Restarts, Stopping};
    use crate::directory::Directory;
    use crate::health::Health;
    use crate::inbound::{LiveMo, MoSettings};

    /// A router queue in memory that says it is durable (so its commits are paced) and
    /// reports each write's staged and released units.
    struct Recording {
        inner: MemoryRouterQueueStore,
        writes: mpsc::UnboundedSender<(Vec<UnitId>, Vec<UnitId>)>,
    }

    #[async_trait]
    impl RouterQueueStore for Recording {
        fn capabilities(&self) -> StageCapabilities {
            StageCapabilities::durable(Backend::File)
        }
        async fn apply(&self, write: RouterQueueWrite) -> Result<(), RouterQueueError> {
            let staged = write.stage.iter().map(|u| u.id).collect();
            let released = write.release.clone();
            self.inner.apply(write).await?;
            let _ = self.writes.send((staged, released));
            Ok(())
        }
        async fn staged_after(&self, after: ReadySeq, limit: usize) -> Result<Vec<StagedUnit>, RouterQueueError> {
            self.inner.staged_after(after, limit).await
        }
        async fn cursor(&self) -> Result<ReadyCursor, RouterQueueError> {
            self.inner.cursor().await
        }
        async fn stats(&self) -> Result<RouterQueueStats, RouterQueueError> {
            self.inner.stats().await
        }
    }

    /// Ingress as the Selector sees it: ready units in lane 0.
    struct ReadyUnits;

    impl Actor for ReadyUnits {
        type Msg = IngressMsg;
        type State = Vec<ReadyUnit>;
        type Arguments = Vec<ReadyUnit>;

        async fn pre_start(
            &self,
            _myself: ActorRef<IngressMsg>,
            units: Vec<ReadyUnit>,
        ) -> Result<Vec<ReadyUnit>, ActorProcessingErr> {
            Ok(units)
        }

        async fn handle(
            &self,
            _myself: ActorRef<IngressMsg>,
            msg: IngressMsg,
            units: &mut Vec<ReadyUnit>,
        ) -> Result<(), ActorProcessingErr> {
            if let IngressMsg::ReadyAfter { after, limit, reply } = msg {
                let ready = units.iter().filter(|u| u.seq > after.lane(0)).take(limit).cloned();
                let _ = reply.send(Ok(ready.collect()));
            }
            Ok(())
        }
    }

    fn shared() -> Arc<Shared> {
        Arc::new(Shared {
            dir: Directory::new(Vec::new()),
            links: DestinationLinks::default(),
            health: Health::default(),
            sessions: SessionRegistry::new(),
            restarts: Restarts::default(),
            dlr_enabled: true,
            partitions: None,
            stopping: Stopping::default(),
            mo: LiveMo::new(MoSettings::from_config(&sendium_profiles::Config::default()).unwrap()),
            schedule_horizon: None,
        })
    }

    /// The pause between two stage commits does not hold up the Selector's other work: a
    /// routed unit's staged entry is released at once, not after the next stage commit.
    #[tokio::test]
    async fn a_routed_unit_is_released_while_the_next_stage_waits_out_its_pause() {
        let shared = shared();
        let units: Vec<ReadyUnit> = (1..=2)
            .map(|n| ReadyUnit {
                seq: ReadySeq(n),
                unit: Unit {
                    id: UnitId::generate(),
                    disposition: Disposition::Deliver,
                    parts: Vec::new(),
                },
            })
            .collect();
        let (first, second) = (units[0].unit.id, units[1].unit.id);
        let (ingress, _) = Actor::spawn(None, ReadyUnits, units).await.unwrap();
        shared.dir.ingress.install(ingress);
        let (tx, mut writes) = mpsc::unbounded_channel();
        let store = Arc::new(Recording {
            inner: MemoryRouterQueueStore::new(),
            writes: tx,
        });
        let gap = Duration::from_secs(2);
        let args = SelectorArgs {
            shared: shared.clone(),
            store,
            batch_size: 1,
            release_on_routed: true,
            stage_gap: gap,
        };
        let (_selector, _) = Actor::spawn(None, Selector, args).await.unwrap();
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(10), writes.recv())
                .await
                .expect("a router-queue write")
                .expect("the store is alive")
        };

        shared.dir.selector.send(SelectorMsg::Reconcile {
            free: 1,
            exclude: Vec::new(),
        });
        assert_eq!(next().await, (vec![first], vec![]), "the first unit is staged at once");
        let staged_at = Instant::now();
        // Its slot comes back: the second unit may be staged, but only after the pause.
        shared.dir.selector.send(SelectorMsg::Completed(vec![first]));
        shared.dir.selector.send(SelectorMsg::Routed(vec![first]));
        assert_eq!(next().await, (vec![], vec![first]), "released before the next stage");
        assert!(staged_at.elapsed() < gap, "released within the pause");
        assert_eq!(next().await, (vec![second], vec![]));
        assert!(staged_at.elapsed() >= gap, "the second stage waited out the pause");
    }
}
