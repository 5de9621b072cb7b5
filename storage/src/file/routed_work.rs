//! File-backed routed-work stage (`<dir>/routed-work.redb`).
//!
//! Same semantics as [`MemoryRoutedWorkStore`](crate::memory::MemoryRoutedWorkStore).
//! `record` stores every branch of each unit in one durable transaction per call, and
//! `complete` stores branch outcomes durably, so after SIGKILL recorded destinations go
//! back to their workers and completed branches are not sent again.
//!
//! | table | key | value |
//! |---|---|---|
//! | `units` | unit id (UUIDv7 bytes: id order) | [`RoutedUnit`] envelope |
//! | `meta` | name | `layout`, `open_branches` |

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use redb::{Durability, ReadableTable, ReadableTableMetadata, TableDefinition, WriteTransaction};

use super::db::{Fail, FileOptions, META, StoreFile, blocking, check_layout, get_counter};
use super::dir::{DataDir, ROUTED_WORK_FILE};
use crate::backend::StageBackend;
use crate::envelope::{self, RecordKind};
use crate::error::{BackendFailure, RoutedWorkError};
use crate::ids::{MessageId, UnitId};
use crate::routed_work::{BranchDone, RoutedUnit, RoutedWorkStats, RoutedWorkStore, RoutedWrite};

const UNITS: TableDefinition<&[u8; 16], &[u8]> = TableDefinition::new("units");
const LAYOUT: u64 = 1;
const OPEN_BRANCHES: &str = "open_branches";

/// The file-backed routed-work store.
#[derive(Clone)]
pub struct FileRoutedWorkStore {
    inner: Arc<Inner>,
}

struct Inner {
    file: StoreFile,
}

impl FileRoutedWorkStore {
    /// Open (or create) `<dir>/routed-work.redb` with [`FileOptions::stage`]. Blocking.
    pub fn open(dir: &Arc<DataDir>) -> Result<Self, BackendFailure> {
        Self::open_with(dir, FileOptions::stage())
    }

    pub fn open_with(dir: &Arc<DataDir>, options: FileOptions) -> Result<Self, BackendFailure> {
        let file = StoreFile::open(dir, ROUTED_WORK_FILE, options, init)?;
        Ok(Self {
            inner: Arc::new(Inner { file }),
        })
    }

    pub fn path(&self) -> &std::path::Path {
        self.inner.file.path()
    }

    async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<R, BackendFailure> + Send + 'static,
    ) -> Result<R, RoutedWorkError> {
        Ok(blocking(&self.inner, |i| &i.file, f).await?)
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

fn record_in(table: &mut UnitsTable<'_>, open: &mut u64, units: Vec<RoutedUnit>) -> Result<bool, Fail> {
    let mut changed = false;
    for unit in units {
        // Routing decisions are not redone: the first record stays.
        if table.get(&unit.id.to_bytes())?.is_some() {
            continue;
        }
        table.insert(&unit.id.to_bytes(), encode(&unit)?.as_slice())?;
        *open += open_count(&unit);
        changed = true;
    }
    Ok(changed)
}

fn complete_in(table: &mut UnitsTable<'_>, open: &mut u64, done: Vec<BranchDone>) -> Result<bool, Fail> {
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
            branch.outcome = Some(d.outcome);
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

fn remove_in(table: &mut UnitsTable<'_>, open: &mut u64, ids: Vec<UnitId>) -> Result<bool, Fail> {
    let mut changed = false;
    for id in ids {
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

impl Inner {
    /// Records, completions and removals in one write transaction. Durable when it
    /// records routes or completions; a removal alone commits without fsync (its loss
    /// in a crash is repaired by the Router's restore, which drops units whose sources
    /// are gone).
    fn apply(
        &self,
        record: Vec<RoutedUnit>,
        complete: Vec<BranchDone>,
        remove: Vec<UnitId>,
    ) -> Result<(), BackendFailure> {
        let durability = if record.is_empty() && complete.is_empty() {
            Durability::None
        } else {
            Durability::Immediate
        };
        self.file.write(durability, |txn| {
            let mut table = txn.open_table(UNITS)?;
            let mut meta = txn.open_table(META)?;
            let mut open = get_counter(&meta, OPEN_BRANCHES)?;
            let mut changed = record_in(&mut table, &mut open, record)?;
            changed |= complete_in(&mut table, &mut open, complete)?;
            changed |= remove_in(&mut table, &mut open, remove)?;
            if changed {
                meta.insert(OPEN_BRANCHES, open)?;
            }
            Ok(((), changed))
        })
    }

    fn record(&self, units: Vec<RoutedUnit>) -> Result<(), BackendFailure> {
        self.apply(units, Vec::new(), Vec::new())
    }

    fn complete(&self, done: Vec<BranchDone>) -> Result<(), BackendFailure> {
        self.apply(Vec::new(), done, Vec::new())
    }

    fn remove(&self, ids: Vec<UnitId>) -> Result<(), BackendFailure> {
        self.apply(Vec::new(), Vec::new(), ids)
    }

    fn load_after(&self, after: Option<UnitId>, limit: usize) -> Result<Vec<RoutedUnit>, BackendFailure> {
        self.file.read(|txn| {
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

    fn stats(&self) -> Result<RoutedWorkStats, BackendFailure> {
        self.file.read(|txn| {
            let meta = txn.open_table(META)?;
            Ok(RoutedWorkStats {
                units: txn.open_table(UNITS)?.len()?,
                open_branches: get_counter(&meta, OPEN_BRANCHES)?,
            })
        })
    }
}

#[async_trait]
impl RoutedWorkStore for FileRoutedWorkStore {
    fn backend(&self) -> StageBackend {
        StageBackend::File
    }

    /// One durable transaction for the whole batch.
    async fn record(&self, units: Vec<RoutedUnit>) -> Result<(), RoutedWorkError> {
        if units.is_empty() {
            return Ok(());
        }
        self.run(move |i| i.record(units)).await
    }

    /// One durable transaction: a branch recorded complete is never sent again.
    async fn complete(&self, done: Vec<BranchDone>) -> Result<(), RoutedWorkError> {
        if done.is_empty() {
            return Ok(());
        }
        self.run(move |i| i.complete(done)).await
    }

    /// Committed with `Durability::None` (no fsync): removal follows source completion,
    /// so a removal lost to a crash leaves a unit whose pending source is gone. After the
    /// restart, reconciliation finds that its source no longer exists (`units()` skips
    /// it) and removes it again; no branch is redelivered because of it. A later durable
    /// commit or a clean close persists the removal anyway.
    async fn remove(&self, ids: &[UnitId]) -> Result<(), RoutedWorkError> {
        if ids.is_empty() {
            return Ok(());
        }
        let ids = ids.to_vec();
        self.run(move |i| i.remove(ids)).await
    }

    async fn apply(&self, write: RoutedWrite) -> Result<(), RoutedWorkError> {
        if write.is_empty() {
            return Ok(());
        }
        self.run(move |i| i.apply(write.record, write.complete, write.remove))
            .await
    }

    async fn load_after(&self, after: Option<UnitId>, limit: usize) -> Result<Vec<RoutedUnit>, RoutedWorkError> {
        self.run(move |i| i.load_after(after, limit)).await
    }

    async fn stats(&self) -> Result<RoutedWorkStats, RoutedWorkError> {
        self.run(|i| i.stats()).await
    }
}
