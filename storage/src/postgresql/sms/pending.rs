//! The PostgreSQL pending stage, [`PgPendingStore`]: admissions and completions in one
//! transaction per commit, reads by ready seq.
//!
//! Every write transaction locks the one row of `sms_pending_totals` first: the stage's
//! writers take turns (in every process sharing the database), so a commit decides
//! idempotency, multipart placement and capacity from the tables as they are, and ready
//! seqs are handed out in commit order. A commit is a fixed number of statements
//! whatever its size: rows go in and out as arrays (`UNNEST`, `= ANY`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use async_trait::async_trait;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::{Db, column, ms, partition_of, ts};
use crate::backend::{Backend, StageCapabilities};
use crate::envelope::{self, RecordKind};
use crate::error::PendingError;
use crate::file::records::GroupState;
use crate::ids::{MessageId, ReadyCursor, ReadySeq, Timestamp, UnitId};
use crate::memory::PendingLimits;
use crate::pending::{AdmitOutcome, Disposition, PendingCapabilities, PendingStats, PendingStore, ReadyUnit, Unit};
use crate::postgresql::OpError;
use crate::reassembly::{self, GroupView, KeyState, Placement, group_key_bytes, group_prefix};
use crate::record::PendingRecord;

/// Expired idempotency keys and completed groups forgotten per commit at most (a long
/// quiet spell does not turn one commit into a huge delete). Reads check the deadline,
/// so what is not forgotten yet never counts.
const FORGET_PER_COMMIT: i64 = 4096;
/// How often (in ms) a commit forgets what expired, unless the last one left more: two
/// statements per admission commit cost more than a second's delay of a deletion.
const FORGET_EVERY_MS: i64 = 1000;

/// The ready units after the selection cursor that no stage holds, when this process
/// reads every partition: the primary key's order, stopped by the limit. `OFFSET 0`
/// keeps each `NOT EXISTS` a primary-key probe per candidate row: flattened into an
/// anti-join, the planner — with statistics of a queue table taken while it was nearly
/// empty — may hash or materialize the whole other table on every call.
/// Ready units of every partition that no process has selected, after each lane's cursor
/// (`$1`, one bound per lane, indexed by lane + 1): each lane's in order through the seq
/// index, at most the limit of each, merged highest lane first.
const SELECT_READY: &str = "SELECT x.seq, x.id, x.disposition, x.members \
     FROM generate_series(9, 0, -1) AS l(lane) CROSS JOIN LATERAL ( \
       SELECT seq, id, disposition, members FROM sms_units u \
        WHERE u.seq > ($1::int8[])[l.lane + 1] AND u.seq < (l.lane + 1)::int8 << 56 \
          AND NOT EXISTS (SELECT 1 FROM sms_staged s WHERE s.unit = u.id OFFSET 0) \
          AND NOT EXISTS (SELECT 1 FROM sms_routed r WHERE r.unit = u.id OFFSET 0) \
        ORDER BY seq LIMIT $2) x \
     ORDER BY x.seq >> 56 DESC, x.seq LIMIT $2";

/// The same for some partitions: each partition's and lane's ready units in order through
/// the partition index, at most the limit of each, merged highest lane first.
const SELECT_READY_OF_PARTITIONS: &str = "SELECT x.seq, x.id, x.disposition, x.members \
     FROM UNNEST($3::int2[]) AS p(partition) CROSS JOIN generate_series(9, 0, -1) AS l(lane) \
     CROSS JOIN LATERAL ( \
       SELECT seq, id, disposition, members FROM sms_units u \
        WHERE u.partition = p.partition \
          AND u.seq > ($1::int8[])[l.lane + 1] AND u.seq < (l.lane + 1)::int8 << 56 \
          AND NOT EXISTS (SELECT 1 FROM sms_staged s WHERE s.unit = u.id OFFSET 0) \
          AND NOT EXISTS (SELECT 1 FROM sms_routed r WHERE r.unit = u.id OFFSET 0) \
        ORDER BY seq LIMIT $2) x \
     ORDER BY x.seq >> 56 DESC, x.seq LIMIT $2";

/// The PostgreSQL pending store.
#[derive(Debug)]
pub struct PgPendingStore {
    db: Arc<Db>,
    limits: PendingLimits,
    partitions: u16,
    /// When (ms since the epoch) the next admission commit forgets what expired.
    forget_at: AtomicI64,
}

impl PgPendingStore {
    pub(super) fn new(db: Arc<Db>, limits: PendingLimits, partitions: u16) -> Self {
        Self {
            db,
            limits,
            partitions,
            forget_at: AtomicI64::new(0),
        }
    }
}

/// A multipart group as a commit sees and changes it.
struct Group {
    /// Open (else completed: known until its deadline).
    open: bool,
    total: u8,
    deadline: Timestamp,
    state: GroupState,
}

impl Group {
    fn state(&self, seq: u8, now: Timestamp) -> Option<KeyState> {
        if !self.open && self.deadline <= now {
            return None;
        }
        let at_seq = self.state.at(seq).and_then(|p| Some((*p.ids.first()?, p.digest?)));
        Some(KeyState::new(
            self.open,
            GroupView {
                total: self.total,
                at_seq,
            },
        ))
    }
}

/// A ready unit to insert.
struct NewUnit {
    id: UnitId,
    partition: u16,
    disposition: Disposition,
    members: Vec<MessageId>,
    receipts: u64,
    /// Its lane of the ready order (see [`ReadySeq`]).
    lane: u8,
}

/// What one commit writes besides its completions.
#[derive(Default)]
struct Writes {
    records: Vec<(Uuid, i64, bool, Vec<u8>)>,
    units: Vec<NewUnit>,
    /// (account, key, id, submission digest as stored: the u64's bits as a bigint).
    idempotency: Vec<(String, String, Uuid, i64)>,
}

fn disposition_code(d: Disposition) -> i16 {
    match d {
        Disposition::Deliver => 0,
        Disposition::Expired => 1,
    }
}

fn members_bytes(members: &[MessageId]) -> Vec<u8> {
    members.iter().flat_map(|m| m.to_bytes()).collect()
}

fn members_of(bytes: &[u8]) -> Vec<MessageId> {
    bytes
        .chunks_exact(16)
        .filter_map(|c| <[u8; 16]>::try_from(c).ok())
        .map(MessageId::from_bytes)
        .collect()
}

impl PgPendingStore {
    /// The partition of a unit whose first part is `first`.
    fn partition(&self, first: &PendingRecord) -> u16 {
        partition_of(&first.account, &first.destination.addr, self.partitions)
    }

    /// Lock the stage (the totals row) and read its totals.
    async fn lock(&self, tx: &mut PgConnection) -> Result<Totals, OpError> {
        let row = sqlx::query(
            "SELECT records, receipt_requests, units, next_seq FROM sms_pending_totals WHERE id = 1 FOR UPDATE",
        )
        .fetch_one(&mut *tx)
        .await?;
        Ok(Totals {
            records: row.try_get("records")?,
            receipts: row.try_get("receipt_requests")?,
            units: row.try_get("units")?,
            next_seq: row.try_get("next_seq")?,
        })
    }

    async fn save(&self, tx: &mut PgConnection, t: &Totals) -> Result<(), OpError> {
        sqlx::query(
            "UPDATE sms_pending_totals SET records = $1, receipt_requests = $2, units = $3, next_seq = $4 WHERE id = 1",
        )
        .bind(t.records)
        .bind(t.receipts)
        .bind(t.units)
        .bind(t.next_seq)
        .execute(&mut *tx)
        .await?;
        Ok(())
    }

    /// Remove completed units and their records.
    async fn complete_tx(&self, tx: &mut PgConnection, ids: &[UnitId], t: &mut Totals) -> Result<(), OpError> {
        if ids.is_empty() {
            return Ok(());
        }
        let ids: Vec<Uuid> = ids.iter().map(MessageId::as_uuid).collect();
        // The routed-work stage lives in the same database: a completed source's routed
        // work goes in the same transaction, so no restart finds routed work whose
        // source is gone (the Router's own removal later finds nothing left).
        sqlx::query("DELETE FROM sms_routed WHERE unit = ANY($1)")
            .bind(&ids)
            .execute(&mut *tx)
            .await?;
        let rows = sqlx::query("DELETE FROM sms_units WHERE id = ANY($1) RETURNING members, receipts")
            .bind(&ids)
            .fetch_all(&mut *tx)
            .await?;
        if rows.is_empty() {
            return Ok(());
        }
        let mut members = Vec::new();
        for row in &rows {
            members.extend(
                members_of(&row.try_get::<Vec<u8>, _>("members")?)
                    .iter()
                    .map(MessageId::as_uuid),
            );
            t.receipts -= i64::from(row.try_get::<i32, _>("receipts")?);
        }
        t.units -= rows.len() as i64;
        let removed = sqlx::query("DELETE FROM sms_records WHERE id = ANY($1)")
            .bind(&members)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        t.records -= i64::try_from(removed).unwrap_or(i64::MAX);
        Ok(())
    }

    /// Forget idempotency keys past their retention and completed groups past their
    /// deadline, at most [`FORGET_PER_COMMIT`] of each, once every [`FORGET_EVERY_MS`]
    /// (at once again when a limit was reached).
    async fn forget_tx(&self, tx: &mut PgConnection, now: i64) -> Result<(), OpError> {
        if now < self.forget_at.load(Ordering::Relaxed) {
            return Ok(());
        }
        let keys = sqlx::query(
            "DELETE FROM sms_idempotency WHERE (account, key) IN \
             (SELECT account, key FROM sms_idempotency WHERE expires_at <= $1 LIMIT $2)",
        )
        .bind(now)
        .bind(FORGET_PER_COMMIT)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let groups = sqlx::query(
            "DELETE FROM sms_groups WHERE key IN \
             (SELECT key FROM sms_groups WHERE NOT open AND deadline <= $1 LIMIT $2)",
        )
        .bind(now)
        .bind(FORGET_PER_COMMIT)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let full = u64::try_from(FORGET_PER_COMMIT).unwrap_or(u64::MAX);
        let next = if keys >= full || groups >= full {
            now
        } else {
            now + FORGET_EVERY_MS
        };
        self.forget_at.store(next, Ordering::Relaxed);
        Ok(())
    }

    /// Unexpired idempotency keys among `keys`, with the id each first admitted and its
    /// submission digest (absent in rows written before it was kept).
    async fn idempotent_tx(
        &self,
        tx: &mut PgConnection,
        keys: &HashSet<(&str, &str)>,
        now: i64,
    ) -> Result<HashMap<(String, String), (MessageId, Option<u64>)>, OpError> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let (accounts, names): (Vec<&str>, Vec<&str>) = keys.iter().copied().unzip();
        let rows = sqlx::query(
            "SELECT i.account, i.key, i.id, i.digest FROM sms_idempotency i \
             JOIN UNNEST($1::text[], $2::text[]) AS k(account, key) USING (account, key) \
             WHERE i.expires_at > $3",
        )
        .bind(&accounts)
        .bind(&names)
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        let mut out = HashMap::with_capacity(rows.len());
        for row in rows {
            let digest: Option<i64> = row.try_get("digest")?;
            out.insert(
                (row.try_get("account")?, row.try_get("key")?),
                (
                    MessageId::from_uuid(row.try_get("id")?),
                    digest.map(|d| u64::from_be_bytes(d.to_be_bytes())),
                ),
            );
        }
        Ok(out)
    }

    /// The stored groups of these group prefixes, by prefix (the stage keeps at most one
    /// row per prefix: an open group, or a completed one).
    async fn groups_tx(
        &self,
        tx: &mut PgConnection,
        prefixes: &HashSet<Vec<u8>>,
    ) -> Result<HashMap<Vec<u8>, (Vec<u8>, Group)>, OpError> {
        if prefixes.is_empty() {
            return Ok(HashMap::new());
        }
        let prefixes: Vec<&[u8]> = prefixes.iter().map(Vec::as_slice).collect();
        let rows = sqlx::query("SELECT key, prefix, open, deadline, state FROM sms_groups WHERE prefix = ANY($1)")
            .bind(&prefixes)
            .fetch_all(&mut *tx)
            .await?;
        let mut out = HashMap::with_capacity(rows.len());
        for row in rows {
            let key: Vec<u8> = row.try_get("key")?;
            let state: GroupState = envelope::decode(RecordKind::PendingGroup, &row.try_get::<Vec<u8>, _>("state")?)
                .map_err(|e| self.db.corrupt(format_args!("sms_groups: {e}")))?;
            let group = Group {
                open: row.try_get("open")?,
                total: key.last().copied().unwrap_or(0),
                deadline: ts(row.try_get("deadline")?),
                state,
            };
            out.insert(row.try_get("prefix")?, (key, group));
        }
        Ok(out)
    }

    async fn insert_units(&self, tx: &mut PgConnection, units: &[NewUnit], t: &mut Totals) -> Result<(), OpError> {
        if units.is_empty() {
            return Ok(());
        }
        let mut seqs = Vec::with_capacity(units.len());
        for u in units {
            let seq = ReadySeq::in_lane(u.lane, u64::try_from(t.next_seq).unwrap_or(0)).0;
            seqs.push(i64::try_from(seq).unwrap_or(i64::MAX));
            t.next_seq += 1;
        }
        let ids: Vec<Uuid> = units.iter().map(|u| u.id.as_uuid()).collect();
        let partitions: Vec<i16> = units.iter().map(|u| i16::try_from(u.partition).unwrap_or(0)).collect();
        let dispositions: Vec<i16> = units.iter().map(|u| disposition_code(u.disposition)).collect();
        let members: Vec<Vec<u8>> = units.iter().map(|u| members_bytes(&u.members)).collect();
        let receipts: Vec<i32> = units
            .iter()
            .map(|u| i32::try_from(u.receipts).unwrap_or(i32::MAX))
            .collect();
        sqlx::query(
            "INSERT INTO sms_units (seq, id, partition, disposition, members, receipts) \
             SELECT * FROM UNNEST($1::int8[], $2::uuid[], $3::int2[], $4::int2[], $5::bytea[], $6::int4[])",
        )
        .bind(&seqs)
        .bind(&ids)
        .bind(&partitions)
        .bind(&dispositions)
        .bind(&members)
        .bind(&receipts)
        .execute(&mut *tx)
        .await?;
        t.units += units.len() as i64;
        Ok(())
    }

    /// One commit: completions, then the admissions decided against the tables as the
    /// completions leave them.
    async fn commit_tx(
        &self,
        tx: &mut PgConnection,
        admit: &[PendingRecord],
        complete: &[UnitId],
        now: Timestamp,
    ) -> Result<Vec<AdmitOutcome>, OpError> {
        let mut t = self.lock(tx).await?;
        self.complete_tx(tx, complete, &mut t).await?;
        if admit.is_empty() {
            self.save(tx, &t).await?;
            return Ok(Vec::new());
        }
        let now_ms = ms(now);
        self.forget_tx(tx, now_ms).await?;
        let idem_expiry = now.saturating_add(self.limits.idempotency_retention);
        let keys: HashSet<(&str, &str)> = admit
            .iter()
            .filter_map(|r| Some((r.account.as_str(), r.idempotency_key.as_deref()?)))
            .collect();
        let stored_keys = self.idempotent_tx(tx, &keys, now_ms).await?;
        let prefixes: HashSet<Vec<u8>> = admit
            .iter()
            .filter_map(|r| Some(group_prefix(&r.group_key()?)))
            .collect();
        let stored = self.groups_tx(tx, &prefixes).await?;
        // Stored group keys, to delete whatever the commit leaves them without.
        let stored_keys_of_groups: Vec<Vec<u8>> = stored.values().map(|(k, _)| k.clone()).collect();
        let mut groups: HashMap<Vec<u8>, Option<Group>> = stored.into_iter().map(|(p, (_, g))| (p, Some(g))).collect();

        let mut outcomes = Vec::with_capacity(admit.len());
        let mut writes = Writes::default();
        let mut batch_keys: HashMap<(&str, &str), (MessageId, Option<u64>)> = HashMap::new();
        for record in admit {
            if let Some(key) = record.idempotency_key.as_deref() {
                let k = (record.account.as_str(), key);
                let existing = batch_keys
                    .get(&k)
                    .copied()
                    .or_else(|| stored_keys.get(&(k.0.to_string(), k.1.to_string())).copied());
                if let Some((existing, digest)) = existing {
                    outcomes.push(match digest {
                        Some(d) if d != record.submission_digest() => AdmitOutcome::KeyReused { existing },
                        _ => AdmitOutcome::Duplicate { existing },
                    });
                    continue;
                }
            }
            let part = record.part.zip(record.group_key().map(|gk| group_prefix(&gk)));
            // Only parts are compared with other admissions.
            let digest = if part.is_some() { record.submission_digest() } else { 0 };
            let placement = match &part {
                Some((info, prefix)) => {
                    let known = groups.get(prefix).and_then(|g| g.as_ref()?.state(info.seq, now));
                    reassembly::place(record, digest, known)
                }
                None => Placement::Join,
            };
            if let Placement::Retransmission { existing } = placement {
                outcomes.push(AdmitOutcome::Duplicate { existing });
                continue;
            }
            if t.records >= i64::try_from(self.limits.max_records).unwrap_or(i64::MAX) {
                outcomes.push(AdmitOutcome::Full);
                continue;
            }
            let wants = u64::from(record.wants_receipt());
            t.records += 1;
            t.receipts += wants as i64;
            let bytes = envelope::encode(RecordKind::PendingRecord, record)
                .map_err(|e| self.db.corrupt(format_args!("sms_records: {e}")))?;
            writes
                .records
                .push((record.id.as_uuid(), ms(record.accepted_at), wants == 1, bytes));
            if let Some(key) = record.idempotency_key.as_deref() {
                let digest = record.submission_digest();
                batch_keys.insert((record.account.as_str(), key), (record.id, Some(digest)));
                writes.idempotency.push((
                    record.account.clone(),
                    key.to_string(),
                    record.id.as_uuid(),
                    i64::from_be_bytes(digest.to_be_bytes()),
                ));
            }
            let partition = self.partition(record);
            match part {
                Some((info, prefix)) => {
                    let slot = groups.entry(prefix).or_insert(None);
                    if placement == Placement::Supersede
                        && let Some(old) = slot.take()
                    {
                        // Closed at once as incomplete: its parts fail with receipts.
                        let members = old.state.members();
                        if let Some(first) = members.first().copied() {
                            writes.units.push(NewUnit {
                                id: first,
                                partition,
                                disposition: Disposition::Expired,
                                members,
                                receipts: old.state.receipts,
                                lane: 0,
                            });
                        }
                    }
                    if slot.as_ref().is_some_and(|g| !g.open) {
                        // A new message with this reference: the completed one is no
                        // longer expected.
                        *slot = None;
                    }
                    let group = slot.get_or_insert_with(|| Group {
                        open: true,
                        total: info.total,
                        deadline: info.expires_at,
                        state: GroupState {
                            deadline: info.expires_at,
                            ..GroupState::default()
                        },
                    });
                    group.state.add(info.seq, record.id, digest);
                    group.state.receipts += wants;
                    group.deadline = group.deadline.min(info.expires_at);
                    group.state.deadline = group.deadline;
                    if group.state.parts.len() == usize::from(group.total) {
                        let members = group.state.members();
                        if let Some(first) = members.first().copied() {
                            writes.units.push(NewUnit {
                                id: first,
                                partition,
                                disposition: Disposition::Deliver,
                                members,
                                receipts: group.state.receipts,
                                // The lane of the part completing the group.
                                lane: record.route_priority,
                            });
                        }
                        group.open = false;
                    }
                }
                None => writes.units.push(NewUnit {
                    id: record.id,
                    partition,
                    disposition: Disposition::Deliver,
                    members: vec![record.id],
                    receipts: wants,
                    lane: record.route_priority,
                }),
            }
            outcomes.push(if placement == Placement::Supersede {
                AdmitOutcome::Superseding
            } else {
                AdmitOutcome::Admitted
            });
        }
        self.write_tx(tx, &writes, &groups, &stored_keys_of_groups, idem_expiry, &mut t)
            .await?;
        self.save(tx, &t).await?;
        Ok(outcomes)
    }

    /// The rows a commit decided: records, units, groups as it leaves them, keys.
    async fn write_tx(
        &self,
        tx: &mut PgConnection,
        writes: &Writes,
        groups: &HashMap<Vec<u8>, Option<Group>>,
        stored_group_keys: &[Vec<u8>],
        idem_expiry: Timestamp,
        t: &mut Totals,
    ) -> Result<(), OpError> {
        if !writes.records.is_empty() {
            let ids: Vec<Uuid> = writes.records.iter().map(|r| r.0).collect();
            let at: Vec<i64> = writes.records.iter().map(|r| r.1).collect();
            let receipt: Vec<bool> = writes.records.iter().map(|r| r.2).collect();
            let bytes: Vec<&[u8]> = writes.records.iter().map(|r| r.3.as_slice()).collect();
            sqlx::query(
                "INSERT INTO sms_records (id, accepted_at, receipt, record) \
                 SELECT * FROM UNNEST($1::uuid[], $2::int8[], $3::bool[], $4::bytea[])",
            )
            .bind(&ids)
            .bind(&at)
            .bind(&receipt)
            .bind(&bytes)
            .execute(&mut *tx)
            .await?;
        }
        // Units get their seqs in the order the commit made them ready.
        self.insert_units(tx, &writes.units, t).await?;
        if !groups.is_empty() {
            let mut keep: HashSet<Vec<u8>> = HashSet::new();
            let (mut keys, mut prefixes, mut open, mut deadlines, mut states) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for (prefix, group) in groups {
                let Some(g) = group else { continue };
                let key = group_key_bytes(prefix, g.total);
                keep.insert(key.clone());
                keys.push(key);
                prefixes.push(prefix.clone());
                open.push(g.open);
                deadlines.push(ms(g.deadline));
                states.push(
                    envelope::encode(RecordKind::PendingGroup, &g.state)
                        .map_err(|e| self.db.corrupt(format_args!("sms_groups: {e}")))?,
                );
            }
            let gone: Vec<&[u8]> = stored_group_keys
                .iter()
                .filter(|k| !keep.contains(*k))
                .map(Vec::as_slice)
                .collect();
            if !gone.is_empty() {
                sqlx::query("DELETE FROM sms_groups WHERE key = ANY($1)")
                    .bind(&gone)
                    .execute(&mut *tx)
                    .await?;
            }
            if !keys.is_empty() {
                sqlx::query(
                    "INSERT INTO sms_groups (key, prefix, open, deadline, state) \
                     SELECT * FROM UNNEST($1::bytea[], $2::bytea[], $3::bool[], $4::int8[], $5::bytea[]) \
                     ON CONFLICT (key) DO UPDATE SET open = EXCLUDED.open, deadline = EXCLUDED.deadline, \
                     state = EXCLUDED.state",
                )
                .bind(&keys)
                .bind(&prefixes)
                .bind(&open)
                .bind(&deadlines)
                .bind(&states)
                .execute(&mut *tx)
                .await?;
            }
        }
        if !writes.idempotency.is_empty() {
            let accounts: Vec<&str> = writes.idempotency.iter().map(|k| k.0.as_str()).collect();
            let keys: Vec<&str> = writes.idempotency.iter().map(|k| k.1.as_str()).collect();
            let ids: Vec<Uuid> = writes.idempotency.iter().map(|k| k.2).collect();
            let digests: Vec<i64> = writes.idempotency.iter().map(|k| k.3).collect();
            // A row still there is past its retention (an unexpired one made this a
            // duplicate): it is replaced.
            sqlx::query(
                "INSERT INTO sms_idempotency (account, key, id, expires_at, digest) \
                 SELECT a, k, i, $4, d FROM UNNEST($1::text[], $2::text[], $3::uuid[], $5::bigint[]) AS u(a, k, i, d) \
                 ON CONFLICT (account, key) DO UPDATE SET id = EXCLUDED.id, expires_at = EXCLUDED.expires_at, \
                 digest = EXCLUDED.digest",
            )
            .bind(&accounts)
            .bind(&keys)
            .bind(&ids)
            .bind(ms(idem_expiry))
            .bind(&digests)
            .execute(&mut *tx)
            .await?;
        }
        Ok(())
    }

    /// Turn groups past their deadline into expired units.
    async fn expire_tx(&self, tx: &mut PgConnection, now: Timestamp, limit: usize) -> Result<usize, OpError> {
        let mut t = self.lock(tx).await?;
        let rows = sqlx::query(
            "DELETE FROM sms_groups WHERE key IN \
             (SELECT key FROM sms_groups WHERE open AND deadline <= $1 ORDER BY deadline LIMIT $2) \
             RETURNING state",
        )
        .bind(ms(now))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&mut *tx)
        .await?;
        let mut units = Vec::with_capacity(rows.len());
        for row in &rows {
            let state: GroupState = envelope::decode(RecordKind::PendingGroup, &row.try_get::<Vec<u8>, _>("state")?)
                .map_err(|e| self.db.corrupt(format_args!("sms_groups: {e}")))?;
            let members = state.members();
            let Some(first) = members.first().copied() else {
                continue;
            };
            let partition = match self.records_tx(tx, &[first]).await?.first() {
                Some(r) => self.partition(r),
                None => 0,
            };
            units.push(NewUnit {
                id: first,
                partition,
                disposition: Disposition::Expired,
                members,
                receipts: state.receipts,
                lane: 0,
            });
        }
        self.insert_units(tx, &units, &mut t).await?;
        self.save(tx, &t).await?;
        Ok(rows.len())
    }

    /// The stored records with these ids (missing ones skipped), in no set order.
    async fn records_tx(&self, tx: &mut PgConnection, ids: &[MessageId]) -> Result<Vec<PendingRecord>, OpError> {
        let ids: Vec<Uuid> = ids.iter().map(MessageId::as_uuid).collect();
        let rows = sqlx::query("SELECT record FROM sms_records WHERE id = ANY($1)")
            .bind(&ids)
            .fetch_all(&mut *tx)
            .await?;
        let bytes: Vec<Vec<u8>> = column(&rows, "record")?;
        bytes
            .iter()
            .map(|b| {
                envelope::decode(RecordKind::PendingRecord, b)
                    .map_err(|e| self.db.corrupt(format_args!("sms_records: {e}")))
            })
            .collect()
    }

    /// Units from `sms_units` rows, with their member records.
    async fn build_units(
        &self,
        tx: &mut PgConnection,
        rows: &[sqlx::postgres::PgRow],
    ) -> Result<Vec<ReadyUnit>, OpError> {
        let mut entries = Vec::with_capacity(rows.len());
        let mut all = Vec::new();
        for row in rows {
            let members = members_of(&row.try_get::<Vec<u8>, _>("members")?);
            all.extend(members.iter().copied());
            let disposition = match row.try_get::<i16, _>("disposition")? {
                1 => Disposition::Expired,
                _ => Disposition::Deliver,
            };
            entries.push((
                row.try_get::<i64, _>("seq")?,
                MessageId::from_uuid(row.try_get("id")?),
                disposition,
                members,
            ));
        }
        let records: HashMap<MessageId, PendingRecord> = self
            .records_tx(tx, &all)
            .await?
            .into_iter()
            .map(|r| (r.id, r))
            .collect();
        Ok(entries
            .into_iter()
            .map(|(seq, id, disposition, members)| ReadyUnit {
                seq: ReadySeq(u64::try_from(seq).unwrap_or(0)),
                unit: Unit {
                    id,
                    disposition,
                    parts: members.iter().filter_map(|m| records.get(m).cloned()).collect(),
                },
            })
            .collect())
    }
}

/// The stage's totals row.
struct Totals {
    records: i64,
    receipts: i64,
    units: i64,
    next_seq: i64,
}

#[async_trait]
impl PendingStore for PgPendingStore {
    fn capabilities(&self) -> PendingCapabilities {
        PendingCapabilities {
            stage: StageCapabilities::durable(Backend::Postgresql),
            blocking_writer: None,
        }
    }

    /// One transaction, committed before it returns.
    async fn commit(&self, admit: Vec<PendingRecord>, complete: &[UnitId]) -> Result<Vec<AdmitOutcome>, PendingError> {
        if admit.is_empty() && complete.is_empty() {
            return Ok(Vec::new());
        }
        let db = &self.db;
        db.may_write()?;
        let now = Timestamp::now();
        db.timed(async { in_transaction!(db, tx => self.commit_tx(tx, &admit, complete, now).await?) })
            .await
    }

    async fn ready_after(&self, after: ReadyCursor, limit: usize) -> Result<Vec<ReadyUnit>, PendingError> {
        let db = &self.db;
        // Per lane, the seq to read after: the lane's cursor, at least the lane's start.
        let after: Vec<i64> = (0..ReadySeq::LANES as u8)
            .map(|lane| {
                let from = after.lane(lane).0.max(ReadySeq::in_lane(lane, 0).0);
                i64::try_from(from).unwrap_or(i64::MAX)
            })
            .collect();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        db.timed(async {
            let r: Result<_, OpError> = async {
                let mut conn = db.pool.acquire().await?;
                // Units of this process's partitions that no process has selected: not
                // staged and not routed (the stages share the database).
                let partitions = db.selectable();
                let rows = if partitions.len() >= usize::from(self.partitions) {
                    sqlx::query(SELECT_READY)
                        .bind(&after)
                        .bind(limit)
                        .fetch_all(&mut *conn)
                        .await?
                } else {
                    sqlx::query(SELECT_READY_OF_PARTITIONS)
                        .bind(&after)
                        .bind(limit)
                        .bind(&*partitions)
                        .fetch_all(&mut *conn)
                        .await?
                };
                self.build_units(&mut conn, &rows).await
            }
            .await;
            db.done(r)
        })
        .await
    }

    async fn units(&self, ids: &[UnitId]) -> Result<Vec<ReadyUnit>, PendingError> {
        let db = &self.db;
        let wanted: Vec<Uuid> = ids.iter().map(MessageId::as_uuid).collect();
        db.timed(async {
            let r: Result<_, OpError> = async {
                let mut conn = db.pool.acquire().await?;
                let rows = sqlx::query("SELECT seq, id, disposition, members FROM sms_units WHERE id = ANY($1)")
                    .bind(&wanted)
                    .fetch_all(&mut *conn)
                    .await?;
                let mut units = self.build_units(&mut conn, &rows).await?;
                // In the order asked for.
                let order: HashMap<Uuid, usize> = wanted.iter().enumerate().map(|(i, id)| (*id, i)).collect();
                units.sort_by_key(|u| order.get(&u.unit.id.as_uuid()).copied().unwrap_or(usize::MAX));
                Ok(units)
            }
            .await;
            db.done(r)
        })
        .await
    }

    async fn expire_groups(&self, now: Timestamp, limit: usize) -> Result<usize, PendingError> {
        if limit == 0 {
            return Ok(0);
        }
        let db = &self.db;
        // Most calls find nothing due: answer from a read without locking the stage.
        let due = db
            .timed::<_, PendingError>(async {
                let r: Result<bool, OpError> = async {
                    let row = sqlx::query("SELECT EXISTS (SELECT 1 FROM sms_groups WHERE open AND deadline <= $1)")
                        .bind(ms(now))
                        .fetch_one(&db.pool)
                        .await?;
                    Ok(row.try_get::<bool, _>(0)?)
                }
                .await;
                db.done(r)
            })
            .await?;
        if !due {
            return Ok(0);
        }
        db.may_write()?;
        db.timed(async { in_transaction!(db, tx => self.expire_tx(tx, now, limit).await?) })
            .await
    }

    async fn stats(&self) -> Result<PendingStats, PendingError> {
        let db = &self.db;
        db.timed(async {
            let r: Result<PendingStats, OpError> = async {
                let row = sqlx::query(
                    "SELECT t.records, t.receipt_requests, t.units, \
                     (SELECT count(*) FROM sms_groups WHERE open) AS groups, \
                     (SELECT accepted_at FROM sms_records ORDER BY id LIMIT 1) AS oldest \
                     FROM sms_pending_totals t WHERE t.id = 1",
                )
                .fetch_one(&db.pool)
                .await?;
                let count = |name: &str| -> Result<u64, sqlx::Error> {
                    Ok(u64::try_from(row.try_get::<i64, _>(name)?).unwrap_or(0))
                };
                Ok(PendingStats {
                    records: count("records")?,
                    ready_units: count("units")?,
                    incomplete_groups: count("groups")?,
                    receipt_requests: count("receipt_requests")?,
                    oldest_accepted_at: row.try_get::<Option<i64>, _>("oldest")?.map(ts),
                })
            }
            .await;
            db.done(r)
        })
        .await
    }
}
