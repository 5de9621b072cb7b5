//! File-backed router-queue stage (`<dir>/router-queue.redb`).
//!
//! Same semantics as [`MemoryRouterQueueStore`](crate::memory::MemoryRouterQueueStore).
//! The staged units and the cursor live in memory; a write stages the batch and advances
//! the cursor in one journal frame, durable before it returns, and checkpoints write what
//! changed since the last one to the file (see [`super::engine::journaled`]). After
//! SIGKILL the batch is restored without selecting again and selection resumes after it.
//!
//! | table | key | value |
//! |---|---|---|
//! | `staged` | ready seq | staged unit envelope (unit id) |
//! | `staged_ids` | unit id | ready seq |
//! | `meta` | name | `layout`, `cursor`, `journal_lsn` |

use std::sync::Arc;

use async_trait::async_trait;
use redb::{ReadableTable, TableDefinition, WriteTransaction};
use serde::{Deserialize, Serialize};

use super::engine::db::{Fail, FileOptions, META, check_layout, get_counter};
use super::engine::dir::{DataDir, ROUTER_QUEUE_FILE};
use super::engine::journal::Stage;
use super::engine::journaled::{ChangedKeys, JournaledFile, JournaledStore, StageFile, StageState, Wait};
use super::records::StagedRecord;
use crate::backend::{Backend, StageCapabilities};
use crate::envelope::{self, RecordKind};
use crate::error::{BackendFailure, RouterQueueError};
use crate::ids::{ReadyCursor, ReadySeq, UnitId};
use crate::memory::router_queue::RouterQueueState;
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
};

/// The file-backed router-queue store.
#[derive(Clone)]
pub struct FileRouterQueueStore {
    store: JournaledStore<RouterQueueFile>,
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

    #[cfg(test)]
    pub(crate) fn store(&self) -> &JournaledStore<RouterQueueFile> {
        &self.store
    }

    /// The staged seqs the store file holds, both tables agreeing (not the state in
    /// memory).
    #[cfg(test)]
    pub(crate) fn staged_in_file(&self) -> Vec<u64> {
        self.store
            .read_file(|txn| {
                let mut seqs = Vec::new();
                for item in txn.open_table(STAGED)?.iter()? {
                    seqs.push(item?.0.value());
                }
                let ids = redb::ReadableTableMetadata::len(&txn.open_table(STAGED_IDS)?)?;
                assert_eq!(ids, seqs.len() as u64, "staged and staged_ids agree");
                Ok(seqs)
            })
            .unwrap_or_default()
    }
}

fn init(txn: &WriteTransaction) -> Result<(), Fail> {
    check_layout(txn, LAYOUT)?;
    let staged = txn.open_table(STAGED)?;
    txn.open_table(STAGED_IDS)?;
    for entry in [staged.first()?, staged.last()?].into_iter().flatten() {
        decode(entry.1.value())?;
    }
    Ok(())
}

fn decode(bytes: &[u8]) -> Result<StagedRecord, Fail> {
    envelope::decode(RecordKind::StagedUnit, bytes).map_err(|e| Fail::message_record("staged", e))
}

/// The stage's state in memory (see [`super::engine::journaled`]): the staged units and
/// the cursor, and what changed since the last checkpoint.
#[derive(Default)]
pub(crate) struct RouterQueueFile {
    queue: RouterQueueState,
    /// Units staged or released since the last checkpoint, by seq.
    changed: ChangedKeys<ReadySeq, UnitId>,
    cursor_changed: bool,
}

impl RouterQueueFile {
    /// Apply `write`, mark what it changed, and return the frame that records it (`None`
    /// if it changed nothing).
    fn apply(&mut self, write: &RouterQueueWrite) -> Result<Option<Vec<u8>>, Fail> {
        let applied = self.queue.apply(write, true);
        if applied.is_empty() {
            return Ok(None);
        }
        for u in applied.stage.iter().chain(&applied.release) {
            self.changed.mark(u.seq, u.id);
        }
        self.cursor_changed |= applied.cursor_moved;
        let cursor = match (&write.cursor, applied.cursor_moved) {
            (Some(c), true) => *c,
            _ => ReadyCursor::START,
        };
        let frame = RouterQueueFrame {
            stage: applied.stage.iter().map(|u| (u.id, u.seq.0)).collect(),
            cursor: cursor.lane(0).0,
            release: applied.release.iter().map(|u| u.id).collect(),
            lanes: cursor.positions().filter(|s| s.lane() > 0).map(|s| s.0).collect(),
        };
        encode_frame(&frame).map(Some)
    }
}

impl StageState for RouterQueueFile {
    fn load(txn: &WriteTransaction) -> Result<Self, Fail> {
        let mut state = Self::default();
        for item in txn.open_table(STAGED)?.iter()? {
            let (k, v) = item?;
            let seq = ReadySeq(k.value());
            let id = decode(v.value())?.id;
            state.queue.by_seq.insert(seq, id);
            state.queue.by_id.insert(id, seq);
            state.changed.loaded(seq);
        }
        let meta = txn.open_table(META)?;
        for lane in 0..ReadySeq::LANES as u8 {
            state
                .queue
                .cursor
                .advance(ReadySeq(get_counter(&meta, cursor_key(lane).as_str())?));
        }
        Ok(state)
    }

    fn replay(&mut self, payload: &[u8], lsn: u64) -> Result<(), Fail> {
        let frame: RouterQueueFrame = envelope::decode(RecordKind::RouterQueueJournalFrame, payload)
            .map_err(|e| Fail::record("journal", format!("frame {lsn}"), e))?;
        let write = RouterQueueWrite {
            cursor: Some(frame.cursor()),
            stage: frame
                .stage
                .into_iter()
                .map(|(id, seq)| StagedUnit { id, seq: ReadySeq(seq) })
                .collect(),
            release: frame.release,
        };
        self.apply(&write)?;
        Ok(())
    }

    fn save(&self, txn: &WriteTransaction, whole: bool) -> Result<(), Fail> {
        if whole {
            txn.delete_table(STAGED)?;
            txn.delete_table(STAGED_IDS)?;
        }
        let mut staged = txn.open_table(STAGED)?;
        let mut ids = txn.open_table(STAGED_IDS)?;
        let put = |staged: &mut redb::Table<'_, u64, &[u8]>,
                   ids: &mut redb::Table<'_, &[u8; 16], u64>,
                   seq: ReadySeq,
                   id: UnitId|
         -> Result<(), Fail> {
            let bytes = envelope::encode(RecordKind::StagedUnit, &StagedRecord { id })
                .map_err(|e| Fail::message_record("staged", e))?;
            staged.insert(seq.0, bytes.as_slice())?;
            ids.insert(&id.to_bytes(), seq.0)?;
            Ok(())
        };
        if whole {
            for (&seq, &id) in &self.queue.by_seq {
                put(&mut staged, &mut ids, seq, id)?;
            }
        } else {
            for (&seq, &id, in_file) in self.changed.pending() {
                if self.queue.by_seq.get(&seq) == Some(&id) {
                    put(&mut staged, &mut ids, seq, id)?;
                } else if in_file {
                    staged.remove(seq.0)?;
                    ids.remove(&id.to_bytes())?;
                }
            }
        }
        if whole || self.cursor_changed {
            let mut meta = txn.open_table(META)?;
            for seq in self.queue.cursor.positions() {
                meta.insert(cursor_key(seq.lane()).as_str(), seq.0)?;
            }
        }
        Ok(())
    }

    fn saved(&mut self) {
        let staged = &self.queue.by_seq;
        self.changed.saved(|seq| staged.contains_key(seq));
        self.cursor_changed = false;
    }
}

fn encode_frame(frame: &RouterQueueFrame) -> Result<Vec<u8>, Fail> {
    envelope::encode(RecordKind::RouterQueueJournalFrame, frame)
        .map_err(|e| Fail::record("journal", "router-queue frame", e))
}

/// One write. A release alone does not wait for its frame: see
/// [`FileRouterQueueStore::apply`].
fn apply_write(file: &JournaledFile<RouterQueueFile>, write: RouterQueueWrite) -> Result<(), BackendFailure> {
    let wait = if write.stage.is_empty() && write.cursor.is_none() {
        Wait::Buffered
    } else {
        Wait::Synced
    };
    file.write(wait, |state| state.apply(&write))
}

#[async_trait]
impl RouterQueueStore for FileRouterQueueStore {
    fn capabilities(&self) -> StageCapabilities {
        StageCapabilities::durable(Backend::File)
    }

    /// One transition, durable through its journal frame when it stages: the batch and
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
        self.store
            .run(move |f| f.read(|s| s.queue.staged_after(after, limit)))
            .await
    }

    async fn cursor(&self) -> Result<ReadyCursor, RouterQueueError> {
        Ok(self.stats().await?.cursor)
    }

    async fn stats(&self) -> Result<RouterQueueStats, RouterQueueError> {
        self.store.run(|f| f.read(|s| s.queue.stats())).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::tests::same_bytes_as_ciborium;

    #[test]
    fn a_frame_is_the_bytes_ciborium_writes() {
        let unit = UnitId::generate();
        let mut frame = RouterQueueFrame {
            stage: vec![(unit, 7), (UnitId::generate(), u64::MAX)],
            cursor: 300,
            release: vec![unit],
            lanes: vec![],
        };
        same_bytes_as_ciborium(RecordKind::RouterQueueJournalFrame, &frame);
        frame.lanes = vec![1 << 60, 12];
        same_bytes_as_ciborium(RecordKind::RouterQueueJournalFrame, &frame);
        same_bytes_as_ciborium(RecordKind::RouterQueueJournalFrame, &RouterQueueFrame::default());
    }
}
