//! The file DLR store's journal frames: what one write transaction did to the tables, as
//! the keys it set (with their values) and removed, in order.
//!
//! A frame is physical on purpose. The store's calls decide from the clock, the
//! retention settings, counters and what the tables hold; replaying the calls themselves
//! would need all of that to be exactly as it was. Replaying their effects needs nothing:
//! setting each key to the value it was set to, and removing each key that was removed,
//! in the order the transaction did it, turns the tables as the last checkpoint left them
//! into the tables as the transaction left them, whatever the process that replays them
//! is configured with. Applying a frame twice changes nothing the second time, so a
//! frame the file already holds is harmless.
//!
//! Every table of the store is reached through [`Logged`], which records each change it
//! makes; its reads go straight to redb.
//!
//! Format of the operations (big-endian): `table u8 | op u8 (1 set, 0 remove) | key
//! length u32 | key | [value length u32 | value]`, keys and values as redb stores them.

use std::borrow::Borrow;
use std::cell::RefCell;
use std::ops::Deref;

use redb::{AccessGuard, AccessGuardMut, Key, Table, TableDefinition, Value, WriteTransaction};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use super::tx::{
    CORRELATIONS, DELIVERIES, DUE, INBOUND_DUE, INBOUND_GROUPS, INBOUND_OPEN, ORPHAN_EXPIRY, ORPHANS, SMPP_BY_ACCOUNT,
    TRACK_EXPIRY, TRACKS,
};
use crate::envelope::{self, EnvelopeError, RecordKind};
use crate::file::engine::db::{Fail, META};

/// The store's tables, as frames name them. The values are part of the journal format
/// and never change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum TableId {
    Tracks = 1,
    TrackExpiry = 2,
    Correlations = 3,
    Orphans = 4,
    OrphanExpiry = 5,
    Deliveries = 6,
    Due = 7,
    SmppByAccount = 8,
    Meta = 9,
    InboundGroups = 10,
    InboundOpen = 11,
    InboundDue = 12,
}

const SET: u8 = 1;
const REMOVE: u8 = 0;

/// The changes of one write transaction, in the order they were made.
#[derive(Default)]
pub(crate) struct Redo(RefCell<Vec<u8>>);

impl Redo {
    fn record(&self, table: TableId, key: &[u8], value: Option<&[u8]>) {
        let mut ops = self.0.borrow_mut();
        ops.push(table as u8);
        ops.push(if value.is_some() { SET } else { REMOVE });
        push_bytes(&mut ops, key);
        if let Some(value) = value {
            push_bytes(&mut ops, value);
        }
    }

    /// The journal frame of what was recorded (and the record emptied).
    pub(crate) fn take_frame(&self) -> Result<Vec<u8>, EnvelopeError> {
        let frame = Frame {
            ops: ByteBuf::from(std::mem::take(&mut *self.0.borrow_mut())),
        };
        envelope::encode(RecordKind::DlrJournalFrame, &frame)
    }
}

fn push_bytes(ops: &mut Vec<u8>, bytes: &[u8]) {
    // A key or value this long cannot be stored: redb's insert, right after the record,
    // refuses it, and the failed transaction's record is never a frame.
    ops.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    ops.extend_from_slice(bytes);
}

/// One journal frame of the DLR store.
#[derive(Serialize, Deserialize)]
struct Frame {
    ops: ByteBuf,
}

/// A table of a write transaction whose changes are recorded in its [`Redo`]. Reads go
/// to the table itself (through `Deref`); the changes go through the methods here.
pub(crate) struct Logged<'t, K: Key + 'static, V: Value + 'static> {
    table: Table<'t, K, V>,
    id: TableId,
    redo: &'t Redo,
}

impl<'t, K: Key + 'static, V: Value + 'static> Logged<'t, K, V> {
    pub(crate) fn open(
        txn: &'t WriteTransaction,
        def: TableDefinition<K, V>,
        id: TableId,
        redo: &'t Redo,
    ) -> Result<Self, Fail> {
        Ok(Self {
            table: txn.open_table(def)?,
            id,
            redo,
        })
    }

    pub(crate) fn insert<'k, 'v>(
        &mut self,
        key: impl Borrow<K::SelfType<'k>>,
        value: impl Borrow<V::SelfType<'v>>,
    ) -> Result<Option<AccessGuard<'_, V>>, Fail> {
        self.redo.record(
            self.id,
            K::as_bytes(key.borrow()).as_ref(),
            Some(V::as_bytes(value.borrow()).as_ref()),
        );
        Ok(self.table.insert(key, value)?)
    }

    pub(crate) fn remove<'k>(&mut self, key: impl Borrow<K::SelfType<'k>>) -> Result<Option<AccessGuard<'_, V>>, Fail> {
        self.redo.record(self.id, K::as_bytes(key.borrow()).as_ref(), None);
        Ok(self.table.remove(key)?)
    }

    /// The value of `key` to read and then replace in place (see [`LoggedMut::insert`]).
    pub(crate) fn get_mut<'k>(&mut self, key: impl Borrow<K::SelfType<'k>>) -> Result<Option<LoggedMut<'_, V>>, Fail> {
        let key_bytes = K::as_bytes(key.borrow()).as_ref().to_vec();
        let (id, redo) = (self.id, self.redo);
        Ok(self.table.get_mut(key)?.map(|guard| LoggedMut {
            guard,
            key: key_bytes,
            id,
            redo,
        }))
    }
}

impl<'t, K: Key + 'static, V: Value + 'static> Deref for Logged<'t, K, V> {
    type Target = Table<'t, K, V>;

    fn deref(&self) -> &Self::Target {
        &self.table
    }
}

/// A value being replaced in place; the replacement is recorded.
pub(crate) struct LoggedMut<'a, V: Value + 'static> {
    guard: AccessGuardMut<'a, V>,
    key: Vec<u8>,
    id: TableId,
    redo: &'a Redo,
}

impl<V: Value + 'static> LoggedMut<'_, V> {
    pub(crate) fn value(&self) -> V::SelfType<'_> {
        self.guard.value()
    }

    pub(crate) fn insert<'v>(&mut self, value: impl Borrow<V::SelfType<'v>>) -> Result<(), Fail> {
        self.redo
            .record(self.id, &self.key, Some(V::as_bytes(value.borrow()).as_ref()));
        self.guard.insert(value)?;
        Ok(())
    }
}

/// Apply one journal frame (`lsn` names it in errors) to the tables.
pub(crate) fn replay(txn: &WriteTransaction, payload: &[u8], lsn: u64) -> Result<(), Fail> {
    let frame: Frame = envelope::decode(RecordKind::DlrJournalFrame, payload)
        .map_err(|e| Fail::record("journal", format!("dlr frame {lsn}"), e))?;
    let mut ops = Ops { bytes: &frame.ops, lsn };
    while let Some((table, key, value)) = ops.next_op()? {
        match table {
            t if t == TableId::Tracks as u8 => apply(txn, TRACKS, key, value)?,
            t if t == TableId::TrackExpiry as u8 => apply(txn, TRACK_EXPIRY, key, value)?,
            t if t == TableId::Correlations as u8 => apply(txn, CORRELATIONS, key, value)?,
            t if t == TableId::Orphans as u8 => apply(txn, ORPHANS, key, value)?,
            t if t == TableId::OrphanExpiry as u8 => apply(txn, ORPHAN_EXPIRY, key, value)?,
            t if t == TableId::Deliveries as u8 => apply(txn, DELIVERIES, key, value)?,
            t if t == TableId::Due as u8 => apply(txn, DUE, key, value)?,
            t if t == TableId::SmppByAccount as u8 => apply(txn, SMPP_BY_ACCOUNT, key, value)?,
            t if t == TableId::Meta as u8 => apply(txn, META, key, value)?,
            t if t == TableId::InboundGroups as u8 => apply(txn, INBOUND_GROUPS, key, value)?,
            t if t == TableId::InboundOpen as u8 => apply(txn, INBOUND_OPEN, key, value)?,
            t if t == TableId::InboundDue as u8 => apply(txn, INBOUND_DUE, key, value)?,
            other => return Err(ops.invalid(format!("unknown table {other}"))),
        }
    }
    Ok(())
}

/// Set or remove one key. Opening the table per operation costs little next to the
/// B-tree work, and replay runs only after an unclean stop.
fn apply<K: Key + 'static, V: Value + 'static>(
    txn: &WriteTransaction,
    def: TableDefinition<K, V>,
    key: &[u8],
    value: Option<&[u8]>,
) -> Result<(), Fail> {
    let mut table = txn.open_table(def)?;
    let key = K::from_bytes(key);
    match value {
        Some(value) => {
            table.insert(&key, V::from_bytes(value))?;
        }
        None => {
            table.remove(&key)?;
        }
    }
    Ok(())
}

/// One operation of a frame: table, key, the value set (`None`: removed).
type Op<'a> = (u8, &'a [u8], Option<&'a [u8]>);

/// A reader over a frame's operations.
struct Ops<'a> {
    bytes: &'a [u8],
    lsn: u64,
}

impl<'a> Ops<'a> {
    fn invalid(&self, detail: String) -> Fail {
        Fail::Invalid {
            table: "journal",
            detail: format!("dlr frame {}: {detail}", self.lsn),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Fail> {
        if self.bytes.len() < n {
            return Err(self.invalid("an operation is cut short".into()));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn take_bytes(&mut self) -> Result<&'a [u8], Fail> {
        let len = self.take(4)?;
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        self.take(len)
    }

    /// The next operation: table, key, the value set (`None`: removed).
    fn next_op(&mut self) -> Result<Option<Op<'a>>, Fail> {
        if self.bytes.is_empty() {
            return Ok(None);
        }
        let head = self.take(2)?;
        let (table, op) = (head[0], head[1]);
        let key = self.take_bytes()?;
        let value = match op {
            SET => Some(self.take_bytes()?),
            REMOVE => None,
            other => return Err(self.invalid(format!("unknown operation {other}"))),
        };
        Ok(Some((table, key, value)))
    }
}

#[cfg(test)]
mod tests {
    use redb::{Database, ReadableDatabase, ReadableTable};

    use super::*;

    fn table_contents(db: &Database) -> Vec<(u64, Vec<u8>)> {
        let txn = db.begin_read().unwrap();
        let t = txn.open_table(DELIVERIES).unwrap();
        t.iter()
            .unwrap()
            .map(|r| {
                let (k, v) = r.unwrap();
                (k.value(), v.value().to_vec())
            })
            .collect()
    }

    /// Sets, removals and in-place replacements recorded on one database and replayed on
    /// another (which already holds a key the frame removes) leave the same table.
    #[test]
    fn a_replayed_frame_leaves_the_tables_as_the_transaction_did() {
        let tmp = tempfile::tempdir().unwrap();
        let live = Database::create(tmp.path().join("live.redb")).unwrap();
        let copy = Database::create(tmp.path().join("copy.redb")).unwrap();
        for db in [&live, &copy] {
            let txn = db.begin_write().unwrap();
            txn.open_table(DELIVERIES)
                .unwrap()
                .insert(7, b"old".as_slice())
                .unwrap();
            txn.commit().unwrap();
        }
        let redo = Redo::default();
        let txn = live.begin_write().unwrap();
        {
            let mut t = Logged::open(&txn, DELIVERIES, TableId::Deliveries, &redo).unwrap();
            t.insert(1, b"one".as_slice()).unwrap();
            t.insert(2, b"two".as_slice()).unwrap();
            t.remove(7).unwrap();
            t.remove(99).unwrap();
            let mut g = t.get_mut(1).unwrap().unwrap();
            assert_eq!(g.value(), b"one");
            g.insert(b"uno".as_slice()).unwrap();
        }
        txn.commit().unwrap();
        let frame = redo.take_frame().unwrap();

        let txn = copy.begin_write().unwrap();
        replay(&txn, &frame, 1).unwrap();
        // A frame applied again changes nothing.
        replay(&txn, &frame, 1).unwrap();
        txn.commit().unwrap();
        assert_eq!(table_contents(&copy), table_contents(&live));
        assert_eq!(table_contents(&live), [(1, b"uno".to_vec()), (2, b"two".to_vec())]);
    }

    #[test]
    fn a_frame_cut_short_or_naming_an_unknown_table_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let db = Database::create(tmp.path().join("d.redb")).unwrap();
        let frame = |ops: Vec<u8>| {
            envelope::encode(
                RecordKind::DlrJournalFrame,
                &Frame {
                    ops: ByteBuf::from(ops),
                },
            )
            .unwrap()
        };
        let txn = db.begin_write().unwrap();
        for (ops, says) in [
            (vec![TableId::Deliveries as u8, SET, 0, 0, 0, 8, 1], "cut short"),
            (vec![200, REMOVE, 0, 0, 0, 0], "unknown table 200"),
            (vec![TableId::Deliveries as u8, 7, 0, 0, 0, 0], "unknown operation 7"),
        ] {
            let err = replay(&txn, &frame(ops), 3).unwrap_err();
            assert!(
                matches!(&err, Fail::Invalid { detail, .. } if detail.contains(says) && detail.contains("frame 3"))
            );
        }
    }
}
