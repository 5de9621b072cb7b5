//! File-backed routed-work stage (`<dir>/routed-work.redb`).
//!
//! Same semantics as [`MemoryRoutedWorkStore`](crate::memory::MemoryRoutedWorkStore).
//! A write stores every branch of each unit it records, its failovers and its branch
//! outcomes in one transaction, durable through its journal frame before it returns (see
//! [`super::engine::journaled`]), so after SIGKILL recorded destinations go back to
//! their workers and completed branches are not sent again.
//!
//! | table | key | value |
//! |---|---|---|
//! | `units` | unit id (UUIDv7 bytes: id order) | [`RoutedUnit`] envelope |
//! | `meta` | name | `layout`, `open_branches`, `journal_lsn` |

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use redb::{ReadableTable, ReadableTableMetadata, TableDefinition, WriteTransaction};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use super::engine::db::{Fail, FileOptions, META, check_layout, get_counter};
use super::engine::dir::{DataDir, ROUTED_WORK_FILE};
use super::engine::journal::Stage;
use super::engine::journaled::{JournaledFile, JournaledStore, StageFile, Wait};
use crate::backend::{Backend, StageCapabilities};
use crate::envelope::{self, RecordKind};
use crate::error::{BackendFailure, RoutedWorkError};
use crate::ids::{MessageId, UnitId};
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
    replay,
};

/// The file-backed routed-work store.
#[derive(Clone)]
pub struct FileRoutedWorkStore {
    store: JournaledStore,
}

/// What one routed-work commit changed, as journaled: the recorded units' envelopes
/// exactly as stored, the failovers, the completions and the removals, applied in that
/// order.
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
}

fn init(txn: &WriteTransaction) -> Result<(), Fail> {
    check_layout(txn, LAYOUT)?;
    let units = txn.open_table(UNITS)?;
    for entry in [units.first()?, units.last()?].into_iter().flatten() {
        decode(MessageId::from_bytes(*entry.0.value()), entry.1.value())?;
    }
    Ok(())
}

fn decode(id: UnitId, bytes: &[u8]) -> Result<RoutedUnit, Fail> {
    envelope::decode(RecordKind::RoutedUnit, bytes).map_err(|e| Fail::record("units", id, e))
}

fn encode(unit: &RoutedUnit) -> Result<Vec<u8>, Fail> {
    envelope::encode(RecordKind::RoutedUnit, unit).map_err(|e| Fail::record("units", unit.id, e))
}

fn open_count(unit: &RoutedUnit) -> u64 {
    unit.branches.iter().filter(|b| b.outcome.is_none()).count() as u64
}

type UnitsTable<'t> = redb::Table<'t, &'static [u8; 16], &'static [u8]>;

/// Returns the envelopes of the units it recorded.
fn record_in(table: &mut UnitsTable<'_>, open: &mut u64, units: Vec<RoutedUnit>) -> Result<Vec<ByteBuf>, Fail> {
    let mut recorded = Vec::with_capacity(units.len());
    for unit in units {
        // Routing decisions are not redone: the first record stays.
        if table.get(&unit.id.to_bytes())?.is_some() {
            continue;
        }
        let bytes = encode(&unit)?;
        table.insert(&unit.id.to_bytes(), bytes.as_slice())?;
        *open += open_count(&unit);
        recorded.push(ByteBuf::from(bytes));
    }
    Ok(recorded)
}

fn moves_in(table: &mut UnitsTable<'_>, moves: &[BranchMove]) -> Result<bool, Fail> {
    let mut changed = false;
    for m in moves {
        let Some(mut unit) = (match table.get(&m.unit.to_bytes())? {
            Some(v) => Some(decode(m.unit, v.value())?),
            None => None,
        }) else {
            continue;
        };
        if unit
            .branches
            .iter_mut()
            .find(|b| b.no == m.branch)
            .is_some_and(|b| b.moved_from(&m.from))
        {
            table.insert(&m.unit.to_bytes(), encode(&unit)?.as_slice())?;
            changed = true;
        }
    }
    Ok(changed)
}

fn complete_in(table: &mut UnitsTable<'_>, open: &mut u64, done: &[BranchDone]) -> Result<bool, Fail> {
    // Each touched unit is decoded and re-encoded once, however many of its branches
    // complete in this batch.
    let mut touched: BTreeMap<UnitId, Option<RoutedUnit>> = BTreeMap::new();
    let mut closed = 0u64;
    for d in done {
        if let std::collections::btree_map::Entry::Vacant(slot) = touched.entry(d.unit) {
            let unit = match table.get(&d.unit.to_bytes())? {
                Some(v) => Some(decode(d.unit, v.value())?),
                None => None,
            };
            slot.insert(unit);
        }
        let Some(Some(unit)) = touched.get_mut(&d.unit) else {
            continue;
        };
        if let Some(branch) = unit.branches.iter_mut().find(|b| b.no == d.branch)
            && branch.outcome.is_none()
        {
            branch.outcome = Some(d.outcome.clone());
            closed += 1;
        }
    }
    if closed == 0 {
        return Ok(false);
    }
    for unit in touched.into_values().flatten() {
        table.insert(&unit.id.to_bytes(), encode(&unit)?.as_slice())?;
    }
    *open = open.saturating_sub(closed);
    Ok(true)
}

/// The part of a stored [`RoutedUnit`] a removal needs: which branches are still open.
/// Decoding only this skips building the unit's strings and lists (the envelope's
/// version and checksum are still checked); serde ignores the other fields.
#[derive(serde::Deserialize)]
struct OpenBranches {
    branches: Vec<BranchState>,
}

#[derive(serde::Deserialize)]
struct BranchState {
    outcome: Option<serde::de::IgnoredAny>,
}

fn remove_in(table: &mut UnitsTable<'_>, open: &mut u64, ids: &[UnitId]) -> Result<bool, Fail> {
    let mut changed = false;
    for &id in ids {
        let Some(removed) = table.remove(&id.to_bytes())? else {
            continue;
        };
        let unit: OpenBranches =
            envelope::decode(RecordKind::RoutedUnit, removed.value()).map_err(|e| Fail::record("units", id, e))?;
        let still_open = unit.branches.iter().filter(|b| b.outcome.is_none()).count() as u64;
        *open = open.saturating_sub(still_open);
        changed = true;
    }
    Ok(changed)
}

/// Apply records, failovers, completions and removals in one write transaction.
/// Returns the envelopes recorded, and whether anything changed.
fn apply_in(txn: &WriteTransaction, record: Vec<RoutedUnit>, rest: &Changes) -> Result<(Vec<ByteBuf>, bool), Fail> {
    let mut table = txn.open_table(UNITS)?;
    let mut meta = txn.open_table(META)?;
    let mut open = get_counter(&meta, OPEN_BRANCHES)?;
    let recorded = record_in(&mut table, &mut open, record)?;
    let mut changed = !recorded.is_empty();
    changed |= moves_in(&mut table, &rest.moves)?;
    let (complete, remove) = (&rest.complete, &rest.remove);
    changed |= complete_in(&mut table, &mut open, complete)?;
    changed |= remove_in(&mut table, &mut open, remove)?;
    if changed {
        meta.insert(OPEN_BRANCHES, open)?;
    }
    Ok((recorded, changed))
}

/// Redo one journaled commit.
fn replay(txn: &WriteTransaction, payload: &[u8], lsn: u64) -> Result<(), Fail> {
    let at = || format!("frame {lsn}");
    let frame: RoutedWorkFrame =
        envelope::decode(RecordKind::RoutedWorkJournalFrame, payload).map_err(|e| Fail::record("journal", at(), e))?;
    let record = frame
        .record
        .iter()
        .map(|bytes| envelope::decode(RecordKind::RoutedUnit, bytes).map_err(|e| Fail::record("journal", at(), e)))
        .collect::<Result<Vec<RoutedUnit>, Fail>>()?;
    let rest = Changes {
        moves: frame.moves,
        complete: frame.complete,
        remove: frame.remove,
    };
    apply_in(txn, record, &rest)?;
    Ok(())
}

/// The changes of a write besides its records.
#[derive(Default)]
struct Changes {
    moves: Vec<BranchMove>,
    complete: Vec<BranchDone>,
    remove: Vec<UnitId>,
}

/// Records, failovers, completions and removals in one write transaction, durable
/// through its journal frame when it records routes, failovers or completions. A
/// removal alone does not wait for its frame (its loss in a crash is repaired by the
/// Router's restore, which drops units whose sources are gone).
fn apply_write(file: &JournaledFile, record: Vec<RoutedUnit>, rest: Changes) -> Result<(), BackendFailure> {
    let wait = if record.is_empty() && rest.moves.is_empty() && rest.complete.is_empty() {
        Wait::Buffered
    } else {
        Wait::Synced
    };
    file.write(wait, |txn| {
        let (recorded, changed) = apply_in(txn, record, &rest)?;
        if !changed {
            return Ok(None);
        }
        let frame = RoutedWorkFrame {
            record: recorded,
            moves: rest.moves,
            complete: rest.complete,
            remove: rest.remove,
        };
        envelope::encode(RecordKind::RoutedWorkJournalFrame, &frame)
            .map(Some)
            .map_err(|e| Fail::record("journal", "routed-work frame", e))
    })
}

fn read_after(file: &JournaledFile, after: Option<UnitId>, limit: usize) -> Result<Vec<RoutedUnit>, BackendFailure> {
    file.read(|txn| {
        let table = txn.open_table(UNITS)?;
        let mut out = Vec::with_capacity(limit.min(1024));
        let range = match after {
            Some(id) => {
                table.range::<&[u8; 16]>((std::ops::Bound::Excluded(&id.to_bytes()), std::ops::Bound::Unbounded))?
            }
            None => table.range::<&[u8; 16]>(..)?,
        };
        for item in range.take(limit) {
            let (k, v) = item?;
            out.push(decode(MessageId::from_bytes(*k.value()), v.value())?);
        }
        Ok(out)
    })
}

fn read_stats(file: &JournaledFile) -> Result<RoutedWorkStats, BackendFailure> {
    file.read(|txn| {
        let meta = txn.open_table(META)?;
        Ok(RoutedWorkStats {
            units: txn.open_table(UNITS)?.len()?,
            open_branches: get_counter(&meta, OPEN_BRANCHES)?,
        })
    })
}

#[async_trait]
impl RoutedWorkStore for FileRoutedWorkStore {
    fn capabilities(&self) -> StageCapabilities {
        StageCapabilities::durable(Backend::File)
    }

    /// One transaction, durable through its journal frame when it records routes,
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
        let rest = Changes {
            moves: write.moves,
            complete: write.complete,
            remove: write.remove,
        };
        self.store.run(move |f| apply_write(f, write.record, rest)).await
    }

    async fn load_after(&self, after: Option<UnitId>, limit: usize) -> Result<Vec<RoutedUnit>, RoutedWorkError> {
        self.store.run(move |f| read_after(f, after, limit)).await
    }

    async fn stats(&self) -> Result<RoutedWorkStats, RoutedWorkError> {
        self.store.run(read_stats).await
    }
}
