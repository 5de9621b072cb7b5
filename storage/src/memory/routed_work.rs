//! In-memory routed-work stage. Outlives the Router actor, not the process.

use std::collections::BTreeMap;
use std::ops::Bound;

use async_trait::async_trait;
use parking_lot::Mutex;

use crate::backend::StageCapabilities;
use crate::error::RoutedWorkError;
use crate::ids::UnitId;
use crate::routed_work::{BranchDone, BranchMove, RoutedUnit, RoutedWorkStats, RoutedWorkStore, RoutedWrite};

/// The routed-work stage's state and its rules, in memory: the memory backend is this
/// behind a lock; the file backend journals what [`apply`](Self::apply) changed and
/// checkpoints it.
#[derive(Debug, Default)]
pub(crate) struct RoutedWorkState {
    pub(crate) units: BTreeMap<UnitId, RoutedUnit>,
    pub(crate) open_branches: u64,
}

/// What one [`RoutedWorkState::apply`] changed: the parts of the write that took
/// effect, in its order. Applied again to the state it started from, they give the same
/// result.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    /// Units recorded (not recorded before).
    pub(crate) record: Vec<UnitId>,
    pub(crate) moves: Vec<BranchMove>,
    pub(crate) complete: Vec<BranchDone>,
    pub(crate) remove: Vec<UnitId>,
}

impl Applied {
    pub(crate) fn is_empty(&self) -> bool {
        self.record.is_empty() && self.moves.is_empty() && self.complete.is_empty() && self.remove.is_empty()
    }
}

impl RoutedWorkState {
    /// Apply `write` as [`RoutedWorkStore::apply`] describes. With `report` it returns
    /// what took effect (completions are then copied, not moved, into the state);
    /// without, only the recorded ids.
    pub(crate) fn apply(&mut self, write: RoutedWrite, report: bool) -> Applied {
        let mut applied = Applied::default();
        for unit in write.record {
            if self.units.contains_key(&unit.id) {
                continue;
            }
            self.open_branches += open_count(&unit);
            applied.record.push(unit.id);
            self.units.insert(unit.id, unit);
        }
        for m in write.moves {
            if let Some(branch) = self
                .units
                .get_mut(&m.unit)
                .and_then(|u| u.branches.iter_mut().find(|b| b.no == m.branch))
                && branch.moved_from(&m.from)
                && report
            {
                applied.moves.push(m);
            }
        }
        for d in write.complete {
            let Some(unit) = self.units.get_mut(&d.unit) else {
                continue;
            };
            if let Some(branch) = unit.branches.iter_mut().find(|b| b.no == d.branch)
                && branch.outcome.is_none()
            {
                self.open_branches = self.open_branches.saturating_sub(1);
                if report {
                    branch.outcome = Some(d.outcome.clone());
                    applied.complete.push(d);
                } else {
                    branch.outcome = Some(d.outcome);
                }
            }
        }
        for id in write.remove {
            if let Some(unit) = self.units.remove(&id) {
                self.open_branches = self.open_branches.saturating_sub(open_count(&unit));
                if report {
                    applied.remove.push(id);
                }
            }
        }
        applied
    }

    /// Recorded units with `id > after` in id order, at most `limit`.
    pub(crate) fn load_after(&self, after: Option<UnitId>, limit: usize) -> Vec<RoutedUnit> {
        let lower = match after {
            Some(id) => Bound::Excluded(id),
            None => Bound::Unbounded,
        };
        self.units
            .range((lower, Bound::Unbounded))
            .take(limit)
            .map(|(_, u)| u.clone())
            .collect()
    }

    pub(crate) fn stats(&self) -> RoutedWorkStats {
        RoutedWorkStats {
            units: self.units.len() as u64,
            open_branches: self.open_branches,
        }
    }
}

#[derive(Debug, Default)]
pub struct MemoryRoutedWorkStore {
    inner: Mutex<RoutedWorkState>,
}

impl MemoryRoutedWorkStore {
    pub fn new() -> Self {
        Self::default()
    }
}

pub(crate) fn open_count(unit: &RoutedUnit) -> u64 {
    unit.branches.iter().filter(|b| b.outcome.is_none()).count() as u64
}

#[async_trait]
impl RoutedWorkStore for MemoryRoutedWorkStore {
    fn capabilities(&self) -> StageCapabilities {
        StageCapabilities::MEMORY
    }

    async fn apply(&self, write: RoutedWrite) -> Result<(), RoutedWorkError> {
        self.inner.lock().apply(write, false);
        Ok(())
    }

    async fn load_after(&self, after: Option<UnitId>, limit: usize) -> Result<Vec<RoutedUnit>, RoutedWorkError> {
        Ok(self.inner.lock().load_after(after, limit))
    }

    async fn stats(&self) -> Result<RoutedWorkStats, RoutedWorkError> {
        Ok(self.inner.lock().stats())
    }
}
