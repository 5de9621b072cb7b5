//! Units the pending stage holds in memory instead of its tables.
//!
//! Most messages are admitted, selected and completed within a second, between two
//! checkpoints of the stage's file. Their admission frame in the journal is what makes
//! them durable; writing their record, ready entry and unit index to redb as well, only
//! to remove all three a few milliseconds later, would be most of the stage's work. So a
//! single-record unit admitted by a journaled commit is *held*: its record stays in
//! memory, and every read of the stage (selection, restore, stats, admission's capacity)
//! merges the held units with the tables. A unit completed while held never reaches the
//! file.
//!
//! The rule that keeps this exactly as durable as storing them: **every durable commit of the
//! file writes the held units into its tables first.** A durable commit records the
//! journal LSN the file covers, and a restart replays only the frames after it; so a held
//! unit is either in the file's durable state or in a frame the restart replays. A
//! reopen of the file (after an I/O failure) replays the same frames into the tables, so
//! it drops what is held ([`Held::recovered`]). redb makes a handle's non-durable commits
//! durable when it closes, so a close first stores the held units too; when that step
//! fails, the handle closes without writing at all (the store file's close).
//!
//! A commit that changed only held units (its tables are [`Tracked`]) makes no redb
//! commit at all: its frame made it durable, and its counters — next seq, receipts
//! asked for, the journal LSN — stay here ([`Counters`]) until a commit that writes, or
//! the close, puts them in `meta` with the held units.
//!
//! Held units are bounded by [`HELD_UNITS`]: past it, admissions are written to the
//! tables as before, so a backlog costs memory only up to the bound.
//!
//! Readers see the held units and the tables at one point in time: a commit that changes
//! the held units commits redb and applies its changes to them under their lock, and a
//! reader opens its redb snapshot under the same lock. Selection's cursor relies on that:
//! it never sees a unit without every unit made ready before it. A durable commit copies
//! the held units (shared pointers) under the lock, writes them and commits without it,
//! and only then drops them from memory: until then a reader finds them held, after
//! that in the tables.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Mutex, MutexGuard};

use crate::ids::{IdMap, IdSet, MessageId, UnitId};
use crate::pending::{Disposition, Unit};
use crate::record::PendingRecord;

/// How many units the stage holds at most (see the module docs).
#[cfg(not(test))]
pub(super) const HELD_UNITS: usize = 2048;
/// Small in tests, so they mix held and stored units.
#[cfg(test)]
pub(super) const HELD_UNITS: usize = 8;

/// One held single-record unit.
pub(super) struct HeldUnit {
    pub(super) record: PendingRecord,
    /// The record's envelope, as its journal frame holds it (and `records` will).
    pub(super) bytes: Vec<u8>,
    /// Receipts its record asked for (0 or 1).
    pub(super) receipts: u64,
}

impl HeldUnit {
    /// The unit as selection hands it out.
    pub(super) fn unit(&self) -> Unit {
        Unit {
            id: self.record.id,
            disposition: Disposition::Deliver,
            parts: vec![self.record.clone()],
        }
    }
}

/// The held units, by ready seq and by unit id.
#[derive(Default)]
pub(super) struct HeldUnits {
    /// Shared, so a reader or a checkpoint copies them out of the lock.
    by_seq: BTreeMap<u64, Arc<HeldUnit>>,
    /// Unit id (its record's id, UUIDv7: key order is acceptance order) → ready seq.
    by_id: BTreeMap<[u8; 16], u64>,
    /// Set while commits that changed only held units have left `meta` behind.
    counters: Option<Counters>,
    /// Set while a durable commit stores the held units: from its commit until they are
    /// dropped from memory, a reader's snapshot may hold them in the tables too.
    storing: bool,
}

impl HeldUnits {
    pub(super) fn len(&self) -> usize {
        self.by_seq.len()
    }

    pub(super) fn seq_of(&self, id: UnitId) -> Option<u64> {
        self.by_id.get(&id.to_bytes()).copied()
    }

    pub(super) fn get(&self, seq: u64) -> Option<&Arc<HeldUnit>> {
        self.by_seq.get(&seq)
    }

    /// Held seqs in `range`, in order.
    pub(super) fn seqs(&self, range: std::ops::Range<u64>) -> impl Iterator<Item = u64> + '_ {
        self.by_seq.range(range).map(|(seq, _)| *seq)
    }

    /// The held record accepted first.
    pub(super) fn oldest(&self) -> Option<&PendingRecord> {
        let (_, seq) = self.by_id.first_key_value()?;
        self.by_seq.get(seq).map(|u| &u.record)
    }

    fn insert(&mut self, seq: u64, unit: HeldUnit) {
        self.by_id.insert(unit.record.id.to_bytes(), seq);
        self.by_seq.insert(seq, Arc::new(unit));
    }

    fn remove(&mut self, seq: u64) -> Option<Arc<HeldUnit>> {
        let unit = self.by_seq.remove(&seq)?;
        self.by_id.remove(&unit.record.id.to_bytes());
        Some(unit)
    }

    /// Every held unit, by seq.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &Arc<HeldUnit>)> + '_ {
        self.by_seq.iter().map(|(seq, unit)| (*seq, unit))
    }

    pub(super) fn clear(&mut self) {
        self.by_id.clear();
        self.by_seq.clear();
        self.counters = None;
        self.storing = false;
    }

    /// Whether a durable commit is storing the held units (see the field).
    pub(super) fn storing(&self) -> bool {
        self.storing
    }

    /// A durable commit starts (`true`) or failed to store the held units (`false`).
    pub(super) fn set_storing(&mut self, storing: bool) {
        self.storing = storing;
    }

    /// The counters newer than `meta`, if any.
    pub(super) fn counters(&self) -> Option<Counters> {
        self.counters
    }

    /// After a commit: `Some` when it left `meta` behind, `None` when it wrote them.
    pub(super) fn set_counters(&mut self, counters: Option<Counters>) {
        self.counters = counters;
    }
}

/// The stage's held units, shared by its writer and readers.
#[derive(Default)]
pub(super) struct Held {
    units: Mutex<HeldUnits>,
    /// Set by a (re)open of the file: its recovery replayed every held unit into the
    /// tables, so what is held is dropped by the next [`Held::settle`].
    stale: AtomicBool,
    /// Makes the step before a close fail (without an I/O error).
    #[cfg(test)]
    pub(super) fail_close: AtomicBool,
}

impl Held {
    /// The held units, settled (see [`Held::settle`]).
    pub(super) fn lock(&self) -> MutexGuard<'_, HeldUnits> {
        let mut units = self.units.lock();
        self.settle(&mut units);
        units
    }

    /// Drop what is held if the file was recovered since the last look.
    fn settle(&self, units: &mut HeldUnits) {
        if self.stale.swap(false, Ordering::AcqRel) {
            units.clear();
        }
    }

    /// The file was (re)opened and its journal frames replayed into the tables.
    pub(super) fn recovered(&self) {
        self.stale.store(true, Ordering::Release);
    }
}

/// What one write transaction changes in the held units: applied to them when it
/// commits, dropped when it fails.
#[derive(Default)]
pub(super) struct HeldChanges {
    added: BTreeMap<u64, HeldUnit>,
    added_ids: IdMap<MessageId, u64>,
    removed: IdSet<u64>,
}

impl HeldChanges {
    pub(super) fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }

    /// Units this transaction holds more (or fewer) than before it.
    pub(super) fn growth(&self) -> i64 {
        self.added.len() as i64 - self.removed.len() as i64
    }

    /// The units this transaction adds, by seq.
    pub(super) fn added(&self) -> impl Iterator<Item = (&u64, &HeldUnit)> + '_ {
        self.added.iter()
    }

    pub(super) fn add(&mut self, seq: u64, unit: HeldUnit) {
        self.added_ids.insert(unit.record.id, seq);
        self.added.insert(seq, unit);
    }

    /// Remove `id`'s unit if this transaction added it.
    pub(super) fn take_added(&mut self, id: MessageId) -> Option<(u64, HeldUnit)> {
        let seq = self.added_ids.remove(&id)?;
        self.added.remove(&seq).map(|u| (seq, u))
    }

    /// Whether this transaction removed the held unit of `seq`.
    pub(super) fn removes(&self, seq: u64) -> bool {
        self.removed.contains(&seq)
    }

    pub(super) fn remove(&mut self, seq: u64) {
        self.removed.insert(seq);
    }

    /// Apply the changes to the held units.
    pub(super) fn apply(self, units: &mut HeldUnits) {
        for seq in self.removed {
            units.remove(seq);
        }
        for (seq, unit) in self.added {
            units.insert(seq, unit);
        }
    }
}

/// The stage's counters, as the last commit left them when it changed only held units
/// (and so did not commit redb): newer than the `meta` table until the next commit that
/// does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Counters {
    pub(super) next_seq: u64,
    pub(super) receipts: u64,
    pub(super) journal_lsn: u64,
}

/// A table of a pending write transaction that records whether it was changed: a commit
/// that changed no table but held units need not commit redb. Reads go through `Deref`;
/// the only writes are these, so none can change the table unseen.
pub(super) struct Tracked<'t, K: redb::Key + 'static, V: redb::Value + 'static> {
    table: redb::Table<'t, K, V>,
    changed: std::rc::Rc<std::cell::Cell<bool>>,
}

impl<'t, K: redb::Key + 'static, V: redb::Value + 'static> Tracked<'t, K, V> {
    pub(super) fn new(table: redb::Table<'t, K, V>, changed: &std::rc::Rc<std::cell::Cell<bool>>) -> Self {
        Self {
            table,
            changed: changed.clone(),
        }
    }

    pub(super) fn insert<'k, 'v>(
        &mut self,
        key: impl std::borrow::Borrow<K::SelfType<'k>>,
        value: impl std::borrow::Borrow<V::SelfType<'v>>,
    ) -> Result<Option<redb::AccessGuard<'_, V>>, redb::StorageError> {
        self.changed.set(true);
        self.table.insert(key, value)
    }

    pub(super) fn remove<'a>(
        &mut self,
        key: impl std::borrow::Borrow<K::SelfType<'a>>,
    ) -> Result<Option<redb::AccessGuard<'_, V>>, redb::StorageError> {
        let removed = self.table.remove(key)?;
        if removed.is_some() {
            self.changed.set(true);
        }
        Ok(removed)
    }
}

impl<'t, K: redb::Key + 'static, V: redb::Value + 'static> std::ops::Deref for Tracked<'t, K, V> {
    type Target = redb::Table<'t, K, V>;

    fn deref(&self) -> &Self::Target {
        &self.table
    }
}
