//! File-backed router-queue stage (`<dir>/router-queue.redb`).
//!
//! Same semantics as [`MemoryRouterQueueStore`](crate::memory::MemoryRouterQueueStore).
//! A write stages the batch (by seq and by id) and the advanced cursor in one
//! transaction, durable through its journal frame before it returns (see
//! [`super::engine::journaled`]), so after SIGKILL the batch is restored without
//! selecting again and selection resumes after it.
//!
//! | table | key | value |
//! |---|---|---|
//! | `staged` | ready seq | staged unit envelope (unit id) |
//! | `staged_ids` | unit id | ready seq |
//! | `meta` | name | `layout`, `cursor`, `journal_lsn` |

use std::sync::Arc;

use async_trait::async_trait;
use redb::{ReadableTable, ReadableTableMetadata, TableDefinition, WriteTransaction};
use serde::{Deserialize, Serialize};

use super::engine::db::{Fail, FileOptions, META, check_layout, get_counter};
use super::engine::dir::{DataDir, ROUTER_QUEUE_FILE};
use super::engine::journal::Stage;
use super::engine::journaled::{JournaledFile, JournaledStore, StageFile, Wait};
use super::records::StagedRecord;
use crate::backend::{Backend, StageCapabilities};
use crate::envelope::{self, RecordKind};
use crate::error::{BackendFailure, RouterQueueError};
use crate::ids::{ReadyCursor, ReadySeq, UnitId};
use crate::router_queue::{RouterQueueStats, RouterQueueStore, RouterQueueWrite, StagedUnit};

const STAGED: TableDefinition<u64, &[u8]> = TableDefinition::new("staged");
const STAGED_IDS: TableDefinition<&[u8; 16], u64> = TableDefinition::new("staged_ids");
/// The table layout this build reads and writes: commits durable through the journal
/// (`meta.journal_lsn`). A file of any other layout does not open.
const LAYOUT: u64 = 2;
/// Lane 0's selection cursor; lane N's is `cursor.N`.
const CURSOR: &str = "cursor";

/// The meta key of a lane's cursor.
fn cursor_key(lane: u8) -> String {
    if lane == 0 {
        CURSOR.to_owned()
    } else {
        format!("{CURSOR}.{lane}")
    }
}

/// The stage's store file in the journaled engine.
const FILE: StageFile = StageFile {
    name: ROUTER_QUEUE_FILE,
    stage: Stage::RouterQueue,
    init,
    replay,
};

/// The file-backed router-queue store.
#[derive(Clone)]
pub struct FileRouterQueueStore {
    store: JournaledStore,
}

/// What one router-queue commit changed, as journaled: units staged, the cursor (lane 0's
/// in `cursor`, 0: not moved; the other lanes' in `lanes`, minor version 1), ids
/// released. A struct, not an enum: envelopes flatten their value.
#[derive(Default, Serialize, Deserialize)]
struct RouterQueueFrame {
    #[serde(default)]
    stage: Vec<(UnitId, u64)>,
    #[serde(default)]
    cursor: u64,
    #[serde(default)]
    release: Vec<UnitId>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    lanes: Vec<u64>,
}

impl RouterQueueFrame {
    fn cursor(&self) -> ReadyCursor {
        let mut c = ReadyCursor::from(ReadySeq(self.cursor));
        for &seq in &self.lanes {
            c.advance(ReadySeq(seq));
        }
        c
    }
}

impl FileRouterQueueStore {
    /// Open (or create) `<dir>/router-queue.redb` with [`FileOptions::stage`]. Blocking.
    pub fn open(dir: &Arc<DataDir>) -> Result<Self, BackendFailure> {
        Self::open_with(dir, FileOptions::stage())
    }

    pub fn open_with(dir: &Arc<DataDir>, options: FileOptions) -> Result<Self, BackendFailure> {
        Ok(Self {
            store: JournaledStore::open(dir, &FILE, options)?,
        })
    }

    /// The store file (for logs and `sendium inspect`).
    pub fn path(&self) -> &std::path::Path {
        self.store.path()
    }
}

fn init(txn: &WriteTransaction) -> Result<(), Fail> {
    check_layout(txn, LAYOUT)?;
    let staged = txn.open_table(STAGED)?;
    txn.open_table(STAGED_IDS)?;
    for entry in [staged.first()?, staged.last()?].into_iter().flatten() {
        decode(entry.0.value(), entry.1.value())?;
    }
    Ok(())
}

fn decode(seq: u64, bytes: &[u8]) -> Result<StagedRecord, Fail> {
    envelope::decode(RecordKind::StagedUnit, bytes).map_err(|e| Fail::record("staged", seq, e))
}

fn encode_frame(frame: &RouterQueueFrame) -> Result<Vec<u8>, Fail> {
    envelope::encode(RecordKind::RouterQueueJournalFrame, frame)
        .map_err(|e| Fail::record("journal", "router-queue frame", e))
}

/// Redo one journaled commit.
fn replay(txn: &WriteTransaction, payload: &[u8], lsn: u64) -> Result<(), Fail> {
    let frame: RouterQueueFrame = envelope::decode(RecordKind::RouterQueueJournalFrame, payload)
        .map_err(|e| Fail::record("journal", format!("frame {lsn}"), e))?;
    let cursor = frame.cursor();
    let units: Vec<StagedUnit> = frame
        .stage
        .into_iter()
        .map(|(id, seq)| StagedUnit { id, seq: ReadySeq(seq) })
        .collect();
    stage_in(txn, &units, &cursor)?;
    release_in(txn, &frame.release)?;
    Ok(())
}

/// Stage `units` and advance the cursor. Returns whether anything changed.
fn stage_in(txn: &WriteTransaction, units: &[StagedUnit], cursor: &ReadyCursor) -> Result<bool, Fail> {
    let mut staged = txn.open_table(STAGED)?;
    let mut ids = txn.open_table(STAGED_IDS)?;
    let mut meta = txn.open_table(META)?;
    let mut changed = false;
    for u in units {
        // Staging a unit again keeps its one entry.
        if ids.get(&u.id.to_bytes())?.is_some() {
            continue;
        }
        ids.insert(&u.id.to_bytes(), u.seq.0)?;
        let bytes = envelope::encode(RecordKind::StagedUnit, &StagedRecord { id: u.id })
            .map_err(|e| Fail::record("staged", u.seq.0, e))?;
        staged.insert(u.seq.0, bytes.as_slice())?;
        changed = true;
    }
    // No lane's cursor moves backwards.
    for seq in cursor.positions() {
        let key = cursor_key(seq.lane());
        if seq.0 > get_counter(&meta, key.as_str())? {
            meta.insert(key.as_str(), seq.0)?;
            changed = true;
        }
    }
    Ok(changed)
}

/// Forget staged units. Returns whether anything changed.
fn release_in(txn: &WriteTransaction, release: &[UnitId]) -> Result<bool, Fail> {
    let mut staged = txn.open_table(STAGED)?;
    let mut ids = txn.open_table(STAGED_IDS)?;
    let mut changed = false;
    for id in release {
        let Some(seq) = ids.remove(&id.to_bytes())?.map(|g| g.value()) else {
            continue;
        };
        staged.remove(seq)?;
        changed = true;
    }
    Ok(changed)
}

/// One write. A release alone does not wait for its frame: see
/// [`FileRouterQueueStore::apply`].
fn apply_write(file: &JournaledFile, write: RouterQueueWrite) -> Result<(), BackendFailure> {
    let wait = if write.stage.is_empty() && write.cursor.is_none() {
        Wait::Buffered
    } else {
        Wait::Synced
    };
    file.write(wait, |txn| {
        let cursor = write.cursor.unwrap_or_default();
        let mut changed = stage_in(txn, &write.stage, &cursor)?;
        changed |= release_in(txn, &write.release)?;
        if !changed {
            return Ok(None);
        }
        let frame = RouterQueueFrame {
            stage: write.stage.iter().map(|u| (u.id, u.seq.0)).collect(),
            cursor: cursor.lane(0).0,
            release: write.release,
            lanes: cursor.positions().filter(|s| s.lane() > 0).map(|s| s.0).collect(),
        };
        encode_frame(&frame).map(Some)
    })
}

fn read_staged_after(file: &JournaledFile, after: ReadySeq, limit: usize) -> Result<Vec<StagedUnit>, BackendFailure> {
    file.read(|txn| {
        let staged = txn.open_table(STAGED)?;
        let mut out = Vec::with_capacity(limit.min(1024));
        for item in staged.range(after.0.saturating_add(1)..)?.take(limit) {
            let (k, v) = item?;
            let seq = k.value();
            out.push(StagedUnit {
                id: decode(seq, v.value())?.id,
                seq: ReadySeq(seq),
            });
        }
        Ok(out)
    })
}

fn read_stats(file: &JournaledFile) -> Result<RouterQueueStats, BackendFailure> {
    file.read(|txn| {
        let meta = txn.open_table(META)?;
        let mut cursor = ReadyCursor::START;
        for lane in 0..ReadySeq::LANES as u8 {
            cursor.advance(ReadySeq(get_counter(&meta, cursor_key(lane).as_str())?));
        }
        Ok(RouterQueueStats {
            staged: txn.open_table(STAGED_IDS)?.len()?,
            cursor,
        })
    })
}

#[async_trait]
impl RouterQueueStore for FileRouterQueueStore {
    fn capabilities(&self) -> StageCapabilities {
        StageCapabilities::durable(Backend::File)
    }

    /// One transaction, durable through its journal frame when it stages: the batch and
    /// the cursor together, or neither. A release alone does not wait for its frame to
    /// be synced: releasing is cleanup whose loss is harmless. If the process dies before
    /// the frame is flushed (with the next commit of any stage) or checkpointed, the unit
    /// is simply still staged after the restart, and restore repairs that by stable id: a
    /// unit whose source completed is skipped (the pending store no longer has it), and
    /// one a durable routed-work stage already holds is dropped by the Router.
    async fn apply(&self, write: RouterQueueWrite) -> Result<(), RouterQueueError> {
        if write.is_empty() {
            return Ok(());
        }
        self.store.run(move |f| apply_write(f, write)).await
    }

    async fn staged_after(&self, after: ReadySeq, limit: usize) -> Result<Vec<StagedUnit>, RouterQueueError> {
        self.store.run(move |f| read_staged_after(f, after, limit)).await
    }

    async fn cursor(&self) -> Result<ReadyCursor, RouterQueueError> {
        Ok(self.stats().await?.cursor)
    }

    async fn stats(&self) -> Result<RouterQueueStats, RouterQueueError> {
        self.store.run(read_stats).await
    }
}
