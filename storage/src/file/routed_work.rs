//! File-backed routed-work stage (`<dir>/routed-work.redb`).
//!
//! Same semantics as [`MemoryRoutedWorkStore`](crate::memory::MemoryRoutedWorkStore).
//! The units live in memory; a write records every branch of each unit it records, its
//! failovers and its branch outcomes in one journal frame, durable before it returns, and
//! checkpoints write the units changed since the last one to the file (see
//! [`super::engine::journaled`]). After SIGKILL recorded destinations go back to their
//! workers and completed branches are not sent again.
//!
//! | table | key | value |
//! |---|---|---|
//! | `units` | unit id (UUIDv7 bytes: id order) | [`RoutedUnit`] envelope |
//! | `meta` | name | `layout`, `open_branches`, `journal_lsn` |

use std::sync::Arc;

use async_trait::async_trait;
use redb::{ReadableTable, TableDefinition, WriteTransaction};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use super::engine::db::{Fail, FileOptions, META, check_layout};
use super::engine::dir::{DataDir, ROUTED_WORK_FILE};
use super::engine::journal::Stage;
use super::engine::journaled::{ChangedKeys, JournaledFile, JournaledStore, StageFile, StageState, Wait};
use crate::backend::{Backend, StageCapabilities};
use crate::envelope::{self, RecordKind};
use crate::error::{BackendFailure, RoutedWorkError};
use crate::ids::UnitId;
use crate::memory::routed_work::{Applied, RoutedWorkState, open_count};
use crate::routed_work::{BranchDone, BranchMove, RoutedUnit, RoutedWorkStats, RoutedWorkStore, RoutedWrite};

const UNITS: TableDefinition<&[u8; 16], &[u8]> = TableDefinition::new("units");
/// The table layout this build reads and writes: commits durable through the journal
/// (`meta.journal_lsn`). A file of any other layout does not open.
const LAYOUT: u64 = 2;
const OPEN_BRANCHES: &str = "open_branches";

/// The stage's store file in the journaled engine.
const FILE: StageFile = StageFile {
    name: ROUTED_WORK_FILE,
    stage: Stage::RoutedWork,
    init,
};

/// The file-backed routed-work store.
#[derive(Clone)]
pub struct FileRoutedWorkStore {
    store: JournaledStore<RoutedWorkFile>,
}

/// What one routed-work write changed, as journaled: the recorded units' envelopes, the
/// failovers, the completions and the removals that took effect, applied in that order.
#[derive(Serialize, Deserialize)]
struct RoutedWorkFrame {
    record: Vec<ByteBuf>,
    #[serde(default)]
    moves: Vec<BranchMove>,
    complete: Vec<BranchDone>,
    remove: Vec<UnitId>,
}

impl FileRoutedWorkStore {
    /// Open (or create) `<dir>/routed-work.redb` with [`FileOptions::stage`]. Blocking.
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
    pub(crate) fn store(&self) -> &JournaledStore<RoutedWorkFile> {
        &self.store
    }

    /// The units the store file holds (not the state in memory).
    #[cfg(test)]
    pub(crate) fn units_in_file(&self) -> Vec<UnitId> {
        self.store
            .read_file(|txn| {
                let mut ids = Vec::new();
                for item in txn.open_table(UNITS)?.iter()? {
                    ids.push(UnitId::from_bytes(*item?.0.value()));
                }
                Ok(ids)
            })
            .unwrap_or_default()
    }
}

fn init(txn: &WriteTransaction) -> Result<(), Fail> {
    check_layout(txn, LAYOUT)?;
    let units = txn.open_table(UNITS)?;
    for entry in [units.first()?, units.last()?].into_iter().flatten() {
        decode(entry.1.value())?;
    }
    Ok(())
}

fn decode(bytes: &[u8]) -> Result<RoutedUnit, Fail> {
    envelope::decode(RecordKind::RoutedUnit, bytes).map_err(|e| Fail::message_record("units", e))
}

fn encode(unit: &RoutedUnit) -> Result<Vec<u8>, Fail> {
    envelope::encode(RecordKind::RoutedUnit, unit).map_err(|e| Fail::message_record("units", e))
}

/// The stage's state in memory (see [`super::engine::journaled`]): the units, and which
/// of them changed since the last checkpoint.
#[derive(Default)]
pub(crate) struct RoutedWorkFile {
    work: RoutedWorkState,
    /// Units recorded, changed or removed since the last checkpoint.
    changed: ChangedKeys<UnitId, ()>,
}

impl RoutedWorkFile {
    /// Apply `write` and mark what it changed; returns what took effect.
    fn apply(&mut self, write: RoutedWrite) -> Applied {
        let applied = self.work.apply(write, true);
        let touched = (applied.record.iter().copied())
            .chain(applied.moves.iter().map(|m| m.unit))
            .chain(applied.complete.iter().map(|d| d.unit))
            .chain(applied.remove.iter().copied());
        for id in touched {
            self.changed.mark(id, ());
        }
        applied
    }

    /// The frame recording `applied`. A unit recorded and removed by the same write is
    /// in neither list: replayed, the removal finds nothing to remove.
    fn frame(&self, applied: Applied) -> Result<Vec<u8>, Fail> {
        let record = applied
            .record
            .iter()
            .filter_map(|id| self.work.units.get(id))
            .map(|unit| encode(unit).map(ByteBuf::from))
            .collect::<Result<Vec<_>, Fail>>()?;
        let frame = RoutedWorkFrame {
            record,
            moves: applied.moves,
            complete: applied.complete,
            remove: applied.remove,
        };
        envelope::encode(RecordKind::RoutedWorkJournalFrame, &frame)
            .map_err(|e| Fail::record("journal", "routed-work frame", e))
    }
}

impl StageState for RoutedWorkFile {
    fn load(txn: &WriteTransaction) -> Result<Self, Fail> {
        let table = txn.open_table(UNITS)?;
        let mut state = Self::default();
        for item in table.iter()? {
            let (_, v) = item?;
            let unit = decode(v.value())?;
            state.work.open_branches += open_count(&unit);
            state.changed.loaded(unit.id);
            state.work.units.insert(unit.id, unit);
        }
        Ok(state)
    }

    fn replay(&mut self, payload: &[u8], lsn: u64) -> Result<(), Fail> {
        let at = || format!("frame {lsn}");
        let frame: RoutedWorkFrame = envelope::decode(RecordKind::RoutedWorkJournalFrame, payload)
            .map_err(|e| Fail::record("journal", at(), e))?;
        let record = frame
            .record
            .iter()
            .map(|bytes| envelope::decode(RecordKind::RoutedUnit, bytes).map_err(|e| Fail::record("journal", at(), e)))
            .collect::<Result<Vec<RoutedUnit>, Fail>>()?;
        self.apply(RoutedWrite {
            record,
            moves: frame.moves,
            complete: frame.complete,
            remove: frame.remove,
        });
        Ok(())
    }

    fn save(&self, txn: &WriteTransaction, whole: bool) -> Result<(), Fail> {
        if whole {
            txn.delete_table(UNITS)?;
        }
        let mut table = txn.open_table(UNITS)?;
        if whole {
            for unit in self.work.units.values() {
                table.insert(&unit.id.to_bytes(), encode(unit)?.as_slice())?;
            }
        } else {
            for (id, (), in_file) in self.changed.pending() {
                match self.work.units.get(id) {
                    Some(unit) => {
                        table.insert(&id.to_bytes(), encode(unit)?.as_slice())?;
                    }
                    None if in_file => {
                        table.remove(&id.to_bytes())?;
                    }
                    None => {}
                }
            }
        }
        txn.open_table(META)?.insert(OPEN_BRANCHES, self.work.open_branches)?;
        Ok(())
    }

    fn saved(&mut self) {
        let units = &self.work.units;
        self.changed.saved(|id| units.contains_key(id));
    }
}

/// One write; a removal alone does not wait for its frame (see
/// [`FileRoutedWorkStore::apply`]).
fn apply_write(file: &JournaledFile<RoutedWorkFile>, write: RoutedWrite) -> Result<(), BackendFailure> {
    let wait = if write.record.is_empty() && write.moves.is_empty() && write.complete.is_empty() {
        Wait::Buffered
    } else {
        Wait::Synced
    };
    file.write(wait, |state| {
        let applied = state.apply(write);
        if applied.is_empty() {
            return Ok(None);
        }
        state.frame(applied).map(Some)
    })
}

#[async_trait]
impl RoutedWorkStore for FileRoutedWorkStore {
    fn capabilities(&self) -> StageCapabilities {
        StageCapabilities::durable(Backend::File)
    }

    /// One transition, durable through its journal frame when it records routes,
    /// failovers or completions. A removal alone does not wait for its frame to be
    /// synced: removal follows source completion, so a removal lost to a crash leaves a
    /// unit whose pending source is gone. After the restart, reconciliation finds that
    /// its source no longer exists (`units()` skips it) and removes it again; no branch is
    /// redelivered because of it. The next flush of any stage's frames, or a checkpoint,
    /// persists the removal anyway.
    async fn apply(&self, write: RoutedWrite) -> Result<(), RoutedWorkError> {
        if write.is_empty() {
            return Ok(());
        }
        self.store.run(move |f| apply_write(f, write)).await
    }

    async fn load_after(&self, after: Option<UnitId>, limit: usize) -> Result<Vec<RoutedUnit>, RoutedWorkError> {
        self.store
            .run(move |f| f.read(|s| s.work.load_after(after, limit)))
            .await
    }

    async fn stats(&self) -> Result<RoutedWorkStats, RoutedWorkError> {
        self.store.run(|f| f.read(|s| s.work.stats())).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MessageId;
    use crate::envelope::tests::same_bytes_as_ciborium;
    use crate::routed_work::BranchOutcome;

    #[test]
    fn a_frame_is_the_bytes_ciborium_writes() {
        let unit = MessageId::generate();
        let frame = RoutedWorkFrame {
            record: vec![ByteBuf::from(vec![0xa1, 0x61, 0x76, 0x01]), ByteBuf::from(vec![])],
            moves: vec![BranchMove {
                unit,
                branch: 1,
                from: "up".into(),
            }],
            complete: vec![BranchDone {
                unit,
                branch: 0,
                outcome: BranchOutcome::Submitted {
                    destination: "up".into(),
                    provider_ids: vec!["0A1B".into()],
                },
            }],
            remove: vec![MessageId::generate()],
        };
        same_bytes_as_ciborium(RecordKind::RoutedWorkJournalFrame, &frame);
    }
}
