//! In-memory router-queue stage. Outlives the Selector actor, not the process.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use parking_lot::Mutex;

use crate::backend::StageCapabilities;
use crate::error::RouterQueueError;
use crate::ids::{ReadyCursor, ReadySeq, UnitId};
use crate::router_queue::{RouterQueueStats, RouterQueueStore, RouterQueueWrite, StagedUnit};

#[derive(Debug, Default)]
struct Inner {
    by_seq: BTreeMap<ReadySeq, UnitId>,
    by_id: HashMap<UnitId, ReadySeq>,
    cursor: ReadyCursor,
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
    fn capabilities(&self) -> StageCapabilities {
        StageCapabilities::MEMORY
    }

    async fn apply(&self, write: RouterQueueWrite) -> Result<(), RouterQueueError> {
        let mut inner = self.inner.lock();
        for u in &write.stage {
            // Staging a unit again keeps its first entry (as the file backend does).
            if let std::collections::hash_map::Entry::Vacant(v) = inner.by_id.entry(u.id) {
                v.insert(u.seq);
                inner.by_seq.insert(u.seq, u.id);
            }
        }
        if let Some(cursor) = &write.cursor {
            inner.cursor.merge(cursor);
        }
        for id in &write.release {
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

    async fn cursor(&self) -> Result<ReadyCursor, RouterQueueError> {
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
