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

mod placement;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use sendium_profiles::RouteTable;
use sendium_storage::failpoint;
use sendium_storage::{
    Branch, BranchDone, BranchFailure, BranchKind, BranchMove, BranchOutcome, Channel, Disposition, DlrState, Handoff,
    HandoffOutcome, ReadyUnit, ReceiptOutcome, ReceiptTarget, ReplyPath, RoutedUnit, RoutedWorkStore, Timestamp, Unit,
    UnitId,
};

use self::placement::{Occasion, Waiting};

use crate::context::Shared;
use crate::dlr::DlrMsg;
use crate::ingress::IngressMsg;
use crate::selector::SelectorMsg;
use crate::worker::{BranchJob, WorkerMsg};

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
    /// Handed back: this destination cannot take it (see [`crate::worker`]); it moves
    /// to the next reachable destination of its route.
    Bounced,
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

/// One routed-work write — routes recorded, branches completed, units removed — and
/// how it went.
pub struct Written {
    batch: Vec<(Arc<Unit>, RoutedUnit)>,
    moves: Vec<BranchMove>,
    done: Vec<BranchDone>,
    removed: Vec<UnitId>,
    result: Result<(), sendium_storage::RoutedWorkError>,
}

pub struct RouterArgs {
    pub shared: Arc<Shared>,
    pub store: Arc<dyn RoutedWorkStore>,
    pub routes: Arc<RouteTable>,
    pub max_in_flight: usize,
    /// Branches a destination worker holds at once.
    pub worker_capacity: HashMap<String, usize>,
    /// Each destination's `failover-after`.
    pub failover_after: HashMap<String, Duration>,
    /// `[sms] max-age`.
    pub max_age: Duration,
    pub dlr_enabled: bool,
}

struct Tracked {
    unit: Arc<Unit>,
    routed: RoutedUnit,
    /// The submissions owed a receipt (computed once per unit).
    targets: Vec<ReceiptTarget>,
    /// Open branches given to a worker, and to which (a unit has few branches: a
    /// vector beats a map).
    dispatched: Vec<(u16, Arc<str>)>,
    /// Outcome known (with its canonical provider keys), DLR store has not accepted
    /// the handoff yet.
    awaiting_handoff: HashMap<u16, (BranchOutcome, Vec<String>, Instant)>,
    /// Branches whose completion is queued for, or in, a routed-work write.
    closing: Vec<u16>,
    completion_sent: bool,
    /// When the source completion was last asked for (re-asked if no answer came).
    completion_asked: Option<Instant>,
    /// When the message's validity runs out (see [`placement::deadline`]).
    deadline: Timestamp,
    /// How often each branch was handed back by a destination (a unit has few
    /// branches, and few are ever handed back).
    bounced: Vec<(u16, u32)>,
}

impl Tracked {
    fn dispatched_to(&self, no: u16) -> Option<&str> {
        self.dispatched.iter().find(|(b, _)| *b == no).map(|(_, d)| d.as_ref())
    }

    fn set_dispatched(&mut self, no: u16, dest: Arc<str>) {
        self.clear_dispatched(no);
        self.dispatched.push((no, dest));
    }

    fn clear_dispatched(&mut self, no: u16) {
        self.dispatched.retain(|(b, _)| *b != no);
    }

    fn branch(&self, no: u16) -> Option<&Branch> {
        self.routed.branches.iter().find(|b| b.no == no)
    }

    fn bounces(&self, no: u16) -> u32 {
        self.bounced.iter().find(|(b, _)| *b == no).map_or(0, |(_, n)| *n)
    }

    fn count_bounce(&mut self, no: u16) {
        match self.bounced.iter_mut().find(|(b, _)| *b == no) {
            Some((_, n)) => *n = n.saturating_add(1),
            None => self.bounced.push((no, 1)),
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
    failover_after: Duration,
    assigned: usize,
    capacity: usize,
    queue: VecDeque<BranchKey>,
}

pub struct RouterState {
    shared: Arc<Shared>,
    store: Arc<dyn RoutedWorkStore>,
    /// The store keeps its records across a restart: the Selector releases a staged
    /// unit once it is recorded here, and writes are paced.
    durable: bool,
    routes: Arc<RouteTable>,
    max_in_flight: usize,
    max_age: Duration,
    dlr_enabled: bool,
    units: HashMap<UnitId, Tracked>,
    dests: HashMap<String, Destination>,
    /// Open branches no destination can take now (see [`placement`]).
    waiting: HashMap<BranchKey, Waiting>,
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
    recording: Option<std::collections::HashSet<UnitId>>,
    to_remove: Vec<UnitId>,
    last_write: Option<Instant>,
    write_timer: bool,
    retry_remove: Vec<UnitId>,
    retry_handoff: Vec<BranchKey>,
    // Per-turn outputs, flushed at the end of every handled message.
    done: Vec<BranchDone>,
    handoffs: Vec<Handoff>,
    jobs: HashMap<String, Vec<BranchJob>>,
}

pub struct Router;

const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// A handoff the DLR correlator has not confirmed in this long is sent again.
const HANDOFF_RESEND: Duration = Duration::from_secs(30);
/// Least time between the starts of two durable routed-work writes.
const WRITE_GAP: Duration = Duration::from_millis(3);
/// A source completion not confirmed in this long is asked for again.
const COMPLETION_RESEND: Duration = Duration::from_secs(10);

fn failure_state(f: &BranchFailure) -> DlrState {
    match f {
        BranchFailure::NoRoute | BranchFailure::Unencodable => DlrState::Undeliverable,
        BranchFailure::Expired => DlrState::Expired,
        BranchFailure::Rejected { .. } => DlrState::Rejected,
    }
}

/// Receipt targets of a unit: one per submission that asked for a receipt.
pub fn receipt_targets(unit: &Unit) -> Vec<ReceiptTarget> {
    unit.parts
        .iter()
        .filter(|p| p.wants_receipt())
        .filter_map(|p| {
            let reply = match p.channel {
                Channel::Smpp => ReplyPath::Smpp,
                Channel::Http => ReplyPath::Http {
                    url: p.callback_url.clone()?,
                },
            };
            Some(ReceiptTarget {
                submit_id: p.id,
                account: p.account.clone(),
                reply,
                source: p.source.clone(),
                destination: p.destination.clone(),
                submitted_at: p.accepted_at,
                failure_only: p.receipt_on_failure_only(),
            })
        })
        .collect()
}

impl RouterState {
    fn free(&self) -> usize {
        self.max_in_flight.saturating_sub(self.units.len())
    }

    fn plan(&self, unit: &Unit) -> RoutedUnit {
        let first = unit.parts.first();
        let (route, branches) = match (unit.disposition, first) {
            (Disposition::Deliver, Some(p)) => match self.routes.resolve(&p.account, &p.destination.addr) {
                Some(r) => {
                    let mut branches = vec![Branch {
                        no: 0,
                        kind: BranchKind::Primary,
                        targets: r.to.clone(),
                        outcome: None,
                        failed_over_from: Vec::new(),
                    }];
                    for (i, copy) in r.copy_to.iter().enumerate() {
                        branches.push(Branch {
                            no: u16::try_from(i + 1).unwrap_or(u16::MAX),
                            kind: BranchKind::Copy,
                            targets: vec![copy.clone()],
                            outcome: None,
                            failed_over_from: Vec::new(),
                        });
                    }
                    (r.name.clone(), branches)
                }
                None => (String::new(), Vec::new()),
            },
            _ => (String::new(), Vec::new()),
        };
        let branches = if branches.is_empty() {
            // No route (or an expired group): one primary branch with nowhere to go; it
            // fails at dispatch and carries the failure receipt.
            vec![Branch {
                no: 0,
                kind: BranchKind::Primary,
                targets: Vec::new(),
                outcome: None,
                failed_over_from: Vec::new(),
            }]
        } else {
            branches
        };
        RoutedUnit {
            id: unit.id,
            members: unit.member_ids(),
            route,
            routed_at: Timestamp::now(),
            branches,
        }
    }

    async fn route(&mut self, units: Vec<ReadyUnit>) {
        let mut known = Vec::new();
        let mut fresh = Vec::with_capacity(units.len());
        for ru in units {
            let id = ru.unit.id;
            if self.units.contains_key(&id)
                || self.recording.as_ref().is_some_and(|r| r.contains(&id))
                || self.to_record.iter().any(|(u, _)| u.id == id)
                || self.retry_record.iter().any(|(u, _)| u.id == id)
            {
                known.push(id);
                continue;
            }
            let routed = self.plan(&ru.unit);
            fresh.push((Arc::new(ru.unit), routed));
        }
        if !known.is_empty() {
            self.shared.dir.selector.send(SelectorMsg::Credit(known.len()));
            // Staged again after a restart but already recorded here: with a durable
            // routed-work stage their staged entries are done with.
            if self.durable {
                self.shared.dir.selector.send(SelectorMsg::Routed(known));
            }
        }
        self.to_record.extend(fresh);
        self.start_write();
    }

    /// One routed-work write with everything waiting — new routes, branch completions,
    /// removals — unless a write is in flight (then they go into the next one).
    fn start_write(&mut self) {
        if self.recording.is_some()
            || self.write_timer
            || (self.to_record.is_empty()
                && self.to_move.is_empty()
                && self.done.is_empty()
                && self.to_remove.is_empty())
        {
            return;
        }
        // Pace durable writes: nothing acknowledged waits on them, and at moderate rates
        // back-to-back commits of a few units each would spend the CPU and disk the
        // acknowledging commits need. A short gap gathers bigger batches.
        if self.durable
            && let Some(last) = self.last_write
        {
            let since = last.elapsed();
            if since < WRITE_GAP {
                self.write_timer = true;
                let shared = self.shared.clone();
                let wait = WRITE_GAP - since;
                tokio::spawn(async move {
                    tokio::time::sleep(wait).await;
                    shared.dir.router.send(RouterMsg::WriteDue);
                });
                return;
            }
        }
        self.last_write = Some(Instant::now());
        let batch = std::mem::take(&mut self.to_record);
        let moves = std::mem::take(&mut self.to_move);
        let done = std::mem::take(&mut self.done);
        let removed = std::mem::take(&mut self.to_remove);
        self.recording = Some(batch.iter().map(|(u, _)| u.id).collect());
        let store = self.store.clone();
        let shared = self.shared.clone();
        tokio::spawn(async move {
            if !done.is_empty() {
                failpoint::hit("before-branch-completion");
            }
            let write = sendium_storage::RoutedWrite {
                record: batch.iter().map(|(_, r)| r.clone()).collect(),
                moves: moves.clone(),
                complete: done.clone(),
                remove: removed.clone(),
            };
            let result = store.apply(write).await;
            if result.is_ok() && !batch.is_empty() {
                failpoint::hit("after-routing");
            }
            shared.dir.router.send(RouterMsg::Written(Box::new(Written {
                batch,
                moves,
                done,
                removed,
                result,
            })));
        });
    }

    fn written(&mut self, w: Written) {
        self.recording = None;
        let ok = w.result.is_ok();
        if let Err(e) = &w.result {
            self.shared.health.routed_work.failed("routed-work", e);
        }
        self.recorded(w.batch, ok);
        self.moved(w.moves, ok);
        self.branches_recorded(w.done, ok);
        self.removed(w.removed, ok);
        self.start_write();
    }

    fn recorded(&mut self, fresh: Vec<(Arc<Unit>, RoutedUnit)>, ok: bool) {
        if fresh.is_empty() {
            return;
        }
        if !ok {
            self.retry_record.extend(fresh);
            return;
        }
        self.shared.health.routed_work.ok();
        // A restarted Router may get the write of its predecessor: it restored those
        // units from the store already.
        let fresh: Vec<(Arc<Unit>, RoutedUnit)> = fresh
            .into_iter()
            .filter(|(u, _)| !self.units.contains_key(&u.id))
            .collect();
        metrics::counter!("sendium_routed_total").increment(fresh.len() as u64);
        let ids: Vec<UnitId> = fresh.iter().map(|(u, _)| u.id).collect();
        if self.durable {
            self.shared.dir.selector.send(SelectorMsg::Routed(ids));
        }
        for (unit, routed) in fresh {
            self.track(unit, routed);
        }
    }

    /// Take a recorded unit into the projection and dispatch its open branches.
    fn track(&mut self, unit: Arc<Unit>, routed: RoutedUnit) {
        let id = unit.id;
        let open: Vec<u16> = routed
            .branches
            .iter()
            .filter(|b| b.outcome.is_none())
            .map(|b| b.no)
            .collect();
        self.units.insert(
            id,
            Tracked {
                targets: receipt_targets(&unit),
                deadline: placement::deadline(&unit, self.max_age),
                bounced: Vec::new(),
                unit,
                routed,
                dispatched: Vec::new(),
                awaiting_handoff: HashMap::new(),
                closing: Vec::new(),
                completion_sent: false,
                completion_asked: None,
            },
        );
        for no in open {
            self.place(BranchKey { unit: id, branch: no }, Occasion::Fresh);
        }
        self.check_complete(id);
    }

    /// A branch with nowhere to go: no route matched, or its multipart group expired.
    fn fail_unroutable(&mut self, key: BranchKey) {
        let Some(t) = self.units.get(&key.unit) else {
            return;
        };
        let failure = if t.unit.disposition == Disposition::Expired {
            BranchFailure::Expired
        } else {
            BranchFailure::NoRoute
        };
        self.outcome(
            key,
            None,
            BranchOutcome::Failed {
                destination: None,
                failure,
            },
            Vec::new(),
        );
    }

    /// Move queued branches to a reachable destination's worker within its credit.
    fn pump(&mut self, name: &str) {
        let now = Timestamp::now();
        let mut expired = Vec::new();
        let Some(dest) = self.dests.get_mut(name) else {
            return;
        };
        while dest.up && dest.assigned < dest.capacity {
            let Some(key) = dest.queue.pop_front() else {
                break;
            };
            let Some(t) = self.units.get(&key.unit) else {
                continue;
            };
            if t.is_done(key.branch) || t.awaiting_handoff.contains_key(&key.branch) {
                continue;
            }
            if t.dispatched_to(key.branch) != Some(name) {
                continue;
            }
            if t.deadline <= now {
                expired.push(key);
                continue;
            }
            let primary = t.branch(key.branch).is_some_and(|b| b.kind == BranchKind::Primary);
            dest.assigned += 1;
            self.jobs.entry(name.to_string()).or_default().push(BranchJob {
                key,
                unit: t.unit.clone(),
                request_receipt: primary && self.dlr_enabled && t.unit.wants_receipt(),
            });
        }
        for key in expired {
            self.expire(key);
        }
    }

    fn needs_handoff(&self, t: &Tracked, branch: u16) -> bool {
        self.dlr_enabled && t.branch(branch).is_some_and(|b| b.kind == BranchKind::Primary) && !t.targets.is_empty()
    }

    /// The DLR handoff of a branch outcome.
    fn handoff(t: &Tracked, branch: u16, outcome: &BranchOutcome, keys: &[String]) -> Handoff {
        Handoff {
            unit: t.unit.id,
            branch,
            destination: match outcome {
                BranchOutcome::Submitted { destination, .. } => destination.clone(),
                BranchOutcome::Failed { destination, .. } => destination.clone().unwrap_or_default(),
            },
            outcome: match outcome {
                BranchOutcome::Submitted { .. } => HandoffOutcome::Submitted {
                    provider_keys: keys.to_vec(),
                },
                BranchOutcome::Failed { failure, .. } => HandoffOutcome::Failed(ReceiptOutcome {
                    state: failure_state(failure),
                    error: failure.error_code(),
                    done_at: Timestamp::now(),
                }),
            },
            targets: t.targets.clone(),
            handed_off_at: Timestamp::now(),
        }
    }

    /// A branch ended: hand it to the DLR store if it owes a receipt, else record it.
    fn outcome(&mut self, key: BranchKey, _from: Option<&str>, outcome: BranchOutcome, keys: Vec<String>) {
        let Some(t) = self.units.get(&key.unit) else {
            return;
        };
        if t.is_done(key.branch) || t.awaiting_handoff.contains_key(&key.branch) {
            return;
        }
        self.waiting.remove(&key);
        if self.needs_handoff(t, key.branch) {
            self.handoffs.push(Self::handoff(t, key.branch, &outcome, &keys));
            if let Some(t) = self.units.get_mut(&key.unit) {
                t.clear_dispatched(key.branch);
                t.awaiting_handoff.insert(key.branch, (outcome, keys, Instant::now()));
            }
        } else {
            if let Some(t) = self.units.get_mut(&key.unit) {
                t.clear_dispatched(key.branch);
            }
            if let Some(t) = self.units.get_mut(&key.unit) {
                t.closing.push(key.branch);
            }
            self.done.push(BranchDone {
                unit: key.unit,
                branch: key.branch,
                outcome,
            });
        }
    }

    fn worker_outcomes(&mut self, outcomes: Vec<WorkerOutcome>) {
        for o in outcomes {
            if let Some(dest) = self.dests.get_mut(&o.destination) {
                dest.assigned = dest.assigned.saturating_sub(1);
            }
            match o.result {
                WorkerResult::Bounced => {
                    let Some(t) = self.units.get_mut(&o.key.unit) else {
                        continue;
                    };
                    if t.is_done(o.key.branch)
                        || t.awaiting_handoff.contains_key(&o.key.branch)
                        || t.dispatched_to(o.key.branch) != Some(o.destination.as_str())
                    {
                        continue;
                    }
                    t.clear_dispatched(o.key.branch);
                    t.count_bounce(o.key.branch);
                    // Placed again once the failover is recorded (see `moved`).
                    self.to_move.push(BranchMove {
                        unit: o.key.unit,
                        branch: o.key.branch,
                        from: o.destination.clone(),
                    });
                }
                WorkerResult::Submitted { provider_ids, keys } => {
                    let outcome = BranchOutcome::Submitted {
                        destination: o.destination.clone(),
                        provider_ids,
                    };
                    self.outcome(o.key, Some(&o.destination), outcome, keys);
                }
                WorkerResult::Failed(failure) => {
                    metrics::counter!("sendium_branches_failed_total", "destination" => o.destination.clone())
                        .increment(1);
                    let outcome = BranchOutcome::Failed {
                        destination: Some(o.destination.clone()),
                        failure,
                    };
                    self.outcome(o.key, Some(&o.destination), outcome, Vec::new());
                }
            }
            self.pump(&o.destination);
        }
    }

    fn handed_off(&mut self, keys: Vec<BranchKey>) {
        for key in keys {
            if let Some(t) = self.units.get_mut(&key.unit)
                && let Some((outcome, _, _)) = t.awaiting_handoff.remove(&key.branch)
            {
                t.closing.push(key.branch);
                self.done.push(BranchDone {
                    unit: key.unit,
                    branch: key.branch,
                    outcome,
                });
            }
        }
    }

    fn check_complete(&mut self, id: UnitId) {
        let Some(t) = self.units.get_mut(&id) else {
            return;
        };
        if t.completion_sent || !t.routed.is_complete() || !t.awaiting_handoff.is_empty() {
            return;
        }
        t.completion_sent = true;
        t.completion_asked = Some(Instant::now());
        self.shared.dir.ingress.send(IngressMsg::Complete(vec![id]));
    }

    /// Flush what this turn produced: handoffs, branch completions, worker jobs.
    async fn flush(&mut self) {
        if !self.handoffs.is_empty() {
            let batch = std::mem::take(&mut self.handoffs);
            if !self.shared.dir.dlr.send(DlrMsg::HandOff(batch)) {
                // Not running: the reconciliation after its restart re-sends.
            }
        }
        self.start_write();
        for (name, jobs) in std::mem::take(&mut self.jobs) {
            if let Some(mb) = self.shared.dir.worker(&name)
                && !mb.send(WorkerMsg::Dispatch(jobs))
                && let Some(dest) = self.dests.get_mut(&name)
            {
                // Worker not running: its reconciliation re-dispatches.
                dest.assigned = 0;
            }
        }
    }

    /// Failovers recorded (or not): place the branches again, away from where they left.
    fn moved(&mut self, moves: Vec<BranchMove>, ok: bool) {
        if moves.is_empty() {
            return;
        }
        if !ok {
            self.retry_move.extend(moves);
            return;
        }
        for m in moves {
            let key = BranchKey {
                unit: m.unit,
                branch: m.branch,
            };
            let Some(t) = self.units.get_mut(&m.unit) else {
                continue;
            };
            if let Some(b) = t.routed.branches.iter_mut().find(|b| b.no == m.branch) {
                b.moved_from(&m.from);
            }
            if !t.is_done(m.branch) && !t.awaiting_handoff.contains_key(&m.branch) {
                self.place(key, Occasion::Leaving(&m.from));
            }
        }
    }

    fn branches_recorded(&mut self, batch: Vec<BranchDone>, ok: bool) {
        if batch.is_empty() {
            return;
        }
        if !ok {
            // Retried on the tick (a failing store is not hammered).
            self.retry_done.extend(batch);
            return;
        }
        self.shared.health.routed_work.ok();
        let mut finished = Vec::new();
        for d in batch {
            if let Some(t) = self.units.get_mut(&d.unit) {
                t.closing.retain(|b| *b != d.branch);
                if let Some(b) = t.routed.branches.iter_mut().find(|b| b.no == d.branch)
                    && b.outcome.is_none()
                {
                    b.outcome = Some(d.outcome);
                }
                if t.routed.is_complete() && t.awaiting_handoff.is_empty() && t.closing.is_empty() && !t.completion_sent
                {
                    t.completion_sent = true;
                    t.completion_asked = Some(Instant::now());
                    finished.push(d.unit);
                }
            }
        }
        if !finished.is_empty() {
            self.shared.dir.ingress.send(IngressMsg::Complete(finished));
        }
    }

    fn sources_completed(&mut self, ids: Vec<UnitId>) {
        self.to_remove.extend(ids);
        self.start_write();
    }

    fn removed(&mut self, ids: Vec<UnitId>, ok: bool) {
        if ids.is_empty() {
            return;
        }
        if !ok {
            self.retry_remove.extend(ids);
            return;
        }
        for id in &ids {
            self.units.remove(id);
        }
        metrics::counter!("sendium_completed_total").increment(ids.len() as u64);
        self.shared.dir.selector.send(SelectorMsg::Completed(ids));
    }

    fn destination_state(&mut self, name: &str, up: bool) {
        let Some(dest) = self.dests.get_mut(name) else {
            return;
        };
        dest.up = up;
        if up {
            self.pump(name);
            self.place_waiting(Some(name));
            return;
        }
        // Down: branches queued here (not given to the worker) go to another reachable
        // target of their route, or wait.
        let queued: Vec<BranchKey> = dest.queue.drain(..).collect();
        for key in queued {
            if let Some(t) = self.units.get_mut(&key.unit) {
                t.clear_dispatched(key.branch);
            }
            self.place(key, Occasion::Fresh);
        }
    }

    fn reconcile(&mut self, peer: Peer) {
        tracing::info!(?peer, "reconciling after a restart");
        match peer {
            Peer::Worker(name) => {
                if let Some(dest) = self.dests.get_mut(&name) {
                    dest.assigned = 0;
                    dest.queue.clear();
                }
                let keys: Vec<BranchKey> = self
                    .units
                    .iter()
                    .flat_map(|(id, t)| {
                        t.dispatched
                            .iter()
                            .filter(|(_, d)| d.as_ref() == name)
                            .map(|(b, _)| BranchKey { unit: *id, branch: *b })
                            .collect::<Vec<_>>()
                    })
                    .collect();
                for key in keys {
                    if let Some(t) = self.units.get_mut(&key.unit) {
                        t.clear_dispatched(key.branch);
                    }
                    self.place(key, Occasion::Fresh);
                }
            }
            Peer::DlrCorrelator => {
                let all: Vec<Handoff> = self
                    .units
                    .values()
                    .flat_map(|t| {
                        t.awaiting_handoff
                            .iter()
                            .map(|(b, (o, k, _))| Self::handoff(t, *b, o, k))
                            .collect::<Vec<_>>()
                    })
                    .collect();
                self.handoffs.extend(all);
            }
            Peer::Ingress => {
                let ids: Vec<UnitId> = self
                    .units
                    .iter()
                    .filter(|(_, t)| t.completion_sent)
                    .map(|(id, _)| *id)
                    .collect();
                if !ids.is_empty() {
                    self.shared.dir.ingress.send(IngressMsg::Complete(ids));
                }
            }
            Peer::Selector => {
                self.shared.dir.selector.send(SelectorMsg::Reconcile {
                    free: self.free(),
                    exclude: Vec::new(),
                });
            }
        }
    }

    async fn tick(&mut self) {
        let record = std::mem::take(&mut self.retry_record);
        self.to_record.extend(record);
        self.start_write();
        let done = std::mem::take(&mut self.retry_done);
        self.done.extend(done);
        let remove = std::mem::take(&mut self.retry_remove);
        self.to_remove.extend(remove);
        let moves = std::mem::take(&mut self.retry_move);
        self.to_move.extend(moves);
        self.start_write();
        self.place_waiting(None);
        let retry: Vec<BranchKey> = std::mem::take(&mut self.retry_handoff);
        let now = Instant::now();
        let mut resend = Vec::new();
        for t in self.units.values_mut() {
            let mut due = Vec::new();
            for (branch, (_, _, sent)) in t.awaiting_handoff.iter_mut() {
                let key = BranchKey {
                    unit: t.unit.id,
                    branch: *branch,
                };
                if retry.contains(&key) || now.duration_since(*sent) > HANDOFF_RESEND {
                    *sent = now;
                    due.push(*branch);
                }
            }
            for b in due {
                if let Some((o, k, _)) = t.awaiting_handoff.get(&b) {
                    resend.push(Self::handoff(t, b, o, k));
                }
            }
        }
        self.handoffs.extend(resend);
        // Source completions whose answer never came (lost while Ingress or this actor
        // restarted): ask again; completion is idempotent.
        let again: Vec<UnitId> = self
            .units
            .values_mut()
            .filter(|t| {
                t.completion_asked
                    .is_some_and(|at| now.duration_since(at) > COMPLETION_RESEND)
            })
            .map(|t| {
                t.completion_asked = Some(now);
                t.unit.id
            })
            .collect();
        if !again.is_empty() {
            self.shared.dir.ingress.send(IngressMsg::Complete(again));
        }
        let names: Vec<String> = self.dests.keys().cloned().collect();
        for n in names {
            self.pump(&n);
        }
    }

    /// Rebuild the projection from routed-work and the pending stage (startup and
    /// restart). Units whose sources are gone were completed: forget them.
    async fn restore(&mut self) -> Result<(), ActorProcessingErr> {
        let mut after = None;
        let mut restored = 0u64;
        loop {
            let page = self.store.load_after(after, 1_000).await?;
            let Some(last) = page.last().map(|u| u.id) else {
                break;
            };
            after = Some(last);
            let ids: Vec<UnitId> = page.iter().map(|u| u.id).collect();
            let units = self
                .shared
                .dir
                .ingress
                .call(|reply| IngressMsg::Units { ids, reply }, CALL_TIMEOUT)
                .await
                .map_err(|e| format!("restoring routed work: {e}"))??;
            let mut by_id: HashMap<UnitId, Unit> = units.into_iter().map(|u| (u.unit.id, u.unit)).collect();
            let mut gone = Vec::new();
            for routed in page {
                match by_id.remove(&routed.id) {
                    Some(unit) => {
                        restored += 1;
                        self.track(Arc::new(unit), routed);
                    }
                    None => gone.push(routed.id),
                }
            }
            if !gone.is_empty() {
                let forget = sendium_storage::RoutedWrite {
                    remove: gone,
                    ..Default::default()
                };
                self.store.apply(forget).await?;
            }
        }
        if restored > 0 {
            tracing::info!(units = restored, "restored routed work");
            metrics::counter!("sendium_routed_restored_total").increment(restored);
        }
        Ok(())
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
            .worker_capacity
            .iter()
            .map(|(name, cap)| {
                (
                    name.clone(),
                    Destination {
                        name: Arc::from(name.as_str()),
                        up: false,
                        failover_after: args
                            .failover_after
                            .get(name)
                            .copied()
                            .unwrap_or(Duration::from_secs(10)),
                        assigned: 0,
                        capacity: (*cap).max(1),
                        queue: VecDeque::new(),
                    },
                )
            })
            .collect();
        let mut state = RouterState {
            shared: args.shared,
            durable: args.store.capabilities().durable,
            store: args.store,
            routes: args.routes,
            max_in_flight: args.max_in_flight.max(1),
            max_age: args.max_age,
            dlr_enabled: args.dlr_enabled,
            units: HashMap::new(),
            dests,
            waiting: HashMap::new(),
            to_move: Vec::new(),
            retry_move: Vec::new(),
            retry_record: Vec::new(),
            retry_done: Vec::new(),
            to_record: Vec::new(),
            recording: None,
            to_remove: Vec::new(),
            last_write: None,
            write_timer: false,
            retry_remove: Vec::new(),
            retry_handoff: Vec::new(),
            done: Vec::new(),
            handoffs: Vec::new(),
            jobs: HashMap::new(),
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
        for mb in state.shared.dir.workers.values() {
            mb.send(WorkerMsg::ReportState);
        }
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
            RouterMsg::Tick => state.tick().await,
            RouterMsg::Status(reply) => {
                let (waiting, oldest_waiting) = state.waiting_stats();
                let mut first_preference: HashMap<&str, u64> = HashMap::new();
                for key in state.waiting.keys() {
                    if let Some(first) = state
                        .units
                        .get(&key.unit)
                        .and_then(|t| t.branch(key.branch))
                        .and_then(|b| b.preference().next())
                    {
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
