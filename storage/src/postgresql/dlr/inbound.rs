//! Inbound (MO) messages of a step, inside its transaction: multipart parts placed in
//! their groups (`dlr_inbound_groups`, `dlr_inbound_parts`), routed messages written as
//! deliveries, groups written or dropped; and the due groups.
//!
//! Placing parts reads a key's open group and writes it back, so two processes placing
//! parts of one key must not interleave: each step takes a transaction-level advisory
//! lock per key ([`INBOUND_LOCK_CLASS`], the key's hash), in hash order so two steps
//! never wait for each other in a cycle, then reads the open groups `FOR UPDATE` (a group
//! being written by another process is then either waited for and seen gone, or locked
//! before that process deletes it). Writing a group is a `DELETE … RETURNING`: of
//! concurrent writers of one group, exactly one gets the row back and creates the
//! delivery; its parts are deleted by the next statement, whose snapshot sees every part
//! committed before the group row was deleted, and the delivery carries those parts.

use std::collections::{BTreeMap, HashSet};

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};

use super::records::{INBOUND_LOCK_CLASS, StoredInbound, StoredTarget, group_lock, ms, plus, ts};
use super::tracks::ClaimBudget;
use super::{OpError, PostgresDlrStore};
use crate::dlr::ReplyPath;
use crate::ids::Timestamp;
use crate::inbound::{InboundGroup, InboundGroupKey, InboundPart, RoutedInbound, StepGroups};

/// The open groups of the step's keys with their parts, locked.
const LOAD_OPEN_SQL: &str = "
SELECT g.no, g.from_destination, g.source, g.destination, g.reference, g.total, g.deadline, g.closed,
       p.seq, p.deadline AS part_deadline, p.message::text AS message, p.payload
  FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int4[], $5::int4[]) AS x(f, s, d, r, t)
  JOIN dlr_inbound_groups g
    ON g.from_destination = x.f AND g.source = x.s AND g.destination = x.d AND g.reference = x.r
   AND g.total = x.t AND NOT g.closed
  JOIN dlr_inbound_parts p ON p.group_no = g.no
 ORDER BY g.no, p.seq
   FOR UPDATE OF g";

/// New groups and the step's new parts, in one statement.
const INSERT_SQL: &str = "
WITH g AS (
    INSERT INTO dlr_inbound_groups (no, from_destination, source, destination, reference, total, deadline,
                                    closed, due_at)
    SELECT * FROM UNNEST($1::int8[], $2::text[], $3::text[], $4::text[], $5::int4[], $6::int4[], $7::int8[],
                         $8::bool[], $9::int8[])
), p AS (
    INSERT INTO dlr_inbound_parts (group_no, seq, deadline, message, payload)
    SELECT x.g, x.q, x.d, x.m::jsonb, x.p
      FROM UNNEST($10::int8[], $11::int4[], $12::int8[], $13::text[], $14::bytea[]) AS x(g, q, d, m, p)
)
SELECT 1";

/// The routed inbound messages' deliveries; the first `$8` claimed for the caller.
const INSERT_DELIVERIES_SQL: &str = "
WITH d AS (
    INSERT INTO dlr_deliveries (account, smpp, target, inbound, inbound_payload, attempt, due_at, lease_until,
                                created_at, expires_at)
    SELECT x.a, x.s, x.t::jsonb, x.m::jsonb, x.p, (x.n <= $6)::int4,
           CASE WHEN x.n <= $6 THEN $7::int8 ELSE $8::int8 END, CASE WHEN x.n <= $6 THEN $7::int8 END,
           $8::int8, $9::int8
      FROM UNNEST($1::text[], $2::bool[], $3::text[], $4::text[], $5::bytea[]) WITH ORDINALITY AS x(a, s, t, m, p, n)
     ORDER BY x.n
    RETURNING id, attempt, target, state, error, done_at, inbound, inbound_payload, created_at, expires_at
)
SELECT id, attempt, target::text AS target, state, error, done_at, inbound::text AS inbound, inbound_payload,
       NULL::text AS progress, created_at, expires_at
  FROM d WHERE attempt = 1";

/// A group without its parts, from a row of `no, from_destination, source,
/// destination, reference, total, deadline, closed`.
fn header_of(store: &PostgresDlrStore, row: &PgRow) -> Result<InboundGroup, OpError> {
    let no = u64::try_from(row.try_get::<i64, _>("no")?).unwrap_or(0);
    let int = |c: &str| -> Result<i32, OpError> { Ok(row.try_get::<i32, _>(c)?) };
    let key = InboundGroupKey {
        from_destination: row.try_get("from_destination")?,
        source: row.try_get("source")?,
        destination: row.try_get("destination")?,
        reference: u16::try_from(int("reference")?)
            .map_err(|_| store.corrupt(format_args!("an inbound group's reference")))?,
        total: u8::try_from(int("total")?).map_err(|_| store.corrupt(format_args!("an inbound group's part count")))?,
    };
    Ok(InboundGroup {
        no,
        key,
        deadline: ts(row.try_get("deadline")?),
        closed: row.try_get("closed")?,
        parts: Vec::new(),
    })
}

/// A part of `group`, from a row of `seq, part_deadline, message, payload`.
fn part_of(store: &PostgresDlrStore, row: &PgRow, group: &InboundGroup) -> Result<InboundPart, OpError> {
    let seq = u8::try_from(row.try_get::<i32, _>("seq")?)
        .map_err(|_| store.corrupt(format_args!("an inbound group part's position")))?;
    let json: String = row.try_get("message")?;
    let message = StoredInbound::decode(&json, row.try_get("payload")?).map_err(|(kind, detail)| {
        OpError::Failure(store.loc.failure(kind, format_args!("an inbound group part: {detail}")))
    })?;
    Ok(InboundPart {
        key: group.key.clone(),
        seq,
        deadline: ts(row.try_get("part_deadline")?),
        message,
    })
}

/// Groups with their parts, from rows of a group joined with its parts (the columns of
/// [`header_of`] and [`part_of`]), ordered by group then position.
fn groups_of(store: &PostgresDlrStore, rows: &[PgRow]) -> Result<Vec<InboundGroup>, OpError> {
    let mut out: Vec<InboundGroup> = Vec::new();
    for row in rows {
        let no = u64::try_from(row.try_get::<i64, _>("no")?).unwrap_or(0);
        if out.last().is_none_or(|g| g.no != no) {
            out.push(header_of(store, row)?);
        }
        if let Some(group) = out.last_mut() {
            let part = part_of(store, row, group)?;
            group.parts.push(part);
        }
    }
    Ok(out)
}

fn json_err(store: &PostgresDlrStore, e: serde_json::Error) -> OpError {
    store.corrupt(format_args!("inbound message: {e}"))
}

impl PostgresDlrStore {
    /// The inbound part of a step: parts, then routed messages, then dropped groups.
    /// Returns the groups the parts made complete or closed, as stored after the step.
    pub(super) async fn inbound_tx(
        &self,
        conn: &mut PgConnection,
        parts: &[InboundPart],
        messages: &[RoutedInbound],
        dropped: &[u64],
        now: i64,
        claim: &mut ClaimBudget,
    ) -> Result<Vec<InboundGroup>, OpError> {
        let mut ready = self.place_parts_tx(conn, parts).await?;
        let removed = self.write_groups_tx(conn, messages, dropped, now, claim).await?;
        ready.retain(|g| !removed.contains(&g.no));
        Ok(ready)
    }

    async fn place_parts_tx(
        &self,
        conn: &mut PgConnection,
        parts: &[InboundPart],
    ) -> Result<Vec<InboundGroup>, OpError> {
        if parts.is_empty() {
            return Ok(Vec::new());
        }
        let mut keys: Vec<&InboundGroupKey> = parts.iter().map(|p| &p.key).collect();
        keys.sort_unstable();
        keys.dedup();
        let mut locks: Vec<i32> = keys.iter().map(|k| group_lock(k)).collect();
        locks.sort_unstable();
        locks.dedup();
        sqlx::query("SELECT pg_advisory_xact_lock($1, k) FROM (SELECT k FROM UNNEST($2::int4[]) AS k ORDER BY k) s")
            .bind(INBOUND_LOCK_CLASS)
            .bind(locks)
            .execute(&mut *conn)
            .await?;

        let rows = sqlx::query(LOAD_OPEN_SQL)
            .bind(keys.iter().map(|k| k.from_destination.clone()).collect::<Vec<_>>())
            .bind(keys.iter().map(|k| k.source.clone()).collect::<Vec<_>>())
            .bind(keys.iter().map(|k| k.destination.clone()).collect::<Vec<_>>())
            .bind(keys.iter().map(|k| i32::from(k.reference)).collect::<Vec<_>>())
            .bind(keys.iter().map(|k| i32::from(k.total)).collect::<Vec<_>>())
            .fetch_all(&mut *conn)
            .await?;
        let mut step = StepGroups::new(groups_of(self, &rows)?);
        for part in parts {
            step.place(part.clone());
        }

        let opened = step.opened();
        if opened > 0 {
            let nos: Vec<i64> =
                sqlx::query_scalar("SELECT nextval('dlr_inbound_group_no') FROM generate_series(1, $1)")
                    .bind(i64::try_from(opened).unwrap_or(i64::MAX))
                    .fetch_all(&mut *conn)
                    .await?;
            if nos.len() != opened {
                return Err(self.corrupt("the group number sequence answered short"));
            }
            let mut nos = nos.into_iter();
            step.number(|| nos.next().and_then(|n| u64::try_from(n).ok()).unwrap_or(0));
        }

        let touched = step.into_touched();
        // Loaded groups first (one closed here frees its key for a group opened next).
        let (mut u_no, mut u_closed, mut u_due) = (Vec::new(), Vec::new(), Vec::new());
        let mut g = (
            Vec::<i64>::new(),
            Vec::<String>::new(),
            Vec::<String>::new(),
            Vec::<String>::new(),
            Vec::<i32>::new(),
            Vec::<i32>::new(),
            Vec::<i64>::new(),
            Vec::<bool>::new(),
            Vec::<i64>::new(),
        );
        let mut p = (
            Vec::<i64>::new(),
            Vec::<i32>::new(),
            Vec::<i64>::new(),
            Vec::<String>::new(),
            Vec::<Vec<u8>>::new(),
        );
        let mut ready = Vec::new();
        for t in touched.iter().filter(|t| t.changed()) {
            let no = i64::try_from(t.group.no).unwrap_or(i64::MAX);
            if t.opened {
                g.0.push(no);
                g.1.push(t.group.key.from_destination.clone());
                g.2.push(t.group.key.source.clone());
                g.3.push(t.group.key.destination.clone());
                g.4.push(i32::from(t.group.key.reference));
                g.5.push(i32::from(t.group.key.total));
                g.6.push(ms(t.group.deadline));
                g.7.push(t.group.closed);
                g.8.push(ms(t.group.due_at()));
            } else if t.due_before != Some(t.group.due_at()) || t.closed_now {
                u_no.push(no);
                u_closed.push(t.group.closed);
                u_due.push(ms(t.group.due_at()));
            }
            for part in t.added_parts() {
                p.0.push(no);
                p.1.push(i32::from(part.seq));
                p.2.push(ms(part.deadline));
                p.3.push(StoredInbound::json(&part.message).map_err(|e| json_err(self, e))?);
                p.4.push(part.message.payload.clone());
            }
            if t.ready() {
                ready.push(t.group.clone());
            }
        }
        if !u_no.is_empty() {
            sqlx::query(
                "
UPDATE dlr_inbound_groups g SET closed = x.c, due_at = x.d
  FROM UNNEST($1::int8[], $2::bool[], $3::int8[]) AS x(no, c, d)
 WHERE g.no = x.no",
            )
            .bind(u_no)
            .bind(u_closed)
            .bind(u_due)
            .execute(&mut *conn)
            .await?;
        }
        if !g.0.is_empty() || !p.0.is_empty() {
            sqlx::query(INSERT_SQL)
                .bind(g.0)
                .bind(g.1)
                .bind(g.2)
                .bind(g.3)
                .bind(g.4)
                .bind(g.5)
                .bind(g.6)
                .bind(g.7)
                .bind(g.8)
                .bind(p.0)
                .bind(p.1)
                .bind(p.2)
                .bind(p.3)
                .bind(p.4)
                .execute(&mut *conn)
                .await?;
        }
        Ok(ready)
    }

    /// Routed messages as deliveries (a group's only if this transaction removed the
    /// group), and dropped groups removed. Returns the numbers of the groups removed.
    async fn write_groups_tx(
        &self,
        conn: &mut PgConnection,
        messages: &[RoutedInbound],
        dropped: &[u64],
        now: i64,
        claim: &mut ClaimBudget,
    ) -> Result<HashSet<u64>, OpError> {
        let mut nos: Vec<i64> = messages
            .iter()
            .filter_map(|m| m.group)
            .chain(dropped.iter().copied())
            .filter_map(|no| i64::try_from(no).ok())
            .collect();
        nos.sort_unstable();
        nos.dedup();
        let mut removed: BTreeMap<u64, InboundGroup> = BTreeMap::new();
        if !nos.is_empty() {
            let rows = sqlx::query(
                "
DELETE FROM dlr_inbound_groups
 WHERE no = ANY(ARRAY(SELECT no FROM dlr_inbound_groups WHERE no = ANY($1) ORDER BY no FOR UPDATE))
RETURNING no, from_destination, source, destination, reference, total, deadline, closed",
            )
            .bind(&nos)
            .fetch_all(&mut *conn)
            .await?;
            for row in &rows {
                let group = header_of(self, row)?;
                removed.insert(group.no, group);
            }
        }
        if !removed.is_empty() {
            // A statement of its own: its snapshot is taken after the groups' rows were
            // deleted, so it sees every part committed before that.
            let gone: Vec<i64> = removed.keys().filter_map(|no| i64::try_from(*no).ok()).collect();
            let rows = sqlx::query(
                "
DELETE FROM dlr_inbound_parts WHERE group_no = ANY($1)
RETURNING group_no, seq, deadline AS part_deadline, message::text AS message, payload",
            )
            .bind(gone)
            .fetch_all(&mut *conn)
            .await?;
            for row in &rows {
                let no = u64::try_from(row.try_get::<i64, _>("group_no")?).unwrap_or(0);
                if let Some(group) = removed.get_mut(&no) {
                    let part = part_of(self, row, group)?;
                    group.parts.push(part);
                }
            }
            for group in removed.values_mut() {
                group.parts.sort_by_key(|p| p.seq);
            }
        }

        let (mut a, mut s, mut t, mut m, mut p) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut used: HashSet<u64> = HashSet::new();
        for r in messages {
            let message = match r.group {
                Some(no) => match removed.get(&no) {
                    Some(g) if used.insert(no) => g.deliver_as(r.message.clone()),
                    _ => continue,
                },
                None => r.message.clone(),
            };
            let target = r.target();
            a.push(target.account.clone());
            s.push(target.reply == ReplyPath::Smpp);
            t.push(serde_json::to_string(&StoredTarget::of(&target)).map_err(|e| json_err(self, e))?);
            m.push(StoredInbound::json(&message).map_err(|e| json_err(self, e))?);
            p.push(message.payload);
        }
        if !a.is_empty() {
            let rows = sqlx::query(INSERT_DELIVERIES_SQL)
                .bind(a)
                .bind(s)
                .bind(t)
                .bind(m)
                .bind(p)
                .bind(claim.left)
                .bind(claim.lease_until)
                .bind(now)
                .bind(plus(now, self.retention.retention))
                .fetch_all(&mut *conn)
                .await?;
            for row in &rows {
                claim.claimed.push(self.delivery_of(row)?);
            }
            claim.left = claim.left.saturating_sub(i64::try_from(rows.len()).unwrap_or(i64::MAX));
        }
        Ok(removed.into_keys().collect())
    }

    /// Complete and closed groups (due at 0), then those past their deadline, through
    /// the `(due_at, no)` index; one statement.
    pub(super) async fn due_inbound_groups_op(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<InboundGroup>, OpError> {
        let rows = sqlx::query(
            "
SELECT g.no, g.from_destination, g.source, g.destination, g.reference, g.total, g.deadline, g.closed,
       p.seq, p.deadline AS part_deadline, p.message::text AS message, p.payload
  FROM (SELECT * FROM dlr_inbound_groups WHERE due_at <= $1 ORDER BY due_at, no LIMIT $2) g
  JOIN dlr_inbound_parts p ON p.group_no = g.no
 ORDER BY g.due_at, g.no, p.seq",
        )
        .bind(ms(now))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await?;
        groups_of(self, &rows)
    }
}
