//! The partitions of a database several Sendium processes share: which units this
//! Router works on.
//!
//! Read on every tick from the process's [`Ownership`] (a level, so a lost message or
//! a restart cannot make it miss a change):
//!
//! * a partition newly *active* is adopted: its routed work is restored from the store,
//!   and the Selector is told to select its staged and ready units;
//! * a partition being *released* gets no new work: its units that nothing is under way
//!   for are forgotten (their state is in the store), and once none of its units has a
//!   branch at a worker, a receipt handoff, a completion or a write in flight, the
//!   ownership is told it may go — so the process that takes it over never submits a
//!   branch this one still has at its provider;
//! * a partition no longer held at all (its lock's connection was lost, and another
//!   process may hold it already) is forgotten at once.

use std::collections::BTreeSet;
use std::sync::Arc;

use sendium_storage::UnitId;
use sendium_storage::postgresql::Ownership;

use super::{RouterState, Tracked};
use crate::selector::SelectorMsg;

/// This Router's view of the partitions it works on.
pub(super) struct Partitions {
    ownership: Arc<Ownership>,
    /// Partitions whose work may be in the projection.
    working: BTreeSet<u16>,
    /// Held, but being handed to another process: no new work.
    leaving: BTreeSet<u16>,
}

impl Partitions {
    /// The partitions active when the Router starts (its restore reads theirs).
    pub(super) fn new(ownership: Arc<Ownership>) -> Self {
        let a = ownership.assignment();
        Self {
            working: a.active.iter().chain(&a.releasing).copied().collect(),
            leaving: a.releasing.into_iter().collect(),
            ownership,
        }
    }

    pub(super) fn partition_of(&self, unit: &sendium_storage::Unit) -> u16 {
        unit.parts
            .first()
            .map_or(0, |p| self.ownership.partition_of(&p.account, &p.destination.addr))
    }

    /// New work of this partition is taken on.
    pub(super) fn takes(&self, partition: u16) -> bool {
        self.working.contains(&partition) && !self.leaving.contains(&partition)
    }
}

impl RouterState {
    /// The partition of a unit (0 unless the database is shared).
    pub(super) fn partition(&self, unit: &sendium_storage::Unit) -> u16 {
        self.partitions.as_ref().map_or(0, |p| p.partition_of(unit))
    }

    /// Whether new work of this unit's partition is taken on (always, unless the
    /// database is shared).
    pub(super) fn takes(&self, partition: u16) -> bool {
        self.partitions.as_ref().is_none_or(|p| p.takes(partition))
    }

    /// Something is under way for this unit that its partition's next owner must not
    /// repeat: a branch at a worker, a receipt handoff, a branch completion or failover
    /// not yet written, its source's completion.
    fn busy(&self, id: UnitId, t: &Tracked) -> bool {
        // Branches queued for a destination were taken back when the partition started
        // leaving (and no new ones are placed), so a dispatched branch is at a worker.
        !t.dispatched.is_empty()
            || !t.awaiting_handoff.is_empty()
            || !t.closing.is_empty()
            || t.completion_sent
            || self.to_move.iter().chain(&self.retry_move).any(|m| m.unit == id)
    }

    /// Bring the projection in line with the partitions this process holds now.
    pub(super) async fn sync_partitions(&mut self) {
        let Some(p) = &self.partitions else {
            return;
        };
        let a = p.ownership.assignment();
        let held: BTreeSet<u16> = a.active.iter().chain(&a.releasing).copied().collect();
        let lost: BTreeSet<u16> = p.working.difference(&held).copied().collect();
        let adopted: Vec<u16> = a.active.iter().copied().filter(|x| !p.working.contains(x)).collect();
        let newly_leaving: Vec<u16> = a
            .releasing
            .iter()
            .copied()
            .filter(|x| p.working.contains(x) && !p.leaving.contains(x))
            .collect();
        if let Some(p) = &mut self.partitions {
            for x in &lost {
                p.working.remove(x);
                p.leaving.remove(x);
            }
            p.leaving.extend(newly_leaving.iter().copied());
            // Released before this Router ever worked on them (it restarted meanwhile):
            // nothing of theirs is here.
            let strangers: Vec<u16> = a.releasing.iter().copied().filter(|x| !p.working.contains(x)).collect();
            if !strangers.is_empty() {
                p.ownership.released(strangers);
            }
        }
        if !lost.is_empty() {
            let n = self.forget(|_, t, me| lost.contains(&me.partition(&t.unit)));
            tracing::warn!(partitions = ?lost, units = n, "partitions lost: their work is another process's now");
        }
        if !newly_leaving.is_empty() {
            tracing::info!(partitions = ?newly_leaving, "handing partitions to another process");
            self.drop_queued_of_leaving();
        }
        self.settle_leaving();
        if !adopted.is_empty() {
            if let Some(p) = &mut self.partitions {
                p.working.extend(adopted.iter().copied());
            }
            let before = self.units.len();
            if let Err(e) = self.restore().await {
                // The tick tries again: the partitions stay unadopted until it works.
                tracing::warn!(error = %e, "restoring adopted partitions failed");
                if let Some(p) = &mut self.partitions {
                    for x in &adopted {
                        p.working.remove(x);
                    }
                }
                return;
            }
            let restored = self.units.len().saturating_sub(before);
            tracing::info!(partitions = ?adopted, units = restored, "took over partitions");
            self.shared.dir.selector.send(SelectorMsg::Rescan { restored });
        }
    }

    /// Branches of leaving partitions that wait in a destination's queue (not given to
    /// its worker yet) are not sent: the next owner sends them.
    fn drop_queued_of_leaving(&mut self) {
        let mut dropped = Vec::new();
        for dest in self.dests.values_mut() {
            let units = &self.units;
            let partitions = &self.partitions;
            dest.queue.retain(|k| {
                let leaving = units.get(&k.unit).is_some_and(|t| {
                    partitions
                        .as_ref()
                        .is_some_and(|p| p.leaving.contains(&p.partition_of(&t.unit)))
                });
                if leaving {
                    dropped.push(*k);
                }
                !leaving
            });
        }
        for k in dropped {
            if let Some(t) = self.units.get_mut(&k.unit) {
                t.clear_dispatched(k.branch);
            }
        }
        self.waiting.retain(|k, _| {
            self.units.get(&k.unit).is_none_or(|t| {
                self.partitions
                    .as_ref()
                    .is_none_or(|p| !p.leaving.contains(&p.partition_of(&t.unit)))
            })
        });
    }

    /// Forget the idle units of leaving partitions; hand back each partition none of
    /// whose units is busy any more.
    pub(super) fn settle_leaving(&mut self) {
        let leaving: BTreeSet<u16> = match &self.partitions {
            Some(p) if !p.leaving.is_empty() => p.leaving.clone(),
            _ => return,
        };
        self.forget(|id, t, me| leaving.contains(&me.partition(&t.unit)) && !me.busy(id, t));
        let mut still: BTreeSet<u16> = self
            .units
            .values()
            .map(|t| self.partition(&t.unit))
            .filter(|x| leaving.contains(x))
            .collect();
        // Not recorded yet: their routes are being written.
        for (u, _) in self.to_record.iter().chain(&self.retry_record) {
            still.insert(self.partition(u));
        }
        still.extend(self.recording_partitions.iter().copied());
        let settled: Vec<u16> = leaving.difference(&still).copied().collect();
        if settled.is_empty() {
            return;
        }
        if let Some(p) = &mut self.partitions {
            for x in &settled {
                p.leaving.remove(x);
                p.working.remove(x);
            }
            tracing::info!(partitions = ?settled, "partitions settled: handed to another process");
            p.ownership.released(settled);
        }
    }

    /// Drop units from the projection (their state is in the store) and return their
    /// in-flight slots to the Selector. Returns how many.
    fn forget(&mut self, which: impl Fn(UnitId, &Tracked, &RouterState) -> bool) -> usize {
        let ids: Vec<UnitId> = self
            .units
            .iter()
            .filter(|(id, t)| which(**id, t, self))
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            self.units.remove(id);
        }
        if !ids.is_empty() {
            self.waiting.retain(|k, _| self.units.contains_key(&k.unit));
            self.shared.dir.selector.send(SelectorMsg::Credit(ids.len()));
        }
        ids.len()
    }
}
