//! A PostgreSQL outbox table: a partition's due rows read inside a short transaction
//! holding that partition's advisory lock, and settled in the same transaction once the
//! caller has admitted them.
//!
//! The lock is transaction-level, so a relay that dies — process, node or connection —
//! releases it with its transaction (no lease to expire), and it works behind a
//! transaction-pooling PgBouncer. A busy partition holds one connection for the length
//! of a delivery: the pool has one per partition, one the listener keeps, and one for
//! the backlog count and retention sweep.

use std::time::Duration;

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions, PgRow};
use sqlx::{PgPool, Postgres, Row, Transaction};
use uuid::Uuid;

use super::{DeadRow, OutboxRow, Plan, RelayError, RelaySettings, RowOutcome, Settled, SourceStats, row};
use crate::publish::OutboxMessage;

/// Longest wait for a pooled connection: a source whose database is down fails a
/// delivery after this, and is tried again.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// One source table's relay queries.
#[derive(Clone, Debug)]
pub struct PgRelay {
    pool: PgPool,
    settings: RelaySettings,
    take: String,
    delete: String,
    keep: String,
    retry: String,
    refuse: String,
    forget: String,
    stats: String,
    dead: String,
    revive: String,
}

/// A partition's delivery: its rows, read in `id` order inside the transaction that
/// holds the partition's lock until [`Delivery::settle`] (or drop, which rolls back).
pub struct PgDelivery<'r> {
    relay: &'r PgRelay,
    tx: Transaction<'static, Postgres>,
    rows: Vec<OutboxRow>,
}

impl PgRelay {
    /// A relay for the source at `url`, connecting when first used.
    pub fn open(url: &str, settings: RelaySettings) -> Result<Self, RelayError> {
        let options = PgConnectOptions::from_str(url).map_err(|source| RelayError::Database {
            table: settings.table.to_string(),
            source,
        })?;
        let pool = PgPoolOptions::new()
            .max_connections(u32::from(settings.partitions.max(1)) + 2)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_lazy_with(options);
        Ok(Self::new(pool, settings))
    }

    pub fn new(pool: PgPool, settings: RelaySettings) -> Self {
        let t = settings.table.as_str();
        Self {
            // Due rows of the partition's lanes in relay order after id $4, skipping a
            // group's rows while an earlier row of the group waits for its retry, or lies
            // before $4 unread (it committed after later rows of other groups were
            // read: the next read from the start relays it, and the group after it).
            take: format!(
                "SELECT id, event_id, account, source_addr, destination_addr, body, callback_url, group_key, attempts, \
                        extract(epoch FROM clock_timestamp() - created_at)::float8 AS age \
                   FROM {t} o \
                  WHERE status = 'pending' AND lane % $1 = $2 AND id > $4 \
                    AND (next_attempt_at IS NULL OR next_attempt_at <= now()) \
                    AND (group_key IS NULL OR NOT EXISTS ( \
                         SELECT 1 FROM {t} e \
                          WHERE e.status = 'pending' AND e.group_key = o.group_key AND e.id < o.id \
                            AND (e.next_attempt_at > now() OR e.id <= $4) OFFSET 0)) \
                  ORDER BY id LIMIT $3"
            ),
            delete: format!("DELETE FROM {t} WHERE id = ANY($1) AND status = 'pending'"),
            keep: format!(
                "UPDATE {t} SET status = 'relayed', relayed_at = now(), last_error = NULL \
                  WHERE id = ANY($1) AND status = 'pending'"
            ),
            retry: format!(
                "UPDATE {t} o SET next_attempt_at = now() + make_interval(secs => r.after), last_error = r.error \
                   FROM UNNEST($1::int8[], $2::text[], $3::float8[]) AS r(id, error, after) \
                  WHERE o.id = ANY($1) AND o.id = r.id AND o.status = 'pending'"
            ),
            refuse: format!(
                "UPDATE {t} o SET attempts = o.attempts + 1, last_error = r.error, \
                        status = CASE WHEN o.attempts + 1 >= $4 THEN 'dead' ELSE 'pending' END, \
                        next_attempt_at = CASE WHEN o.attempts + 1 >= $4 THEN NULL \
                                               ELSE now() + make_interval(secs => r.after) END \
                   FROM UNNEST($1::int8[], $2::text[], $3::float8[]) AS r(id, error, after) \
                  WHERE o.id = ANY($1) AND o.id = r.id AND o.status = 'pending' \
                 RETURNING o.status = 'dead' AS dead"
            ),
            forget: format!(
                "DELETE FROM {t} WHERE id = ANY(ARRAY( \
                   SELECT id FROM {t} WHERE status = 'relayed' AND relayed_at < now() - make_interval(secs => $1) \
                    LIMIT $2))"
            ),
            stats: format!(
                "SELECT (SELECT count(*) FROM {t} WHERE status = 'pending') AS backlog, \
                        (SELECT extract(epoch FROM now() - created_at)::float8 FROM {t} \
                          WHERE status = 'pending' ORDER BY id LIMIT 1) AS oldest, \
                        (SELECT count(*) FROM {t} WHERE status = 'dead') AS dead"
            ),
            dead: format!(
                "SELECT id, event_id::text AS event_id, account, group_key, attempts::int8 AS attempts, last_error, \
                        to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') AS created_at \
                   FROM {t} WHERE status = 'dead' ORDER BY id LIMIT $1"
            ),
            revive: format!(
                "UPDATE {t} SET status = 'pending', attempts = 0, next_attempt_at = NULL \
                  WHERE status = 'dead' AND ($1::text IS NULL OR event_id::text = $1)"
            ),
            pool,
            settings,
        }
    }

    pub fn settings(&self) -> &RelaySettings {
        &self.settings
    }

    fn err(&self, source: sqlx::Error) -> RelayError {
        RelayError::Database {
            table: self.settings.table.to_string(),
            source,
        }
    }

    /// Begin a delivery of `partition`: `None` when another relay holds it now.
    pub async fn begin(&self, partition: u16) -> Result<Option<PgDelivery<'_>>, RelayError> {
        self.begin_after(partition, 0).await
    }

    /// [`PgRelay::begin`] reading only rows after id `after` (see
    /// [`super::OutboxSource::begin_after`]).
    pub async fn begin_after(&self, partition: u16, after: i64) -> Result<Option<PgDelivery<'_>>, RelayError> {
        let mut tx = self.pool.begin().await.map_err(|e| self.err(e))?;
        // The settlement commits without waiting for its WAL flush: one lost with the
        // database's crash leaves its rows to be relayed again, and their event ids make
        // that a duplicate. So a delivery's cycle does not wait for the disk.
        let locked: bool = sqlx::query(
            "SELECT set_config('synchronous_commit', 'off', true) IS NOT NULL \
                    AND pg_try_advisory_xact_lock(hashtext($1), $2) AS locked",
        )
        .bind(format!("sendium-outbox:{}", self.settings.table))
        .bind(i32::from(partition))
        .fetch_one(&mut *tx)
        .await
        .and_then(|r| r.try_get("locked"))
        .map_err(|e| self.err(e))?;
        if !locked {
            return Ok(None);
        }
        let rows = sqlx::query(sqlx::AssertSqlSafe(self.take.clone()))
            .bind(i32::from(self.settings.partitions.max(1)))
            .bind(i32::from(partition))
            .bind(i64::from(self.settings.batch_size.max(1)))
            .bind(after)
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
        let rows = rows
            .iter()
            .map(row_of)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))?;
        Ok(Some(PgDelivery { relay: self, tx, rows }))
    }

    /// Delete rows kept past the source's retention, at most `limit`.
    pub async fn forget_relayed(&self, limit: i64) -> Result<u64, RelayError> {
        if self.settings.retention.is_zero() {
            return Ok(0);
        }
        sqlx::query(sqlx::AssertSqlSafe(self.forget.clone()))
            .bind(self.settings.retention.as_secs_f64())
            .bind(limit)
            .execute(&self.pool)
            .await
            .map(|r| r.rows_affected())
            .map_err(|e| self.err(e))
    }

    pub async fn stats(&self) -> Result<SourceStats, RelayError> {
        let r = sqlx::query(sqlx::AssertSqlSafe(self.stats.clone()))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        super::stats_of(&r).map_err(|e| self.err(e))
    }

    pub async fn dead(&self, limit: i64) -> Result<Vec<DeadRow>, RelayError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(self.dead.clone()))
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        rows.iter()
            .map(super::dead_row_of)
            .collect::<Result<_, sqlx::Error>>()
            .map_err(|e| self.err(e))
    }

    pub async fn retry_dead(&self, event_id: Option<&str>) -> Result<u64, RelayError> {
        sqlx::query(sqlx::AssertSqlSafe(self.revive.clone()))
            .bind(event_id)
            .execute(&self.pool)
            .await
            .map(|r| r.rows_affected())
            .map_err(|e| self.err(e))
    }

    /// A connection listening on the table's channel, which the schema's trigger
    /// notifies when a transaction that inserted rows commits.
    pub async fn listen(&self) -> Result<PgListener, RelayError> {
        let mut listener = PgListener::connect_with(&self.pool).await.map_err(|e| self.err(e))?;
        listener
            .listen(self.settings.table.as_str())
            .await
            .map_err(|e| self.err(e))?;
        Ok(listener)
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

fn row_of(r: &PgRow) -> Result<OutboxRow, sqlx::Error> {
    let event_id: Uuid = r.try_get("event_id")?;
    Ok(row(
        r.try_get("id")?,
        event_id,
        OutboxMessage {
            event_id: Some(event_id),
            account: r.try_get("account")?,
            source_addr: r.try_get("source_addr")?,
            destination_addr: r.try_get("destination_addr")?,
            body: r.try_get("body")?,
            callback_url: r.try_get("callback_url")?,
            group_key: r.try_get("group_key")?,
        },
        i64::from(r.try_get::<i32, _>("attempts")?),
        r.try_get("age")?,
    ))
}

impl PgDelivery<'_> {
    /// Give the delivery up without settling anything: its rows stay as they were, and
    /// the partition is free at once (a dropped delivery rolls back too, but only when
    /// its connection is next used or returned).
    pub async fn abandon(self) -> Result<(), RelayError> {
        let relay = self.relay;
        self.tx.rollback().await.map_err(|e| relay.err(e))
    }

    /// The partition's due rows, in relay order.
    pub fn rows(&self) -> &[OutboxRow] {
        &self.rows
    }

    /// Record each row's outcome and commit, releasing the partition. Call it only
    /// once the admissions are durable: a row settled `Admitted` is not read again.
    pub async fn settle(mut self, outcomes: &[(i64, RowOutcome)]) -> Result<Settled, RelayError> {
        let relay = self.relay;
        let plan = Plan::of(&relay.settings.table, &self.rows, outcomes)?;
        let mut settled = Settled::default();
        if !plan.admitted.is_empty() {
            let sql = if relay.settings.retention.is_zero() {
                &relay.delete
            } else {
                &relay.keep
            };
            settled.admitted = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .bind(&plan.admitted)
                .execute(&mut *self.tx)
                .await
                .map_err(|e| relay.err(e))?
                .rows_affected();
        }
        if !plan.retry.ids.is_empty() {
            settled.retried += sqlx::query(sqlx::AssertSqlSafe(relay.retry.clone()))
                .bind(&plan.retry.ids)
                .bind(&plan.retry.errors)
                .bind(&plan.retry.after)
                .execute(&mut *self.tx)
                .await
                .map_err(|e| relay.err(e))?
                .rows_affected();
        }
        if !plan.refused.ids.is_empty() {
            let rows = sqlx::query(sqlx::AssertSqlSafe(relay.refuse.clone()))
                .bind(&plan.refused.ids)
                .bind(&plan.refused.errors)
                .bind(&plan.refused.after)
                .bind(i32::try_from(relay.settings.max_attempts.max(1)).unwrap_or(i32::MAX))
                .fetch_all(&mut *self.tx)
                .await
                .map_err(|e| relay.err(e))?;
            for r in &rows {
                if r.try_get::<bool, _>("dead").map_err(|e| relay.err(e))? {
                    settled.dead += 1;
                } else {
                    settled.retried += 1;
                }
            }
        }
        self.tx.commit().await.map_err(|e| relay.err(e))?;
        Ok(settled)
    }
}
