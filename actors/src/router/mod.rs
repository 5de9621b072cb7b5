//! Router: owns the routed-work stage.
//!
//! For each selected unit the Router resolves the route (first match on account and
//! destination prefix), records every branch — the primary route with its failover
//! targets and each copied route — in one routed-work transition, then dispatches the
//! branches to destination workers within their credit. It records each branch's
//! completion; once every branch and the DLR handoff are terminal it asks Ingress to
//! complete the source, and after that forgets the unit.
//!
//! The Router's in-memory map is a bounded projection (`max-in-flight` units) of the
//! routed-work store, rebuilt from it at startup and after any restart; every message it
//! exchanges is keyed by stable ids so a lost message is repaired by re-sending.
//!
//! Where each open branch goes — failover included — is decided in [`placement`].

mod branch_map;
mod completion;
mod dispatch;
mod partitions;
mod placement;
mod plan;
mod queue;
mod restore;
mod writes;

pub use plan::{receipt_targets, record_text, route_of};
pub use writes::Written;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use sendium_profiles::RouteTable;
use sendium_storage::failpoint;
use sendium_storage::ids::{IdMap, IdSet};
use sendium_storage::{
    Branch, BranchDone, BranchFailure, BranchMove, BranchOutcome, Handoff, ReadyUnit, ReceiptTarget, RoutedUnit,
    RoutedWorkStore, Timestamp, Unit, UnitId,
};

use self::branch_map::BranchMap;
use self::placement::Waiting;

use crate::context::Shared;
use crate::destination_worker::{BranchJob, WorkerMsg};
use crate::selector::SelectorMsg;
use crate::spec::{DestinationSlot, LiveRoutes};

/// One branch of one unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BranchKey {
    pub unit: UnitId,
    pub branch: u16,
}

/// What a worker reports for a branch it was given.
#[derive(Clone, Debug)]
pub struct WorkerOutcome {
    pub key: BranchKey,
    pub destination: String,
    pub result: WorkerResult,
}

#[derive(Clone, Debug)]
pub enum WorkerResult {
    /// Every provider part accepted: raw ids (for the record) and canonical keys (for
    /// receipt correlation), one per part.
    Submitted {
        provider_ids: Vec<String>,
        keys: Vec<String>,
    },
    /// Ended for good.
    Failed(BranchFailure),
    /// Handed back: this destination cannot take it (see [`crate::destination_worker`]); it moves
    /// to the next reachable destination of its route.
    Bounced,
    /// Given back untried: the worker is being replaced or removed by a reload. Placed
    /// again as if new, with no failover recorded.
    Returned,
}

/// A peer actor that restarted, for reconciliation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peer {
    Ingress,
    Selector,
    DlrCorrelator,
    Worker(String),
}

pub enum RouterMsg {
    Route(Vec<ReadyUnit>),
    /// Staged units sent again after a restart or a takeover of partitions. Read before
    /// this message was handled, so a unit may have completed here meanwhile: each one
    /// this Router does not hold is routed only if its source is still pending.
    RouteRestored(Vec<ReadyUnit>),
    Outcomes(Vec<WorkerOutcome>),
    /// The DLR store accepted these handoffs.
    HandedOff(Vec<BranchKey>),
    /// The DLR store could not take them now (retryable): try again later.
    HandoffFailed(Vec<BranchKey>),
    /// A routed-work write finished (sent by its write task).
    Written(Box<Written>),
    /// The pacing gap before the next routed-work write has passed.
    WriteDue,
    SourcesCompleted(Vec<UnitId>),
    DestinationState {
        name: String,
        up: bool,
    },
    Reconcile(Peer),
    /// A reload changed the destinations: plan with these from now on (`replaced` are
    /// being given new provider sessions: down until their new worker reports) and
    /// with this route table. Answered once applied.
    Reconfigure {
        destinations: Vec<DestinationSlot>,
        replaced: Vec<String>,
        routes: RouteTable,
        reply: RpcReplyPort<()>,
    },
    Tick,
    Status(RpcReplyPort<RouterStatus>),
}

#[derive(Clone, Debug, Default)]
pub struct RouterStatus {
    pub units: u64,
    pub open_branches: u64,
    pub awaiting_handoff: u64,
    pub queued_for_workers: u64,
    pub free: u64,
    /// Branches no destination can take now (see [`placement`]), and how long the
    /// oldest of them has waited.
    pub waiting: u64,
    pub oldest_waiting: Duration,
    pub destinations: Vec<DestinationView>,
}

/// One destination as the Router sees it.
#[derive(Clone, Debug)]
pub struct DestinationView {
    pub name: String,
    pub up: bool,
    /// Branches given to its worker.
    pub assigned: u64,
    /// Branches queued for it, beyond its worker's credit.
    pub queued: u64,
    /// Waiting branches whose first preference it is.
    pub waiting: u64,
}

pub struct RouterArgs {
    pub shared: Arc<Shared>,
    pub store: Arc<dyn RoutedWorkStore>,
    pub routes: LiveRoutes,
    pub max_in_flight: usize,
    pub destinations: Vec<DestinationSlot>,
    /// `[sms] max-age`.
    pub max_age: Duration,
    pub dlr_enabled: bool,
    /// This process's partitions of a database several processes share.
    pub ownership: Option<Arc<sendium_storage::postgresql::Ownership>>,
}

struct Tracked {
    unit: Arc<Unit>,
    routed: RoutedUnit,
    /// The submissions owed a receipt (computed once per unit).
    targets: Vec<ReceiptTarget>,
    /// Open branches given to a worker, and to which.
    dispatched: BranchMap<Arc<str>>,
    /// Outcome known (with its canonical provider keys), DLR store has not accepted
    /// the handoff yet.
    awaiting_handoff: BranchMap<(BranchOutcome, Vec<String>, Instant)>,
    /// Branches whose completion is queued for, or in, a routed-work write.
    closing: Vec<u16>,
    completion_sent: bool,
    /// When the source completion was last asked for (re-asked if no answer came).
    completion_asked: Option<Instant>,
    /// When the message's validity runs out (see [`placement::deadline`]).
    deadline: Timestamp,
    /// How often each branch was handed back by a destination.
    bounced: BranchMap<u32>,
    /// Its first part's stored `route_priority` (its route's priority at admission): its
    /// place in destination queues.
    priority: u8,
}

impl Tracked {
    fn dispatched_to(&self, no: u16) -> Option<&str> {
        self.dispatched.get(no).map(AsRef::as_ref)
    }

    /// Entries stay in dispatch order: a branch dispatched again moves last.
    fn set_dispatched(&mut self, no: u16, dest: Arc<str>) {
        self.dispatched.remove(no);
        self.dispatched.insert(no, dest);
    }

    fn clear_dispatched(&mut self, no: u16) {
        self.dispatched.remove(no);
    }

    fn branch(&self, no: u16) -> Option<&Branch> {
        self.routed.branches.iter().find(|b| b.no == no)
    }

    fn bounces(&self, no: u16) -> u32 {
        self.bounced.get(no).copied().unwrap_or(0)
    }

    fn count_bounce(&mut self, no: u16) {
        match self.bounced.get_mut(no) {
            Some(n) => *n = n.saturating_add(1),
            None => self.bounced.insert(no, 1),
        }
    }

    /// Ended: recorded complete, or its completion is on its way to the store.
    fn is_done(&self, no: u16) -> bool {
        self.closing.contains(&no) || self.branch(no).is_some_and(|b| b.outcome.is_some())
    }
}

struct Destination {
    name: Arc<str>,
    up: bool,
    /// A reload is replacing its worker: whatever the old one reports, it is down until
    /// the new one is reconciled.
    replacing: bool,
    failover_after: Duration,
    assigned: usize,
    capacity: usize,
    queue: queue::BranchQueue,
}

pub struct RouterState {
    shared: Arc<Shared>,
    store: Arc<dyn RoutedWorkStore>,
    /// The store keeps its records across a restart: the Selector releases a staged
    /// unit once it is recorded here, and writes are paced.
    durable: bool,
    routes: LiveRoutes,
    max_in_flight: usize,
    max_age: Duration,
    dlr_enabled: bool,
    units: IdMap<UnitId, Tracked>,
    dests: IdMap<String, Destination>,
    /// Open branches no destination can take now (see [`placement`]).
    waiting: IdMap<BranchKey, Waiting>,
    /// Branches handed back, whose failover is to be recorded before they are placed
    /// again (so a restart does not send them back); retried on the tick if the write
    /// failed.
    to_move: Vec<BranchMove>,
    retry_move: Vec<BranchMove>,
    /// Work that failed to reach the store, retried on the tick.
    retry_record: Vec<(Arc<Unit>, RoutedUnit)>,
    retry_done: Vec<BranchDone>,
    // Durable writes run in their own tasks so the Router keeps handling messages
    // during an fsync; what arrives meanwhile goes into the next write (group commit).
    to_record: Vec<(Arc<Unit>, RoutedUnit)>,
    /// A routed-work write is in flight.
    writing: bool,
    /// Ids of the units whose routes are not written yet: in `to_record`, in the write in
    /// flight, or in `retry_record`. A unit the Selector sends again meanwhile is
    /// recognised by one lookup; under load those lists hold a whole write's worth.
    unwritten: IdSet<UnitId>,
    /// The partitions of the units being recorded (shared database only).
    recording_partitions: Vec<u16>,
    /// The partitions this Router works on, when several processes share the database.
    partitions: Option<self::partitions::Partitions>,
    to_remove: Vec<UnitId>,
    last_write: Option<Instant>,
    write_timer: bool,
    retry_remove: Vec<UnitId>,
    retry_handoff: Vec<BranchKey>,
    // Per-turn outputs, flushed at the end of every handled message.
    done: Vec<BranchDone>,
    handoffs: Vec<Handoff>,
    jobs: IdMap<String, Vec<BranchJob>>,
}

pub struct Router;

const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// A handoff the DLR correlator has not confirmed in this long is sent again.
const HANDOFF_RESEND: Duration = Duration::from_secs(30);
/// A source completion not confirmed in this long is asked for again.
const COMPLETION_RESEND: Duration = Duration::from_secs(10);

impl Destination {
    fn new(slot: &DestinationSlot) -> Self {
        Destination {
            name: Arc::from(slot.name.as_str()),
            up: false,
            replacing: false,
            failover_after: slot.failover_after,
            assigned: 0,
            capacity: slot.capacity.max(1),
            queue: queue::BranchQueue::default(),
        }
    }
}

impl RouterState {
    fn free(&self) -> usize {
        self.max_in_flight.saturating_sub(self.units.len())
    }
}

impl Actor for Router {
    type Msg = RouterMsg;
    type State = RouterState;
    type Arguments = RouterArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: RouterArgs,
    ) -> Result<RouterState, ActorProcessingErr> {
        // Reachable before the restore runs: replies to what it sends (source completions,
        // worker outcomes) must not be lost.
        args.shared.dir.router.install(myself);
        let dests = args
            .destinations
            .iter()
            .map(|slot| (slot.name.clone(), Destination::new(slot)))
            .collect();
        let mut state = RouterState {
            shared: args.shared,
            durable: args.store.capabilities().durable,
            store: args.store,
            routes: args.routes,
            max_in_flight: args.max_in_flight.max(1),
            max_age: args.max_age,
            dlr_enabled: args.dlr_enabled,
            units: IdMap::default(),
            dests,
            waiting: IdMap::default(),
            to_move: Vec::new(),
            retry_move: Vec::new(),
            retry_record: Vec::new(),
            retry_done: Vec::new(),
            to_record: Vec::new(),
            writing: false,
            unwritten: IdSet::default(),
            recording_partitions: Vec::new(),
            partitions: args.ownership.map(self::partitions::Partitions::new),
            to_remove: Vec::new(),
            last_write: None,
            write_timer: false,
            retry_remove: Vec::new(),
            retry_handoff: Vec::new(),
            done: Vec::new(),
            handoffs: Vec::new(),
            jobs: IdMap::default(),
        };
        state.restore().await?;
        Ok(state)
    }

    async fn post_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut RouterState,
    ) -> Result<(), ActorProcessingErr> {
        // Workers report their current state again on request, so failover decisions
        // use fresh reachability.
        state.shared.dir.send_workers(|| WorkerMsg::ReportState);
        let exclude: Vec<UnitId> = state.units.keys().copied().collect();
        state.shared.dir.selector.send(SelectorMsg::Reconcile {
            free: state.free(),
            exclude,
        });
        state.flush().await;
        state.shared.health.set_router_reconciled();
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: RouterMsg,
        state: &mut RouterState,
    ) -> Result<(), ActorProcessingErr> {
        state.shared.dir.router.took_one();
        match msg {
            RouterMsg::Route(units) => {
                failpoint::hit("actor-router");
                state.route(units).await;
            }
            RouterMsg::RouteRestored(units) => {
                failpoint::hit("actor-router");
                state.route_restored(units).await;
            }
            RouterMsg::Outcomes(outcomes) => state.worker_outcomes(outcomes),
            RouterMsg::HandedOff(keys) => state.handed_off(keys),
            RouterMsg::HandoffFailed(keys) => state.retry_handoff.extend(keys),
            RouterMsg::Written(w) => state.written(*w),
            RouterMsg::WriteDue => {
                state.write_timer = false;
                state.start_write();
            }
            RouterMsg::SourcesCompleted(ids) => state.sources_completed(ids),
            RouterMsg::DestinationState { name, up } => state.destination_state(&name, up),
            RouterMsg::Reconcile(peer) => state.reconcile(peer),
            RouterMsg::Reconfigure {
                destinations,
                replaced,
                routes,
                reply,
            } => {
                state.reconfigure(destinations, &replaced, routes);
                let _ = reply.send(());
            }
            RouterMsg::Tick => state.tick().await,
            RouterMsg::Status(reply) => {
                let (waiting, oldest_waiting) = state.waiting_stats();
                let mut first_preference: HashMap<Arc<str>, u64> = HashMap::new();
                for key in state.waiting.keys() {
                    if let Some(first) = state.units.get(&key.unit).and_then(|t| {
                        t.branch(key.branch)
                            .and_then(|b| state.targets_now(t, b).into_iter().next())
                    }) {
                        *first_preference.entry(first).or_default() += 1;
                    }
                }
                let _ = reply.send(RouterStatus {
                    waiting,
                    oldest_waiting,
                    units: state.units.len() as u64,
                    open_branches: state
                        .units
                        .values()
                        .map(|t| t.routed.branches.iter().filter(|b| b.outcome.is_none()).count() as u64)
                        .sum(),
                    awaiting_handoff: state.units.values().map(|t| t.awaiting_handoff.len() as u64).sum(),
                    queued_for_workers: state.dests.values().map(|d| d.queue.len() as u64).sum(),
                    free: state.free() as u64,
                    destinations: state
                        .dests
                        .iter()
                        .map(|(n, d)| DestinationView {
                            name: n.clone(),
                            up: d.up,
                            assigned: d.assigned as u64,
                            queued: d.queue.len() as u64,
                            waiting: first_preference.get(n.as_str()).copied().unwrap_or(0),
                        })
                        .collect(),
                });
            }
        }
        state.flush().await;
        Ok(())
    }
}
