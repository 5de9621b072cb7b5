//! In-memory router-queue stage. Outlives the Selector actor, not the process.

use std::collections::BTreeMap;

use async_trait::async_trait;
use parking_lot::Mutex;

use crate::backend::StageCapabilities;
use crate::error::RouterQueueError;
use crate::ids::{IdMap, ReadyCursor, ReadySeq, UnitId};
use crate::router_queue::{RouterQueueStats, RouterQueueStore, RouterQueueWrite, StagedUnit};

/// The router-queue stage's state and its rules, in memory: the memory backend is this
/// behind a lock; the file backend journals what [`apply`](Self::apply) changed and
/// checkpoints it.
#[derive(Debug, Default)]
pub(crate) struct RouterQueueState {
    pub(crate) by_seq: BTreeMap<ReadySeq, UnitId>,
    pub(crate) by_id: IdMap<UnitId, ReadySeq>,
    pub(crate) cursor: ReadyCursor,
}

/// What one [`RouterQueueState::apply`] changed (with `report`): the units staged, whether
/// a lane's cursor moved, the units released with their seqs.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    pub(crate) stage: Vec<StagedUnit>,
    pub(crate) cursor_moved: bool,
    pub(crate) release: Vec<StagedUnit>,
}

impl Applied {
    pub(crate) fn is_empty(&self) -> bool {
        self.stage.is_empty() && !self.cursor_moved && self.release.is_empty()
    }
}

impl RouterQueueState {
    /// Apply `write` as [`RouterQueueStore::apply`] describes; with `report`, return
    /// what took effect.
    pub(crate) fn apply(&mut self, write: &RouterQueueWrite, report: bool) -> Applied {
        let mut applied = Applied::default();
        for u in &write.stage {
            // Staging a unit again keeps its first entry.
            if let std::collections::hash_map::Entry::Vacant(v) = self.by_id.entry(u.id) {
                v.insert(u.seq);
                self.by_seq.insert(u.seq, u.id);
                if report {
                    applied.stage.push(*u);
                }
            }
        }
        if let Some(cursor) = &write.cursor {
            for seq in cursor.positions() {
                applied.cursor_moved |= self.cursor.advance(seq);
            }
        }
        for id in &write.release {
            if let Some(seq) = self.by_id.remove(id) {
                self.by_seq.remove(&seq);
                if report {
                    applied.release.push(StagedUnit { id: *id, seq });
                }
            }
        }
        applied
    }

    pub(crate) fn staged_after(&self, after: ReadySeq, limit: usize) -> Vec<StagedUnit> {
        self.by_seq
            .range(ReadySeq(after.0.saturating_add(1))..)
            .take(limit)
            .map(|(seq, id)| StagedUnit { id: *id, seq: *seq })
            .collect()
    }

    pub(crate) fn stats(&self) -> RouterQueueStats {
        RouterQueueStats {
            staged: self.by_id.len() as u64,
            cursor: self.cursor,
        }
    }
}

#[derive(Debug, Default)]
pub struct MemoryRouterQueueStore {
    inner: Mutex<RouterQueueState>,
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
        self.inner.lock().apply(&write, false);
        Ok(())
    }

    async fn staged_after(&self, after: ReadySeq, limit: usize) -> Result<Vec<StagedUnit>, RouterQueueError> {
        Ok(self.inner.lock().staged_after(after, limit))
    }

    async fn cursor(&self) -> Result<ReadyCursor, RouterQueueError> {
        Ok(self.inner.lock().cursor)
    }

    async fn stats(&self) -> Result<RouterQueueStats, RouterQueueError> {
        Ok(self.inner.lock().stats())
    }
}
