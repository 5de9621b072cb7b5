//! In-memory routed-work stage. Outlives the Router actor, not the process.

use std::collections::BTreeMap;
use std::ops::Bound;

use async_trait::async_trait;
use parking_lot::Mutex;

use crate::backend::StageCapabilities;
use crate::error::RoutedWorkError;
use crate::ids::UnitId;
use crate::routed_work::{RoutedUnit, RoutedWorkStats, RoutedWorkStore, RoutedWrite};

#[derive(Debug, Default)]
struct Inner {
    units: BTreeMap<UnitId, RoutedUnit>,
    open_branches: u64,
}

#[derive(Debug, Default)]
pub struct MemoryRoutedWorkStore {
    inner: Mutex<Inner>,
}

impl MemoryRoutedWorkStore {
    pub fn new() -> Self {
        Self::default()
    }
}

fn open_count(unit: &RoutedUnit) -> u64 {
    unit.branches.iter().filter(|b| b.outcome.is_none()).count() as u64
}

#[async_trait]
impl RoutedWorkStore for MemoryRoutedWorkStore {
    fn capabilities(&self) -> StageCapabilities {
        StageCapabilities::MEMORY
    }

    async fn apply(&self, write: RoutedWrite) -> Result<(), RoutedWorkError> {
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        for unit in write.record {
            if inner.units.contains_key(&unit.id) {
                continue;
            }
            inner.open_branches += open_count(&unit);
            inner.units.insert(unit.id, unit);
        }
        for m in write.moves {
            if let Some(branch) = inner
                .units
                .get_mut(&m.unit)
                .and_then(|u| u.branches.iter_mut().find(|b| b.no == m.branch))
            {
                branch.moved_from(&m.from);
            }
        }
        for d in write.complete {
            let Some(unit) = inner.units.get_mut(&d.unit) else {
                continue;
            };
            if let Some(branch) = unit.branches.iter_mut().find(|b| b.no == d.branch)
                && branch.outcome.is_none()
            {
                branch.outcome = Some(d.outcome);
                inner.open_branches = inner.open_branches.saturating_sub(1);
            }
        }
        for id in &write.remove {
            if let Some(unit) = inner.units.remove(id) {
                inner.open_branches = inner.open_branches.saturating_sub(open_count(&unit));
            }
        }
        Ok(())
    }

    async fn load_after(&self, after: Option<UnitId>, limit: usize) -> Result<Vec<RoutedUnit>, RoutedWorkError> {
        let inner = self.inner.lock();
        let lower = match after {
            Some(id) => Bound::Excluded(id),
            None => Bound::Unbounded,
        };
        Ok(inner
            .units
            .range((lower, Bound::Unbounded))
            .take(limit)
            .map(|(_, u)| u.clone())
            .collect())
    }

    async fn stats(&self) -> Result<RoutedWorkStats, RoutedWorkError> {
        let inner = self.inner.lock();
        Ok(RoutedWorkStats {
            units: inner.units.len() as u64,
            open_branches: inner.open_branches,
        })
    }
}
