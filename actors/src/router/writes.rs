//! The Router's routed-work writes: new routes, failovers, branch completions and
//! removals of completed units, gathered while one write is in flight and committed
//! together (group commit), paced when the store is durable; and what each write's
//! result does to the projection.

use std::sync::Arc;
use std::time::Instant;

use sendium_storage::failpoint;
use std::collections::HashSet;

use sendium_storage::{BranchDone, BranchMove, ReadyUnit, RoutedUnit, Unit, UnitId};

use super::placement::Occasion;
use super::plan::{plan, receipt_targets};
use super::{BranchKey, CALL_TIMEOUT, RouterMsg, RouterState, Tracked};
use crate::ingress::IngressMsg;
use crate::selector::SelectorMsg;

/// One routed-work write — routes recorded, branches completed, units removed — and
/// how it went.
pub struct Written {
    batch: Vec<(Arc<Unit>, RoutedUnit)>,
    moves: Vec<BranchMove>,
    done: Vec<BranchDone>,
    removed: Vec<UnitId>,
    result: Result<(), sendium_storage::RoutedWorkError>,
}

impl RouterState {
    pub(super) async fn route(&mut self, units: Vec<ReadyUnit>) {
        let mut known = Vec::new();
        let mut dropped = 0;
        let mut fresh = Vec::with_capacity(units.len());
        let routes = self.routes.current();
        for ru in units {
            let id = ru.unit.id;
            if self.units.contains_key(&id) || self.unwritten.contains(&id) {
                known.push(id);
                continue;
            }
            if !self.takes(self.partition(&ru.unit)) {
                // Its partition is leaving (or gone): the next owner selects it.
                dropped += 1;
                continue;
            }
            let routed = plan(&routes, &ru.unit);
            self.unwritten.insert(id);
            fresh.push((Arc::new(ru.unit), routed));
        }
        if dropped > 0 {
            self.shared.dir.selector.send(SelectorMsg::Credit(dropped));
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

    /// Staged units sent again by the Selector. Its reads of the router queue and the
    /// pending stage came before this message: a unit this Router completed and forgot
    /// since then would be routed and submitted a second time. So the sources of the
    /// units not held here are read again now, after every completion this Router has
    /// seen, and only those still pending are routed.
    pub(super) async fn route_restored(&mut self, units: Vec<ReadyUnit>) {
        let (held, unknown): (Vec<ReadyUnit>, Vec<ReadyUnit>) =
            units.into_iter().partition(|u| self.units.contains_key(&u.unit.id));
        let ids: Vec<UnitId> = unknown.iter().map(|u| u.unit.id).collect();
        let pending: Option<HashSet<UnitId>> = if ids.is_empty() {
            Some(HashSet::new())
        } else {
            match self
                .shared
                .dir
                .ingress
                .call(|reply| IngressMsg::Units { ids, reply }, CALL_TIMEOUT)
                .await
            {
                Ok(Ok(units)) => Some(units.into_iter().map(|u| u.unit.id).collect()),
                Ok(Err(e)) => {
                    self.shared.health.pending.failed("pending", &e);
                    None
                }
                Err(_) => None,
            }
        };
        let Some(pending) = pending else {
            // Not known now: route them as sent rather than leave them staged with
            // nothing to send them again.
            let mut all = held;
            all.extend(unknown);
            self.route(all).await;
            return;
        };
        let (live, gone): (Vec<ReadyUnit>, Vec<ReadyUnit>) =
            unknown.into_iter().partition(|u| pending.contains(&u.unit.id));
        if !gone.is_empty() {
            self.shared.dir.selector.send(SelectorMsg::Credit(gone.len()));
            if self.durable {
                // Their staged entries are done with.
                self.shared
                    .dir
                    .selector
                    .send(SelectorMsg::Routed(gone.iter().map(|u| u.unit.id).collect()));
            }
        }
        let mut all = held;
        all.extend(live);
        self.route(all).await;
    }

    /// One routed-work write with everything waiting — new routes, branch completions,
    /// removals — unless a write is in flight (then they go into the next one).
    pub(super) fn start_write(&mut self) {
        if self.writing
            || self.write_timer
            || (self.to_record.is_empty()
                && self.to_move.is_empty()
                && self.done.is_empty()
                && self.to_remove.is_empty())
        {
            return;
        }
        // Pace durable writes (see `crate::pacing`).
        if self.durable {
            let wait = crate::pacing::gap_left(crate::pacing::WRITE_GAP, self.last_write, Instant::now());
            if !wait.is_zero() {
                self.write_timer = true;
                let shared = self.shared.clone();
                crate::pacing::send_after(wait, move || {
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
        self.writing = true;
        if self.partitions.is_some() {
            self.recording_partitions = batch.iter().map(|(u, _)| self.partition(u)).collect();
        }
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

    pub(super) fn written(&mut self, w: Written) {
        self.writing = false;
        self.recording_partitions.clear();
        let ok = w.result.is_ok();
        if let Err(e) = &w.result {
            self.shared.health.routed_work.failed("routed-work", e);
        }
        if ok {
            for (u, _) in &w.batch {
                self.unwritten.remove(&u.id);
            }
        }
        if let Some(fresh) = settle(w.batch, ok, &mut self.retry_record) {
            self.recorded(fresh);
        }
        if let Some(moves) = settle(w.moves, ok, &mut self.retry_move) {
            self.moved(moves);
        }
        if let Some(done) = settle(w.done, ok, &mut self.retry_done) {
            self.branches_recorded(done);
        }
        if let Some(removed) = settle(w.removed, ok, &mut self.retry_remove) {
            self.removed(removed);
        }
        self.start_write();
    }

    fn recorded(&mut self, fresh: Vec<(Arc<Unit>, RoutedUnit)>) {
        self.shared.health.routed_work.ok();
        // A restarted Router may get the write of its predecessor: it restored those
        // units from the store already.
        let fresh: Vec<(Arc<Unit>, RoutedUnit)> = fresh
            .into_iter()
            .filter(|(u, _)| !self.units.contains_key(&u.id))
            .collect();
        // Recorded for a partition that is leaving or gone meanwhile: the next owner
        // restores it from the store.
        let (fresh, elsewhere): (Vec<_>, Vec<_>) = fresh.into_iter().partition(|(u, _)| self.takes(self.partition(u)));
        if !elsewhere.is_empty() {
            self.shared.dir.selector.send(SelectorMsg::Credit(elsewhere.len()));
        }
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
    pub(super) fn track(&mut self, unit: Arc<Unit>, routed: RoutedUnit) {
        let id = unit.id;
        let open: Vec<u16> = routed
            .branches
            .iter()
            .filter(|b| b.outcome.is_none())
            .map(|b| b.no)
            .collect();
        // The priority stored at admission, not the route's current one: the pending
        // stage selected the unit in that lane, and the destination queues must agree.
        let priority = unit.parts.first().map_or(0, |p| p.route_priority);
        self.units.insert(
            id,
            Tracked {
                priority,
                targets: receipt_targets(&unit),
                deadline: super::placement::deadline(&unit, self.max_age),
                bounced: Default::default(),
                unit,
                routed,
                dispatched: Default::default(),
                awaiting_handoff: Default::default(),
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

    /// Failovers recorded (or not): place the branches again, away from where they left.
    fn moved(&mut self, moves: Vec<BranchMove>) {
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
            if !t.is_done(m.branch) && !t.awaiting_handoff.contains(m.branch) {
                self.place(key, Occasion::Leaving(&m.from));
            }
        }
    }

    fn branches_recorded(&mut self, batch: Vec<BranchDone>) {
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

    pub(super) fn sources_completed(&mut self, ids: Vec<UnitId>) {
        self.to_remove.extend(ids);
        self.start_write();
    }

    fn removed(&mut self, mut ids: Vec<UnitId>) {
        if self.partitions.is_some() {
            // A unit forgotten when its partition was lost returned its slot then.
            ids.retain(|id| self.units.remove(id).is_some());
        } else {
            for id in &ids {
                self.units.remove(id);
            }
        }
        metrics::counter!("sendium_completed_total").increment(ids.len() as u64);
        self.shared.dir.selector.send(SelectorMsg::Completed(ids));
    }
}

/// One part of a finished write: nothing to do when it is empty; kept for the tick to
/// write again when the write failed (a failing store is not hammered); else handed on.
fn settle<T>(part: Vec<T>, ok: bool, retry: &mut Vec<T>) -> Option<Vec<T>> {
    if part.is_empty() {
        return None;
    }
    if !ok {
        retry.extend(part);
        return None;
    }
    Some(part)
}
