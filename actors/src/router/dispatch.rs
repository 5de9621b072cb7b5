//! Branches to destination workers within their credit, and what the workers report
//! back: outcomes, hand-backs, reachability.

use std::time::Instant;

use sendium_storage::{BranchDone, BranchFailure, BranchKind, BranchMove, BranchOutcome, Disposition, Timestamp};

use sendium_profiles::RouteTable;

use super::placement::Occasion;
use super::{BranchKey, Destination, RouterState, WorkerOutcome, WorkerResult};
use crate::destination_worker::{BranchJob, WorkerMsg};
use crate::dlr_correlator::DlrMsg;
use crate::spec::DestinationSlot;

impl RouterState {
    /// A branch with nowhere to go: no route matched, or its multipart group expired.
    pub(super) fn fail_unroutable(&mut self, key: BranchKey) {
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
            BranchOutcome::Failed {
                destination: None,
                failure,
            },
            Vec::new(),
        );
    }

    /// Move queued branches to a reachable destination's worker within its credit.
    pub(super) fn pump(&mut self, name: &str) {
        let now = Timestamp::now();
        let mut expired = Vec::new();
        let Some(dest) = self.dests.get_mut(name) else {
            return;
        };
        while dest.up && dest.assigned < dest.capacity {
            let Some(key) = dest.queue.pop() else {
                break;
            };
            let Some(t) = self.units.get(&key.unit) else {
                continue;
            };
            if t.is_done(key.branch) || t.awaiting_handoff.contains(key.branch) {
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

    /// A branch ended: hand it to the DLR store if it owes a receipt, else record it.
    pub(super) fn outcome(&mut self, key: BranchKey, outcome: BranchOutcome, keys: Vec<String>) {
        let Some(t) = self.units.get(&key.unit) else {
            return;
        };
        if t.is_done(key.branch) || t.awaiting_handoff.contains(key.branch) {
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

    pub(super) fn worker_outcomes(&mut self, outcomes: Vec<WorkerOutcome>) {
        for o in outcomes {
            if let Some(dest) = self.dests.get_mut(&o.destination) {
                dest.assigned = dest.assigned.saturating_sub(1);
            }
            match o.result {
                WorkerResult::Bounced | WorkerResult::Returned => {
                    let Some(t) = self.units.get_mut(&o.key.unit) else {
                        continue;
                    };
                    if t.is_done(o.key.branch)
                        || t.awaiting_handoff.contains(o.key.branch)
                        || t.dispatched_to(o.key.branch) != Some(o.destination.as_str())
                    {
                        continue;
                    }
                    t.clear_dispatched(o.key.branch);
                    if matches!(o.result, WorkerResult::Returned) {
                        self.place(o.key, Occasion::Fresh);
                    } else {
                        t.count_bounce(o.key.branch);
                        // Placed again once the failover is recorded (see `moved`).
                        self.to_move.push(BranchMove {
                            unit: o.key.unit,
                            branch: o.key.branch,
                            from: o.destination.clone(),
                        });
                    }
                }
                WorkerResult::Submitted { provider_ids, keys } => {
                    let outcome = BranchOutcome::Submitted {
                        destination: o.destination.clone(),
                        provider_ids,
                    };
                    self.outcome(o.key, outcome, keys);
                }
                WorkerResult::Failed(failure) => {
                    metrics::counter!("sendium_branches_failed_total", "destination" => o.destination.clone())
                        .increment(1);
                    let outcome = BranchOutcome::Failed {
                        destination: Some(o.destination.clone()),
                        failure,
                    };
                    self.outcome(o.key, outcome, Vec::new());
                }
            }
            self.pump(&o.destination);
        }
    }

    pub(super) fn destination_state(&mut self, name: &str, up: bool) {
        let Some(dest) = self.dests.get_mut(name) else {
            return;
        };
        dest.up = up && !dest.replacing;
        let up = dest.up;
        if up {
            self.pump(name);
            self.place_waiting(Some(name));
            return;
        }
        // Down: branches queued here (not given to the worker) go to another reachable
        // target of their route, or wait.
        let queued: Vec<BranchKey> = dest.queue.take_all();
        for key in queued {
            if let Some(t) = self.units.get_mut(&key.unit) {
                t.clear_dispatched(key.branch);
            }
            self.place(key, Occasion::Fresh);
        }
    }

    /// A reload changed the destinations (see [`RouterMsg::Reconfigure`]): take the new
    /// route table, add the new destinations (down until their workers report), take
    /// the replaced ones down, and place again what was queued for a removed one — on
    /// another target of its route, or by the new table when none of its targets is
    /// left. Branches a removed or replaced destination's worker holds come back as its
    /// outcomes.
    ///
    /// [`RouterMsg::Reconfigure`]: super::RouterMsg::Reconfigure
    pub(super) fn reconfigure(&mut self, slots: Vec<DestinationSlot>, replaced: &[String], routes: RouteTable) {
        self.routes.replace(routes);
        let removed: Vec<String> = self
            .dests
            .keys()
            .filter(|n| !slots.iter().any(|s| &s.name == *n))
            .cloned()
            .collect();
        for slot in &slots {
            match self.dests.get_mut(&slot.name) {
                Some(d) => {
                    d.capacity = slot.capacity.max(1);
                    d.failover_after = slot.failover_after;
                }
                None => {
                    self.dests.insert(slot.name.clone(), Destination::new(slot));
                }
            }
        }
        for name in replaced {
            if let Some(d) = self.dests.get_mut(name) {
                d.replacing = true;
            }
            self.destination_state(name, false);
        }
        let mut orphans = Vec::new();
        for name in removed {
            if let Some(mut d) = self.dests.remove(&name) {
                orphans.extend(d.queue.take_all());
            }
        }
        for key in orphans {
            if let Some(t) = self.units.get_mut(&key.unit) {
                t.clear_dispatched(key.branch);
            }
            self.place(key, Occasion::Fresh);
        }
        self.place_waiting(None);
    }

    /// The worker of a destination started (again): a replacement's reports count from
    /// now on.
    pub(super) fn worker_started(&mut self, name: &str) {
        if let Some(d) = self.dests.get_mut(name)
            && d.replacing
        {
            d.replacing = false;
            if let Some(mb) = self.shared.dir.worker(name) {
                mb.send(WorkerMsg::ReportState);
            }
        }
    }

    /// Flush what this turn produced: handoffs, branch completions, worker jobs.
    pub(super) async fn flush(&mut self) {
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
}
