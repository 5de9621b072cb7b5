//! Expiry and stats: `expire` drops what is past retention, at most `limit` of each
//! kind per call (inbound deliveries die like receipts'; multipart groups are never
//! expired: past their deadline they are due and written by the caller), and folds the
//! counter deltas; `stats` reads the counters in one statement.
//!
//! Rows are picked with `FOR UPDATE SKIP LOCKED`, so `expire` never waits on the hot
//! path and never deletes a track a handoff or receipt is working on.

use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::records::ts;
use super::{OpError, PostgresDlrStore};
use crate::dlr::{DlrStats, ExpiryReport};

/// Counter deltas folded per `expire`.
const FOLD_BATCH: i64 = 100_000;

impl PostgresDlrStore {
    /// Two statements: lock the expired tracks first, then delete their correlations
    /// with a snapshot taken after the locks. Every write of a correlation pointing at
    /// a track happens under that track's lock, so the second statement sees all of
    /// them (one statement's snapshot could predate a handoff that committed just
    /// before the lock was taken, and leave its correlations behind).
    pub(super) async fn expire_tx(
        &self,
        conn: &mut PgConnection,
        now: i64,
        limit: i64,
    ) -> Result<ExpiryReport, OpError> {
        let rows = sqlx::query(
            "
SELECT unit, branch, resolved_at IS NULL AS unresolved FROM dlr_tracks
 WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED",
        )
        .bind(now)
        .bind(limit)
        .fetch_all(&mut *conn)
        .await?;
        let (mut units, mut branches) = (
            Vec::<Uuid>::with_capacity(rows.len()),
            Vec::<i32>::with_capacity(rows.len()),
        );
        let mut unresolved = 0u64;
        for row in &rows {
            units.push(row.try_get("unit")?);
            branches.push(row.try_get("branch")?);
            if row.try_get::<bool, _>("unresolved")? {
                unresolved += 1;
            }
        }
        let row = sqlx::query(
            "
WITH x AS (SELECT * FROM UNNEST($1::uuid[], $2::int4[]) AS x(unit, branch)),
gone_correlations AS (
    DELETE FROM dlr_correlations c USING x WHERE c.unit = x.unit AND c.branch = x.branch
), gone AS (
    DELETE FROM dlr_tracks t USING x WHERE t.unit = x.unit AND t.branch = x.branch
), dead AS (
    DELETE FROM dlr_deliveries WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM dlr_deliveries WHERE expires_at <= $3
         ORDER BY expires_at LIMIT $4 FOR UPDATE SKIP LOCKED))
    RETURNING 1
), orphans AS (
    DELETE FROM dlr_correlations WHERE unit IS NULL AND ctid = ANY(ARRAY(
        SELECT ctid FROM dlr_correlations WHERE unit IS NULL AND orphan_expires_at <= $3
         ORDER BY orphan_expires_at LIMIT $4 FOR UPDATE SKIP LOCKED))
    RETURNING 1
), folded AS (
    DELETE FROM dlr_counter_deltas WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM dlr_counter_deltas LIMIT $5 FOR UPDATE SKIP LOCKED))
    RETURNING *
), fold AS (
    UPDATE dlr_counters c
       SET awaiting = c.awaiting + s.awaiting, correlations = c.correlations + s.correlations,
           orphans = c.orphans + s.orphans, deliveries = c.deliveries + s.deliveries,
           inbound_parts = c.inbound_parts + s.inbound_parts
      FROM (SELECT COALESCE(sum(awaiting), 0) AS awaiting, COALESCE(sum(correlations), 0) AS correlations,
                   COALESCE(sum(orphans), 0) AS orphans, COALESCE(sum(deliveries), 0) AS deliveries,
                   COALESCE(sum(inbound_parts), 0) AS inbound_parts
              FROM folded) s
     WHERE c.id = 1
)
SELECT (SELECT count(*) FROM dead) AS dead, (SELECT count(*) FROM orphans) AS orphans",
        )
        .bind(units)
        .bind(branches)
        .bind(now)
        .bind(limit)
        .bind(FOLD_BATCH)
        .fetch_one(&mut *conn)
        .await?;
        let n = |c: &str| -> Result<u64, sqlx::Error> { Ok(u64::try_from(row.try_get::<i64, _>(c)?).unwrap_or(0)) };
        Ok(ExpiryReport {
            unresolved,
            dead_deliveries: n("dead")?,
            orphans: n("orphans")?,
        })
    }

    pub(super) async fn stats_op(&self) -> Result<DlrStats, OpError> {
        let row = sqlx::query(
            "
SELECT (c.awaiting + COALESCE(d.awaiting, 0))::int8 AS awaiting,
       (c.correlations + COALESCE(d.correlations, 0))::int8 AS correlations,
       (c.orphans + COALESCE(d.orphans, 0))::int8 AS orphans,
       (c.deliveries + COALESCE(d.deliveries, 0))::int8 AS deliveries,
       (c.inbound_parts + COALESCE(d.inbound_parts, 0))::int8 AS inbound_parts,
       (SELECT created_at FROM dlr_deliveries ORDER BY expires_at LIMIT 1) AS oldest
  FROM dlr_counters c,
       (SELECT sum(awaiting) AS awaiting, sum(correlations) AS correlations, sum(orphans) AS orphans,
               sum(deliveries) AS deliveries, sum(inbound_parts) AS inbound_parts FROM dlr_counter_deltas) d
 WHERE c.id = 1",
        )
        .fetch_one(&self.pool)
        .await?;
        let n = |c: &str| -> Result<u64, sqlx::Error> { Ok(u64::try_from(row.try_get::<i64, _>(c)?).unwrap_or(0)) };
        Ok(DlrStats {
            awaiting_receipts: n("awaiting")?,
            correlations: n("correlations")?,
            pending_deliveries: n("deliveries")?,
            // The delivery expiring first: the oldest while retention is unchanged
            // (read from the expiry index; no index on created_at just for this).
            oldest_pending_delivery: row.try_get::<Option<i64>, _>("oldest")?.map(ts),
            orphans: n("orphans")?,
            inbound_parts: n("inbound_parts")?,
        })
    }
}
