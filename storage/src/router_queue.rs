//! The router-queue stage: the batches select-and-stage picked for routing.
//!
//! Owned by the Selector actor. A write stages a selected batch together with the
//! selection cursor in one transition, so with a durable backend a restart restores the
//! batch without selecting again and resumes selection after it. A staged unit is
//! released once it no longer needs to be rerouted from here: when routed-work has
//! recorded it durably, or (routed-work in memory) when its source completes.

use async_trait::async_trait;

use crate::backend::StageCapabilities;
use crate::error::RouterQueueError;
use crate::ids::{ReadyCursor, ReadySeq, UnitId};
use crate::pending::ReadyUnit;

/// A unit recorded as selected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StagedUnit {
    pub id: UnitId,
    pub seq: ReadySeq,
}

impl From<&ReadyUnit> for StagedUnit {
    /// A ready unit as the router queue records it once selected.
    fn from(u: &ReadyUnit) -> Self {
        Self {
            id: u.unit.id,
            seq: u.seq,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouterQueueStats {
    pub staged: u64,
    pub cursor: ReadyCursor,
}

/// One router-queue transition: a selected batch staged with the cursor it advances
/// to, then staged units released.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouterQueueWrite {
    /// Units selected; staging a unit that is already staged keeps its first entry.
    pub stage: Vec<StagedUnit>,
    /// Where selection resumes, per lane; no lane's cursor moves backwards.
    pub cursor: Option<ReadyCursor>,
    /// Staged units to forget; unknown ids are ignored.
    pub release: Vec<UnitId>,
}

impl RouterQueueWrite {
    pub fn is_empty(&self) -> bool {
        self.stage.is_empty() && self.cursor.is_none() && self.release.is_empty()
    }
}

/// The router-queue stage contract: one write, and the reads restore and selection use.
#[async_trait]
pub trait RouterQueueStore: Send + Sync + 'static {
    fn capabilities(&self) -> StageCapabilities;

    /// Apply a write as one transition, durable (for a durable backend) when it returns.
    async fn apply(&self, write: RouterQueueWrite) -> Result<(), RouterQueueError>;

    /// Staged units with `seq > after`, in seq order, at most `limit` (restore walks
    /// them page by page); with several processes on one database (postgresql), those
    /// of the partitions this process works on.
    async fn staged_after(&self, after: ReadySeq, limit: usize) -> Result<Vec<StagedUnit>, RouterQueueError>;

    /// Where selection resumes: every ready unit at or below its lane's cursor was staged
    /// once. A store whose pending stage leaves staged and routed units out of selection
    /// (postgresql) keeps no cursor and answers the start (see [`Self::keeps_cursor`]).
    async fn cursor(&self) -> Result<ReadyCursor, RouterQueueError>;

    async fn stats(&self) -> Result<RouterQueueStats, RouterQueueError>;

    /// Whether [`Self::cursor`] is kept across writes (every backend but postgresql).
    fn keeps_cursor(&self) -> bool {
        true
    }
}
