//! In-memory router-queue stage. Outlives the Selector actor, not the process.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use parking_lot::Mutex;

use crate::backend::StageBackend;
use crate::error::RouterQueueError;
use crate::ids::{ReadySeq, UnitId};
use crate::router_queue::{RouterQueueStats, RouterQueueStore, StagedUnit};

#[derive(Debug, Default)]
struct Inner {
    by_seq: BTreeMap<ReadySeq, UnitId>,
    by_id: HashMap<UnitId, ReadySeq>,
    cursor: ReadySeq,
}

#[derive(Debug, Default)]
pub struct MemoryRouterQueueStore {
    inner: Mutex<Inner>,
}

impl MemoryRouterQueueStore {
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl RouterQueueStore for MemoryRouterQueueStore {
    fn backend(&self) -> StageBackend {
        StageBackend::Memory
    }

    async fn stage(&self, units: &[StagedUnit], cursor: ReadySeq) -> Result<(), RouterQueueError> {
        let mut inner = self.inner.lock();
        for u in units {
            // Staging a unit again keeps its first entry (as the file backend does).
            if let std::collections::hash_map::Entry::Vacant(v) = inner.by_id.entry(u.id) {
                v.insert(u.seq);
                inner.by_seq.insert(u.seq, u.id);
            }
        }
        if cursor > inner.cursor {
            inner.cursor = cursor;
        }
        Ok(())
    }

    async fn release(&self, ids: &[UnitId]) -> Result<(), RouterQueueError> {
        let mut inner = self.inner.lock();
        for id in ids {
            if let Some(seq) = inner.by_id.remove(id) {
                inner.by_seq.remove(&seq);
            }
        }
        Ok(())
    }

    async fn staged_after(&self, after: ReadySeq, limit: usize) -> Result<Vec<StagedUnit>, RouterQueueError> {
        let inner = self.inner.lock();
        Ok(inner
            .by_seq
            .range(ReadySeq(after.0.saturating_add(1))..)
            .take(limit)
            .map(|(seq, id)| StagedUnit { id: *id, seq: *seq })
            .collect())
    }

    async fn cursor(&self) -> Result<ReadySeq, RouterQueueError> {
        Ok(self.inner.lock().cursor)
    }

    async fn stats(&self) -> Result<RouterQueueStats, RouterQueueError> {
        let inner = self.inner.lock();
        Ok(RouterQueueStats {
            staged: inner.by_id.len() as u64,
            cursor: inner.cursor,
        })
    }
}
