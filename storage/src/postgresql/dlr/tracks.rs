//! A branch's track row, the lock of its message: the state read under that lock, the
//! two batched statements that lock and write back tracks, and the budget of deliveries
//! a write-back may claim.
//!
//! Every transaction that changes what a branch is waiting for (handoffs, receipts)
//! locks the branch's `dlr_tracks` row first (a batch in (unit, branch) order), computes
//! the new state in Rust, and writes it back before commit; the write-back of a decided
//! branch resolves it and inserts its deliveries in the same statement.

use std::collections::HashMap;

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::records::{DELIVERED, plus};
use super::{OpError, PostgresDlrStore};
use crate::dlr::{ClaimCreated, Delivery};

pub(super) type TrackKey = (Uuid, i32);

#[derive(Clone, Debug)]
pub(super) struct Fail {
    pub(super) state: i16,
    pub(super) error: String,
    pub(super) done_at: i64,
}

#[derive(Clone, Debug)]
pub(super) struct TrackState {
    destination: String,
    pub(super) generation: i32,
    parts: i32,
    parts_done: i32,
    pub(super) fail: Option<Fail>,
    last_done_at: i64,
    pub(super) resolved: bool,
}

impl TrackState {
    pub(super) fn fresh(destination: &str, generation: i32, parts: i32) -> Self {
        Self {
            destination: destination.to_string(),
            generation,
            parts,
            parts_done: 0,
            fail: None,
            last_done_at: 0,
            resolved: false,
        }
    }

    /// Count one final part outcome of the current generation.
    pub(super) fn count(&mut self, state: i16, error: &str, done_at: i64) {
        self.parts_done += 1;
        self.last_done_at = self.last_done_at.max(done_at);
        if state != DELIVERED && self.fail.is_none() {
            self.fail = Some(Fail {
                state,
                error: error.to_string(),
                done_at,
            });
        }
    }

    /// Whether the message's state is known: the first final failure, or every part
    /// delivered.
    pub(super) fn decided(&self) -> bool {
        self.fail.is_some() || self.parts_done >= self.parts
    }

    pub(super) fn from_row(row: &PgRow) -> Result<Self, sqlx::Error> {
        let fail_state: Option<i16> = row.try_get("fail_state")?;
        let fail = match fail_state {
            Some(state) => Some(Fail {
                state,
                error: row.try_get::<Option<String>, _>("fail_error")?.unwrap_or_default(),
                done_at: row.try_get::<Option<i64>, _>("fail_done_at")?.unwrap_or(0),
            }),
            None => None,
        };
        Ok(Self {
            destination: row.try_get("destination")?,
            generation: row.try_get("gen")?,
            parts: row.try_get("parts")?,
            parts_done: row.try_get("parts_done")?,
            fail,
            last_done_at: row.try_get("last_done_at")?,
            resolved: row.try_get("resolved")?,
        })
    }
}

/// Tracks to write back, resolving some of them (which inserts their deliveries).
#[derive(Default)]
pub(super) struct TrackWrites {
    unit: Vec<Uuid>,
    branch: Vec<i32>,
    destination: Vec<String>,
    generation: Vec<i32>,
    parts: Vec<i32>,
    parts_done: Vec<i32>,
    fail_state: Vec<Option<i16>>,
    fail_error: Vec<Option<String>>,
    fail_done_at: Vec<Option<i64>>,
    last_done_at: Vec<i64>,
    resolve: Vec<bool>,
}

impl TrackWrites {
    pub(super) fn push(&mut self, key: TrackKey, s: &TrackState, resolve: bool) {
        self.unit.push(key.0);
        self.branch.push(key.1);
        self.destination.push(s.destination.clone());
        self.generation.push(s.generation);
        self.parts.push(s.parts);
        self.parts_done.push(s.parts_done);
        self.fail_state.push(s.fail.as_ref().map(|f| f.state));
        self.fail_error.push(s.fail.as_ref().map(|f| f.error.clone()));
        self.fail_done_at.push(s.fail.as_ref().map(|f| f.done_at));
        self.last_done_at.push(s.last_done_at);
        self.resolve.push(resolve);
    }

    fn is_empty(&self) -> bool {
        self.unit.is_empty()
    }
}

const LOCK_TRACKS_SQL: &str = "
SELECT unit, branch, destination, gen, parts, parts_done, fail_state, fail_error, fail_done_at,
       last_done_at, resolved_at IS NOT NULL AS resolved
  FROM dlr_tracks
 WHERE (unit, branch) IN (SELECT * FROM UNNEST($1::uuid[], $2::int4[]))
 ORDER BY unit, branch
   FOR NO KEY UPDATE";

/// Write tracks back; resolving ones get one delivery per receipt target (failure-only
/// targets skipped on success), in target order, in the same statement. The first `$14`
/// new deliveries are claimed for the caller as `claim_due` would (attempt 1, due and
/// leased until `$15`) and returned: that spares the claim statement, which rewrites
/// every index entry of the row, for the receipts a step resolves. The
/// `resolved_at IS NULL` guard makes a second resolution impossible even if a caller
/// got its state wrong.
const WRITE_TRACKS_SQL: &str = "
WITH x AS (
    SELECT * FROM UNNEST($1::uuid[], $2::int4[], $3::text[], $4::int4[], $5::int4[], $6::int4[],
                         $7::int2[], $8::text[], $9::int8[], $10::int8[], $11::bool[])
        AS x(unit, branch, destination, gen, parts, parts_done, fail_state, fail_error, fail_done_at,
             last_done_at, resolve)
), t AS (
    UPDATE dlr_tracks t
       SET destination = x.destination, gen = x.gen, parts = x.parts, parts_done = x.parts_done,
           fail_state = x.fail_state, fail_error = x.fail_error, fail_done_at = x.fail_done_at,
           last_done_at = x.last_done_at,
           resolved_at = CASE WHEN x.resolve THEN $12::int8 END
      FROM x
     WHERE t.unit = x.unit AND t.branch = x.branch AND t.resolved_at IS NULL
    RETURNING t.unit, t.branch, t.targets, x.resolve,
              COALESCE(x.fail_state, 2::int2) AS state,
              COALESCE(x.fail_error, '000') AS error,
              COALESCE(x.fail_done_at, x.last_done_at) AS done_at
), c AS (
    SELECT t.unit, t.branch, e.n, e.target, t.state, t.error, t.done_at,
           row_number() OVER (ORDER BY t.unit, t.branch, e.n) <= $14 AS claimed
      FROM t CROSS JOIN LATERAL jsonb_array_elements(t.targets) WITH ORDINALITY AS e(target, n)
     WHERE t.resolve AND NOT ((e.target->>'failure_only')::boolean AND t.state = 2)
), d AS (
    INSERT INTO dlr_deliveries (unit, branch, account, smpp, target, state, error, done_at, attempt, due_at,
                                lease_until, created_at, expires_at)
    SELECT c.unit, c.branch, c.target->>'account', c.target->>'reply' = 'smpp', c.target,
           c.state, c.error, c.done_at, c.claimed::int4,
           CASE WHEN c.claimed THEN $15::int8 ELSE $12::int8 END, CASE WHEN c.claimed THEN $15::int8 END,
           $12::int8, $13::int8
      FROM c
     ORDER BY c.unit, c.branch, c.n
    RETURNING id, attempt, target, state, error, done_at, created_at, expires_at
)
SELECT id, attempt, target::text AS target, state, error, done_at, NULL::text AS inbound,
       NULL::bytea AS inbound_payload, NULL::text AS progress, created_at, expires_at
  FROM d WHERE attempt = 1";

impl PostgresDlrStore {
    pub(super) async fn lock_tracks(
        conn: &mut PgConnection,
        keys: &[TrackKey],
    ) -> Result<HashMap<TrackKey, TrackState>, sqlx::Error> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let (units, branches): (Vec<Uuid>, Vec<i32>) = keys.iter().copied().unzip();
        let rows = sqlx::query(LOCK_TRACKS_SQL)
            .bind(units)
            .bind(branches)
            .fetch_all(conn)
            .await?;
        let mut out = HashMap::with_capacity(rows.len());
        for row in &rows {
            out.insert(
                (row.try_get("unit")?, row.try_get("branch")?),
                TrackState::from_row(row)?,
            );
        }
        Ok(out)
    }

    pub(super) async fn write_tracks(
        &self,
        conn: &mut PgConnection,
        w: TrackWrites,
        now: i64,
        claim: &mut ClaimBudget,
    ) -> Result<(), OpError> {
        if w.is_empty() {
            return Ok(());
        }
        let rows = sqlx::query(WRITE_TRACKS_SQL)
            .bind(w.unit)
            .bind(w.branch)
            .bind(w.destination)
            .bind(w.generation)
            .bind(w.parts)
            .bind(w.parts_done)
            .bind(w.fail_state)
            .bind(w.fail_error)
            .bind(w.fail_done_at)
            .bind(w.last_done_at)
            .bind(w.resolve)
            .bind(now)
            .bind(plus(now, self.retention.retention))
            .bind(claim.left)
            .bind(claim.lease_until)
            .fetch_all(conn)
            .await?;
        for row in &rows {
            claim.claimed.push(self.delivery_of(row)?);
        }
        claim.left = claim.left.saturating_sub(i64::try_from(rows.len()).unwrap_or(i64::MAX));
        Ok(())
    }
}

/// What a transaction may still claim of the deliveries it creates, and what it did.
pub(super) struct ClaimBudget {
    pub(super) left: i64,
    pub(super) lease_until: i64,
    pub(super) claimed: Vec<Delivery>,
}

impl ClaimBudget {
    /// Claim nothing (a plain `hand_off` or `record_receipts`).
    fn none() -> Self {
        Self {
            left: 0,
            lease_until: 0,
            claimed: Vec::new(),
        }
    }

    pub(super) fn of(claim: Option<ClaimCreated>, now: i64) -> Self {
        match claim {
            None => Self::none(),
            Some(c) => Self {
                left: i64::try_from(c.limit).unwrap_or(i64::MAX),
                lease_until: plus(now, c.lease),
                claimed: Vec::new(),
            },
        }
    }
}
