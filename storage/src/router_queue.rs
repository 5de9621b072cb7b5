//! The router-queue stage: the batches select-and-stage picked for routing.
//!
//! Owned by the Selector actor. `stage` records a selected batch together with the
//! selection cursor in one transition, so with a durable backend a restart restores the
//! batch without selecting again and resumes selection after it. A staged unit is
//! released once it no longer needs to be rerouted from here: when routed-work has
//! recorded it durably, or (routed-work in memory) when its source completes.

use async_trait::async_trait;

use crate::backend::StageBackend;
use crate::error::RouterQueueError;
use crate::ids::{ReadySeq, UnitId};

/// A unit recorded as selected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StagedUnit {
    pub id: UnitId,
    pub seq: ReadySeq,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouterQueueStats {
    pub staged: u64,
    pub cursor: ReadySeq,
}

/// The router-queue stage contract.
#[async_trait]
pub trait RouterQueueStore: Send + Sync + 'static {
    fn backend(&self) -> StageBackend;

    /// Record a selected batch and advance the selection cursor, as one transition.
    /// The cursor never moves backwards.
    async fn stage(&self, units: &[StagedUnit], cursor: ReadySeq) -> Result<(), RouterQueueError>;

    /// Forget staged units. Idempotent.
    async fn release(&self, ids: &[UnitId]) -> Result<(), RouterQueueError>;

    /// Staged units with `seq > after`, in seq order, at most `limit` (restore walks
    /// them page by page).
    async fn staged_after(&self, after: ReadySeq, limit: usize) -> Result<Vec<StagedUnit>, RouterQueueError>;

    /// Where selection resumes: every ready unit at or below the cursor was staged once.
    async fn cursor(&self) -> Result<ReadySeq, RouterQueueError>;

    async fn stats(&self) -> Result<RouterQueueStats, RouterQueueError>;
}
