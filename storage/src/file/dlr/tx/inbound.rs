//! The file DLR store's multipart inbound groups inside a write transaction: placing a
//! step's parts, removing a group when it is written or dropped, and the routed inbound
//! deliveries.
//!
//! Three tables: `inbound_groups` (group number → group envelope with its parts),
//! `inbound_open` (group key → the key's open group) and `inbound_due` (due time + group
//! number; a complete or closed group is due at time 0, any other at its deadline), so
//! `due_inbound_groups` reads the first keys of `inbound_due` and nothing else.

use redb::{ReadableTable, ReadableTableMetadata, TableDefinition, WriteTransaction};

use super::super::records::{GroupRecord, due_key, inbound_key};
use super::super::redo::{Logged, TableId};
use super::{Tx, encode};
use crate::dlr::DeliveryContent;
use crate::envelope::{self, RecordKind};
use crate::file::engine::db::{Fail, META, get_counter};
use crate::ids::Timestamp;
use crate::inbound::{InboundGroup, InboundGroupKey, InboundPart, RoutedInbound, StepGroups};

pub(crate) const INBOUND_GROUPS: TableDefinition<u64, &[u8]> = TableDefinition::new("inbound_groups");
pub(crate) const INBOUND_OPEN: TableDefinition<&[u8], u64> = TableDefinition::new("inbound_open");
pub(crate) const INBOUND_DUE: TableDefinition<&[u8; 16], ()> = TableDefinition::new("inbound_due");

/// Meta counter: the last group number handed out (numbers are never reused).
pub(crate) const NEXT_GROUP: &str = "next_inbound_group";
/// Meta counter: parts held in `inbound_groups` (for `stats`, without reading groups).
pub(crate) const INBOUND_PARTS: &str = "inbound_parts";

/// Create the inbound tables (a file of an earlier build gets them empty) and check what
/// is cheap: the first and last group decode, the due index has one entry per group, no
/// key has an open group that is not held, no group number is beyond the counter.
pub(super) fn init(txn: &WriteTransaction) -> Result<(), Fail> {
    let groups = txn.open_table(INBOUND_GROUPS)?;
    let open = txn.open_table(INBOUND_OPEN)?;
    let due = txn.open_table(INBOUND_DUE)?;
    let meta = txn.open_table(META)?;
    for entry in [groups.first()?, groups.last()?].into_iter().flatten() {
        decode_group(entry.1.value())?;
    }
    let invalid = |detail: String| Fail::Invalid { table: "meta", detail };
    if groups.len()? != due.len()? {
        return Err(invalid(format!(
            "inbound_groups / inbound_due: {} vs {} entries (an index and its records disagree)",
            groups.len()?,
            due.len()?
        )));
    }
    if open.len()? > groups.len()? {
        return Err(invalid(format!(
            "{} open inbound groups but only {} groups",
            open.len()?,
            groups.len()?
        )));
    }
    if let Some((k, _)) = groups.last()?
        && k.value() > get_counter(&meta, NEXT_GROUP)?
    {
        return Err(Fail::Invalid {
            table: "inbound_groups",
            detail: "an inbound group number is beyond the stored group counter".to_string(),
        });
    }
    Ok(())
}

pub(crate) fn decode_group(bytes: &[u8]) -> Result<GroupRecord, Fail> {
    envelope::decode(RecordKind::DlrInboundGroup, bytes).map_err(|e| Fail::message_record("inbound_groups", e))
}

/// When a stored group is due (see [`InboundGroup::due_at`]).
fn due_of(rec: &GroupRecord) -> Timestamp {
    if rec.closed || rec.parts.len() == usize::from(rec.key.total) {
        Timestamp(0)
    } else {
        rec.deadline
    }
}

/// The inbound tables of one write transaction and their counters.
pub(crate) struct InboundTables<'t> {
    groups: Logged<'t, u64, &'static [u8]>,
    open: Logged<'t, &'static [u8], u64>,
    due: Logged<'t, &'static [u8; 16], ()>,
    pub(super) next_group: u64,
    pub(super) parts: u64,
    pub(super) counters_dirty: bool,
}

impl<'t> InboundTables<'t> {
    fn load(&self, no: u64) -> Result<Option<GroupRecord>, Fail> {
        match self.groups.get(no)? {
            Some(v) => Ok(Some(decode_group(v.value())?)),
            None => Ok(None),
        }
    }

    fn open_group(&self, key: &InboundGroupKey) -> Result<Option<InboundGroup>, Fail> {
        let Some(no) = self.open.get(inbound_key(key).as_slice())?.map(|v| v.value()) else {
            return Ok(None);
        };
        match self.load(no)? {
            Some(rec) => Ok(Some(rec.into_group(no))),
            None => Err(Fail::Invalid {
                table: "inbound_open",
                detail: "a key's open group is not held".to_string(),
            }),
        }
    }

    /// Remove a group and its index entries; `None` when it is not held.
    fn remove(&mut self, no: u64) -> Result<Option<GroupRecord>, Fail> {
        let rec = match self.groups.remove(no)? {
            Some(v) => decode_group(v.value())?,
            None => return Ok(None),
        };
        self.due.remove(&due_key(due_of(&rec), no))?;
        let key = inbound_key(&rec.key.clone().into());
        if self.open.get(key.as_slice())?.is_some_and(|v| v.value() == no) {
            self.open.remove(key.as_slice())?;
        }
        self.parts = self.parts.saturating_sub(rec.parts.len() as u64);
        self.counters_dirty = true;
        Ok(Some(rec))
    }
}

impl<'t> Tx<'t> {
    fn inbound_tables(&mut self) -> Result<&mut InboundTables<'t>, Fail> {
        if self.inbound.is_none() {
            self.inbound = Some(InboundTables {
                groups: Logged::open(self.txn, INBOUND_GROUPS, TableId::InboundGroups, self.redo)?,
                open: Logged::open(self.txn, INBOUND_OPEN, TableId::InboundOpen, self.redo)?,
                due: Logged::open(self.txn, INBOUND_DUE, TableId::InboundDue, self.redo)?,
                next_group: get_counter(&*self.meta, NEXT_GROUP)?,
                parts: get_counter(&*self.meta, INBOUND_PARTS)?,
                counters_dirty: false,
            });
        }
        match self.inbound.as_mut() {
            Some(t) => Ok(t),
            None => Err(Fail::Invalid {
                table: "inbound_groups",
                detail: "inbound tables not open".to_string(),
            }),
        }
    }

    /// Place a step's parts in their groups (see [`crate::inbound`]) and write back what
    /// changed. Returns the numbers of the groups the parts made complete or closed.
    pub(crate) fn inbound_parts(&mut self, parts: Vec<InboundPart>) -> Result<Vec<u64>, Fail> {
        if parts.is_empty() {
            return Ok(Vec::new());
        }
        let t = self.inbound_tables()?;
        let mut keys: Vec<&InboundGroupKey> = parts.iter().map(|p| &p.key).collect();
        keys.sort_unstable();
        keys.dedup();
        let mut open = Vec::with_capacity(keys.len());
        for key in keys {
            open.extend(t.open_group(key)?);
        }
        let mut step = StepGroups::new(open);
        for part in parts {
            step.place(part);
        }
        let mut next = t.next_group;
        step.number(|| {
            next += 1;
            next
        });
        t.next_group = next;
        let mut ready = Vec::new();
        for g in step.into_touched().into_iter().filter(|g| g.changed()) {
            let no = g.group.no;
            t.parts += g.added.len() as u64;
            t.counters_dirty = true;
            if let Some(before) = g.due_before {
                t.due.remove(&due_key(before, no))?;
            }
            t.due.insert(&due_key(g.group.due_at(), no), ())?;
            let key = inbound_key(&g.group.key);
            if g.group.closed {
                if t.open.get(key.as_slice())?.is_some_and(|v| v.value() == no) {
                    t.open.remove(key.as_slice())?;
                }
            } else {
                t.open.insert(key.as_slice(), no)?;
            }
            if g.ready() {
                ready.push(no);
            }
            let bytes = encode(
                RecordKind::DlrInboundGroup,
                "inbound_groups",
                &GroupRecord::from(g.group),
            )?;
            t.groups.insert(no, bytes.as_slice())?;
        }
        self.changed = true;
        Ok(ready)
    }

    /// One delivery for a routed inbound message; one assembled from a group only if
    /// the group is still held, and the group removed.
    pub(crate) fn inbound(&mut self, m: RoutedInbound, now: Timestamp) -> Result<(), Fail> {
        let target = m.target().into();
        let message = match m.group {
            Some(no) => match self.inbound_tables()?.remove(no)? {
                Some(rec) => rec.into_group(no).deliver_as(m.message),
                None => return Ok(()),
            },
            None => m.message,
        };
        self.create_delivery(target, DeliveryContent::Inbound(Box::new(message)), now)
    }

    /// Remove a group without a delivery (nothing routes its message).
    pub(crate) fn drop_group(&mut self, no: u64) -> Result<(), Fail> {
        if self.inbound_tables()?.remove(no)?.is_some() {
            self.changed = true;
        }
        Ok(())
    }

    /// These groups as stored now (those still held), by number.
    pub(crate) fn inbound_groups(&mut self, mut nos: Vec<u64>) -> Result<Vec<InboundGroup>, Fail> {
        if nos.is_empty() {
            return Ok(Vec::new());
        }
        nos.sort_unstable();
        nos.dedup();
        let t = self.inbound_tables()?;
        let mut out = Vec::with_capacity(nos.len());
        for no in nos {
            if let Some(rec) = t.load(no)? {
                out.push(rec.into_group(no));
            }
        }
        Ok(out)
    }
}
