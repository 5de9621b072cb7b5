//! Supervisor: starts the actor tree, restarts a failed child, and reconciles by stable
//! id after each restart.
//!
//! ractor does not restart children by itself (its default handler stops the
//! supervisor when a child exits), so this supervisor respawns the failed child with the
//! same stores — the stores outlive every actor — and tells the affected peers to
//! reconcile: whatever the dead actor's mailbox held is repaired from the stage stores,
//! never assumed delivered.
//!
//! It also owns the tickers that drive timers (retries, expiry, selection safety
//! wake-ups), so a restarted actor never ends up with two.
//!
//! And it keeps the current set of destinations: a reload that adds one starts its
//! worker; one that removes or changes one retires the old worker (see
//! [`crate::destination_worker`]) and, once it stopped, forgets the destination or
//! starts the worker with the new settings.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, ActorStatus, RpcReplyPort, SupervisionEvent};
use sendium_profiles::RouteTable;
use tokio::task::JoinHandle;

use crate::context::Shared;
use crate::destination_worker::{DestinationWorker, WorkerArgs, WorkerMsg};
use crate::directory::Mailbox;
use crate::dlr_correlator::{DlrArgs, DlrCorrelator, DlrMsg, Handover};
use crate::ingress::{Ingress, IngressArgs, IngressMsg};
use crate::router::{Peer, Router, RouterArgs, RouterMsg};
use crate::selector::{Selector, SelectorArgs, SelectorMsg};
use crate::spec::{DestinationSpec, GatewaySpec};

/// Which child an actor is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ChildKind {
    Ingress,
    Selector,
    Router,
    DlrCorrelator,
    Worker(String),
}

impl ChildKind {
    pub fn name(&self) -> String {
        match self {
            ChildKind::Ingress => "ingress".into(),
            ChildKind::Selector => "selector".into(),
            ChildKind::Router => "router".into(),
            ChildKind::DlrCorrelator => "dlr-correlator".into(),
            ChildKind::Worker(d) => format!("destination-worker:{d}"),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            ChildKind::Ingress => "ingress",
            ChildKind::Selector => "selector",
            ChildKind::Router => "router",
            ChildKind::DlrCorrelator => "dlr-correlator",
            ChildKind::Worker(_) => "destination-worker",
        }
    }
}

/// One line of `/admin/actors`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ActorEntry {
    pub name: String,
    pub kind: &'static str,
    pub status: String,
    pub restarts: u64,
    pub mailbox: u64,
    pub queued: u64,
}

pub enum SupervisorMsg {
    /// Try (again) to start a child that is not running.
    Respawn(ChildKind),
    /// A reload: these are the destinations from now on, routed by this table.
    Reconfigure {
        destinations: Vec<DestinationSpec>,
        routes: RouteTable,
        reply: RpcReplyPort<DestinationChanges>,
    },
    Actors(RpcReplyPort<Vec<ActorEntry>>),
    /// Orderly stop: children stop, no restarts.
    Shutdown(RpcReplyPort<()>),
}

pub struct SupervisorArgs {
    pub shared: Arc<Shared>,
    pub spec: Arc<GatewaySpec>,
}

/// What a reload did to the destinations.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DestinationChanges {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Their provider sessions are re-established with the new settings once the
    /// submissions in flight finished.
    pub changed: Vec<String>,
}

impl DestinationChanges {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

pub struct SupervisorState {
    shared: Arc<Shared>,
    spec: Arc<GatewaySpec>,
    /// The destinations now (the startup ones until a reload changes them).
    destinations: Vec<DestinationSpec>,
    /// Destinations whose worker is retiring: removed, or to be replaced.
    retiring: HashSet<String>,
    children: HashMap<ActorId, (ChildKind, ActorCell)>,
    stopping: bool,
    tickers: Vec<JoinHandle<()>>,
    /// Reports the DLR correlator's tasks could not give the incarnation that started
    /// them, kept for the next one.
    dlr_handover: Arc<Handover>,
}

pub struct Supervisor;

const RESPAWN_DELAY: Duration = Duration::from_millis(500);

fn status_text(s: ActorStatus) -> String {
    match s {
        ActorStatus::Unstarted => "unstarted",
        ActorStatus::Starting => "starting",
        ActorStatus::Running => "running",
        ActorStatus::Upgrading => "upgrading",
        ActorStatus::Draining => "draining",
        ActorStatus::Stopping => "stopping",
        ActorStatus::Stopped => "stopped",
    }
    .to_string()
}

impl SupervisorState {
    async fn spawn(&mut self, myself: &ActorRef<SupervisorMsg>, kind: ChildKind) -> Result<(), ActorProcessingErr> {
        let cell = myself.get_cell();
        let shared = self.shared.clone();
        let spec = &self.spec;
        let name = Some(kind.name());
        let child: ActorCell = match &kind {
            ChildKind::Ingress => {
                let args = IngressArgs {
                    shared: shared.clone(),
                    store: spec.stores.pending.clone(),
                    reservations: spec.reservations.clone(),
                    receipts: spec.receipt_policy,
                    accepting: spec.accepting,
                    routes: spec.routes.clone(),
                };
                let (r, _) = Actor::spawn_linked(name, Ingress, args, cell).await?;
                r.get_cell()
            }
            ChildKind::Selector => {
                let args = SelectorArgs {
                    shared: shared.clone(),
                    store: spec.stores.router_queue.clone(),
                    batch_size: spec.selection_batch,
                    release_on_routed: spec.stores.routed_work.capabilities().durable,
                    stage_gap: crate::pacing::WRITE_GAP,
                };
                let (r, _) = Actor::spawn_linked(name, Selector, args, cell).await?;
                r.get_cell()
            }
            ChildKind::Router => {
                let args = RouterArgs {
                    shared: shared.clone(),
                    store: spec.stores.routed_work.clone(),
                    routes: spec.routes.clone(),
                    max_in_flight: spec.max_in_flight,
                    destinations: self.destinations.iter().map(DestinationSpec::slot).collect(),
                    max_age: spec.max_age,
                    dlr_enabled: shared.dlr_enabled,
                    ownership: shared.partitions.clone(),
                };
                let (r, _) = Actor::spawn_linked(name, Router, args, cell).await?;
                r.get_cell()
            }
            ChildKind::DlrCorrelator => {
                let Some(store) = spec.stores.dlr.clone() else {
                    return Ok(());
                };
                let args = DlrArgs {
                    shared: shared.clone(),
                    store,
                    callback_timeout: spec.callback_timeout,
                    claim_lease: spec.claim_lease,
                    callback_targets: spec.callback_targets.clone(),
                    handover: self.dlr_handover.clone(),
                };
                let (r, _) = Actor::spawn_linked(name, DlrCorrelator, args, cell).await?;
                r.get_cell()
            }
            ChildKind::Worker(dest) => {
                // A retiring worker's successor starts once it stopped.
                if self.retiring.contains(dest) {
                    return Ok(());
                }
                let Some(d) = self.destinations.iter().find(|d| &d.name == dest) else {
                    return Ok(());
                };
                let args = WorkerArgs {
                    shared: shared.clone(),
                    name: d.name.clone(),
                    mailbox: self.shared.dir.add_worker(&d.name),
                    id_format: d.id_format,
                    provider: d.provider(),
                    failover_after: d.failover_after,
                };
                let (r, _) = Actor::spawn_linked(name, DestinationWorker, args, cell).await?;
                r.get_cell()
            }
        };
        self.children.insert(child.get_id(), (kind, child));
        Ok(())
    }

    fn clear(&self, kind: &ChildKind) {
        let dir = &self.shared.dir;
        match kind {
            ChildKind::Ingress => dir.ingress.clear(),
            ChildKind::Selector => dir.selector.clear(),
            ChildKind::Router => dir.router.clear(),
            ChildKind::DlrCorrelator => dir.dlr.clear(),
            ChildKind::Worker(d) => {
                if let Some(mb) = dir.worker(d) {
                    mb.clear();
                }
            }
        }
    }

    /// Tell the peers of a restarted actor to repair what its mailbox held.
    fn reconcile(&self, kind: &ChildKind) {
        let router = &self.shared.dir.router;
        match kind {
            ChildKind::Ingress => {
                router.send(RouterMsg::Reconcile(Peer::Ingress));
            }
            ChildKind::Selector => {
                router.send(RouterMsg::Reconcile(Peer::Selector));
            }
            // The Router restores itself from routed-work and re-syncs the Selector.
            ChildKind::Router => {}
            ChildKind::DlrCorrelator => {
                router.send(RouterMsg::Reconcile(Peer::DlrCorrelator));
            }
            ChildKind::Worker(d) => {
                router.send(RouterMsg::Reconcile(Peer::Worker(d.clone())));
            }
        }
    }

    /// A reload's new destinations (see the module docs).
    async fn reconfigure(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        new: Vec<DestinationSpec>,
        routes: RouteTable,
    ) -> DestinationChanges {
        let old = std::mem::replace(&mut self.destinations, new);
        let mut changes = DestinationChanges::default();
        for d in &self.destinations {
            match old.iter().find(|o| o.name == d.name) {
                None => changes.added.push(d.name.clone()),
                Some(o) if o != d => changes.changed.push(d.name.clone()),
                Some(_) => {}
            }
        }
        changes.removed = old
            .iter()
            .filter(|o| !self.destinations.iter().any(|d| d.name == o.name))
            .map(|o| o.name.clone())
            .collect();
        for name in &changes.added {
            if let Err(e) = self.spawn(myself, ChildKind::Worker(name.clone())).await {
                tracing::error!(destination = %name, error = %e, "destination worker did not start; retrying");
                let kind = ChildKind::Worker(name.clone());
                myself.send_after(RESPAWN_DELAY, move || SupervisorMsg::Respawn(kind));
            }
        }
        // A destination removed earlier and added back before its worker stopped is
        // replaced like a changed one.
        let mut replaced = changes.changed.clone();
        replaced.extend(changes.added.iter().filter(|n| self.retiring.contains(*n)).cloned());
        let slots = self.destinations.iter().map(DestinationSpec::slot).collect();
        let applied = self
            .shared
            .dir
            .router
            .call(
                |reply| RouterMsg::Reconfigure {
                    destinations: slots,
                    replaced: replaced.clone(),
                    routes: routes.clone(),
                    reply,
                },
                Duration::from_secs(10),
            )
            .await;
        if applied.is_err() {
            // The Router is restarting: it starts with the new destinations; the table
            // is swapped here.
            self.spec.routes.replace(routes);
        }
        for name in changes.removed.iter().chain(&changes.changed) {
            self.retire(myself, name).await;
        }
        changes
    }

    /// Retire a destination's worker; when it is not running, it counts as retired.
    async fn retire(&mut self, myself: &ActorRef<SupervisorMsg>, name: &str) {
        if !self.retiring.insert(name.to_string()) {
            return;
        }
        let running = self
            .children
            .values()
            .any(|(k, _)| matches!(k, ChildKind::Worker(d) if d == name));
        let told = running
            && self
                .shared
                .dir
                .worker(name)
                .is_some_and(|mb| mb.send(WorkerMsg::Retire));
        if !told {
            self.retired(myself, name).await;
        }
    }

    /// A retiring worker stopped: forget its destination, or start its successor.
    async fn retired(&mut self, myself: &ActorRef<SupervisorMsg>, name: &str) {
        self.retiring.remove(name);
        if self.destinations.iter().any(|d| d.name == name) {
            let kind = ChildKind::Worker(name.to_string());
            if let Err(e) = self.spawn(myself, kind.clone()).await {
                tracing::error!(destination = %name, error = %e, "destination worker did not start; retrying");
                myself.send_after(RESPAWN_DELAY, move || SupervisorMsg::Respawn(kind));
                return;
            }
            tracing::info!(destination = %name, "destination worker started with the new settings");
        } else {
            self.shared.dir.remove_worker(name);
            tracing::info!(destination = %name, "destination removed");
        }
        // Whatever the old worker still held is placed again.
        self.shared
            .dir
            .router
            .send(RouterMsg::Reconcile(Peer::Worker(name.to_string())));
    }

    fn start_tickers(&mut self) {
        let every = |period: Duration, f: Box<dyn Fn(&Shared) + Send + Sync>| {
            let shared = self.shared.clone();
            tokio::spawn(async move {
                let mut interval = tokio::time::interval(period);
                interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    interval.tick().await;
                    f(&shared);
                }
            })
        };
        self.tickers.push(every(
            Duration::from_millis(1000),
            Box::new(|s| {
                s.dir.ingress.send(IngressMsg::Tick);
            }),
        ));
        self.tickers.push(every(
            Duration::from_millis(200),
            Box::new(|s| {
                s.dir.selector.send(SelectorMsg::Tick);
            }),
        ));
        self.tickers.push(every(
            Duration::from_millis(500),
            Box::new(|s| {
                s.dir.router.send(RouterMsg::Tick);
            }),
        ));
        self.tickers.push(every(
            Duration::from_millis(1000),
            Box::new(|s| {
                s.dir.dlr.send(DlrMsg::Tick);
            }),
        ));
        self.tickers.push(every(
            Duration::from_millis(100),
            Box::new(|s| s.dir.send_workers(|| WorkerMsg::Tick)),
        ));
    }

    async fn actors(&self, myself: &ActorRef<SupervisorMsg>) -> Vec<ActorEntry> {
        let mut out = vec![ActorEntry {
            name: "supervisor".into(),
            kind: "supervisor",
            status: status_text(myself.get_status()),
            restarts: 0,
            mailbox: 0,
            queued: self.children.len() as u64,
        }];
        let mut kinds: Vec<ChildKind> = vec![ChildKind::Ingress, ChildKind::Selector, ChildKind::Router];
        if self.spec.stores.dlr.is_some() {
            kinds.push(ChildKind::DlrCorrelator);
        }
        kinds.extend(
            self.shared
                .dir
                .workers()
                .into_iter()
                .map(|(name, _)| ChildKind::Worker(name)),
        );
        let dir = &self.shared.dir;
        for kind in kinds {
            let status = self
                .children
                .values()
                .find(|(k, _)| *k == kind)
                .map(|(_, c)| status_text(c.get_status()))
                .unwrap_or_else(|| "restarting".into());
            let (mailbox, queued) = match &kind {
                ChildKind::Ingress => load(&dir.ingress, IngressMsg::Status, |s| s.waiting_requests).await,
                ChildKind::Selector => load(&dir.selector, SelectorMsg::Status, |s| s.staged).await,
                ChildKind::Router => load(&dir.router, RouterMsg::Status, |s| s.units).await,
                ChildKind::DlrCorrelator => {
                    load(&dir.dlr, DlrMsg::Status, |s| {
                        s.store.map(|st| st.pending_deliveries).unwrap_or(0)
                    })
                    .await
                }
                ChildKind::Worker(d) => match dir.worker(d) {
                    Some(mb) => load(&mb, WorkerMsg::Status, |s| s.branches).await,
                    None => (0, 0),
                },
            };
            out.push(ActorEntry {
                name: kind.name(),
                kind: kind.kind(),
                status,
                restarts: self.shared.restarts.of(&kind.name()),
                mailbox,
                queued,
            });
        }
        out
    }
}

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: SupervisorArgs,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let mut state = SupervisorState {
            shared: args.shared,
            destinations: args.spec.destinations.clone(),
            retiring: HashSet::new(),
            spec: args.spec,
            children: HashMap::new(),
            stopping: false,
            tickers: Vec::new(),
            dlr_handover: Arc::default(),
        };
        // Order matters at startup: the Router restores routed work through Ingress,
        // and then hands the Selector its credit; workers and the DLR correlator must
        // be there to take what the Router dispatches.
        state.spawn(&myself, ChildKind::Ingress).await?;
        state.spawn(&myself, ChildKind::DlrCorrelator).await?;
        let workers: Vec<ChildKind> = state
            .destinations
            .iter()
            .map(|d| ChildKind::Worker(d.name.clone()))
            .collect();
        for w in workers {
            state.spawn(&myself, w).await?;
        }
        state.spawn(&myself, ChildKind::Selector).await?;
        state.spawn(&myself, ChildKind::Router).await?;
        state.start_tickers();
        Ok(state)
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        for t in state.tickers.drain(..) {
            t.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Respawn(kind) => {
                if state.stopping || state.children.values().any(|(k, _)| *k == kind) {
                    return Ok(());
                }
                if let ChildKind::Worker(name) = &kind
                    && !state.destinations.iter().any(|d| &d.name == name)
                {
                    // Removed by a reload meanwhile.
                    return Ok(());
                }
                match state.spawn(&myself, kind.clone()).await {
                    Ok(()) => {
                        tracing::info!(actor = %kind.name(), "actor restarted");
                        state.reconcile(&kind);
                    }
                    Err(e) => {
                        tracing::error!(actor = %kind.name(), error = %e, "restart failed; retrying");
                        myself.send_after(RESPAWN_DELAY, move || SupervisorMsg::Respawn(kind));
                    }
                }
            }
            SupervisorMsg::Reconfigure {
                destinations,
                routes,
                reply,
            } => {
                let changes = state.reconfigure(&myself, destinations, routes).await;
                let _ = reply.send(changes);
            }
            SupervisorMsg::Actors(reply) => {
                let _ = reply.send(state.actors(&myself).await);
            }
            SupervisorMsg::Shutdown(reply) => {
                state.stopping = true;
                for t in state.tickers.drain(..) {
                    t.abort();
                }
                // Stop the pipeline front to back so no new work enters while the rest drains.
                let order = [
                    ChildKind::Ingress,
                    ChildKind::Selector,
                    ChildKind::Router,
                    ChildKind::DlrCorrelator,
                ];
                for kind in order {
                    if let Some((_, cell)) = state.children.values().find(|(k, _)| *k == kind) {
                        cell.stop(Some("shutdown".into()));
                    }
                }
                for (kind, cell) in state.children.values() {
                    if matches!(kind, ChildKind::Worker(_)) {
                        cell.stop(Some("shutdown".into()));
                    }
                }
                let _ = reply.send(());
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, reason) = match event {
            SupervisionEvent::ActorFailed(cell, err) => (cell, Some(err.to_string())),
            SupervisionEvent::ActorTerminated(cell, _, reason) => (cell, reason),
            _ => return Ok(()),
        };
        let Some((kind, _)) = state.children.remove(&cell.get_id()) else {
            return Ok(());
        };
        if let ChildKind::Worker(name) = &kind
            && state.retiring.contains(name)
            && !state.stopping
        {
            // Retired (or failed while retiring): its work is placed again either way.
            state.clear(&kind);
            state.retired(&myself, name).await;
            return Ok(());
        }
        state.clear(&kind);
        if state.stopping {
            return Ok(());
        }
        tracing::error!(actor = %kind.name(), reason = reason.as_deref().unwrap_or("stopped"), "actor failed; restarting");
        state.shared.restarts.record(&kind.name());
        metrics::counter!("sendium_actor_restarts_total", "actor" => kind.kind()).increment(1);
        myself.send_message(SupervisorMsg::Respawn(kind))?;
        Ok(())
    }
}

/// A child's mailbox depth, and the work it reports queued (0 when it does not answer
/// within half a second: `/admin/actors` must not hang on a stuck actor).
async fn load<M: Send + 'static, S: Send + 'static>(
    mailbox: &Mailbox<M>,
    status: impl FnOnce(RpcReplyPort<S>) -> M,
    queued: impl FnOnce(S) -> u64,
) -> (u64, u64) {
    let depth = mailbox.depth();
    let answer = mailbox.call(status, Duration::from_millis(500)).await;
    (depth, answer.map(queued).unwrap_or(0))
}
