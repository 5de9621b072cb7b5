//! The relay's side of a PostgreSQL outbox table: take a partition's due rows inside a
//! short transaction holding that partition's advisory lock, and settle them in the same
//! transaction once the caller has admitted them.
//!
//! A row is inserted once by the application and deleted once here (or marked
//! `relayed`, when the source keeps processed rows for a while): no claim step, no
//! lease. The lock is transaction-level, so a relay that dies — process, node or
//! connection — releases it with its transaction, and rows it read but did not settle
//! are simply read again by whoever takes the partition next. That re-read is why the
//! caller admits with the row's `event_id` as the idempotency key: a row relayed twice
//! is admitted once.

use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::{PgPool, Postgres, Row, Transaction};
use uuid::Uuid;

use crate::publish::OutboxMessage;
use crate::schema::TableName;

/// How a source is relayed.
#[derive(Clone, Debug)]
pub struct RelaySettings {
    pub table: TableName,
    /// Parallel delivery lanes: partition `p` takes the rows whose lane ≡ p (mod this).
    pub partitions: u16,
    /// Rows taken per delivery at most.
    pub batch_size: u32,
    /// How long admitted rows are kept (`relayed`); zero deletes them at once.
    pub retention: Duration,
    /// Permanent refusals before a row is dead.
    pub max_attempts: u32,
}

/// A committed outbox row, as the relay reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxRow {
    pub id: i64,
    pub event_id: Uuid,
    /// The message columns (`event_id` among them).
    pub message: OutboxMessage,
    /// Attempts before this one.
    pub attempts: u32,
}

/// What became of one row of a delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowOutcome {
    /// Admitted (or found admitted before, by its event id): done.
    Admitted,
    /// Not admitted for a reason that passes (pipeline full, a store failing): read it
    /// again after `after`, without counting an attempt.
    Retry { error: String, after: Duration },
    /// Refused for what the row says (unknown account, invalid number, empty body):
    /// one attempt more, then dead at the source's `max_attempts`; until then read
    /// again after `after`.
    Refused { error: String, after: Duration },
    /// Not tried in this delivery (an earlier row of its group was not admitted): left
    /// as it was.
    Skipped,
}

/// What a settled delivery changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    pub admitted: u64,
    pub retried: u64,
    pub dead: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("outbox table {table}: {source}")]
    Database {
        table: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("outbox table {table}: outcome for row {id}, which this delivery did not read")]
    UnknownRow { table: String, id: i64 },
}

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
}

/// A partition's delivery: its rows, read in `id` order inside the transaction that
/// holds the partition's lock until [`Delivery::settle`] (or drop, which rolls back).
pub struct Delivery<'r> {
    relay: &'r PgRelay,
    tx: Transaction<'static, Postgres>,
    rows: Vec<OutboxRow>,
}

impl PgRelay {
    pub fn new(pool: PgPool, settings: RelaySettings) -> Self {
        let t = settings.table.as_str();
        Self {
            // Due rows of the partition's lanes in relay order, skipping a group's rows
            // while an earlier row of the group waits for its retry.
            take: format!(
                "SELECT id, event_id, account, source_addr, destination_addr, body, callback_url, group_key, attempts \
                   FROM {t} o \
                  WHERE status = 'pending' AND lane % $1 = $2 \
                    AND (next_attempt_at IS NULL OR next_attempt_at <= now()) \
                    AND (group_key IS NULL OR NOT EXISTS ( \
                         SELECT 1 FROM {t} e \
                          WHERE e.status = 'pending' AND e.group_key = o.group_key AND e.id < o.id \
                            AND e.next_attempt_at > now() OFFSET 0)) \
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
    pub async fn begin(&self, partition: u16) -> Result<Option<Delivery<'_>>, RelayError> {
        let mut tx = self.pool.begin().await.map_err(|e| self.err(e))?;
        let locked: bool = sqlx::query("SELECT pg_try_advisory_xact_lock(hashtext($1), $2) AS locked")
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
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
        let rows = rows
            .iter()
            .map(row_of)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))?;
        Ok(Some(Delivery { relay: self, tx, rows }))
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
}

fn row_of(r: &PgRow) -> Result<OutboxRow, sqlx::Error> {
    let event_id: Uuid = r.try_get("event_id")?;
    Ok(OutboxRow {
        id: r.try_get("id")?,
        event_id,
        message: OutboxMessage {
            event_id: Some(event_id),
            account: r.try_get("account")?,
            source_addr: r.try_get("source_addr")?,
            destination_addr: r.try_get("destination_addr")?,
            body: r.try_get("body")?,
            callback_url: r.try_get("callback_url")?,
            group_key: r.try_get("group_key")?,
        },
        attempts: u32::try_from(r.try_get::<i32, _>("attempts")?).unwrap_or(0),
    })
}

impl Delivery<'_> {
    /// The partition's due rows, in relay order.
    pub fn rows(&self) -> &[OutboxRow] {
        &self.rows
    }

    /// Record each row's outcome and commit, releasing the partition. Call it only
    /// once the admissions are durable: a row settled `Admitted` is not read again.
    pub async fn settle(mut self, outcomes: &[(i64, RowOutcome)]) -> Result<Settled, RelayError> {
        let relay = self.relay;
        let mut done = Vec::new();
        let (mut retry_ids, mut retry_errors, mut retry_after) = (Vec::new(), Vec::new(), Vec::new());
        let (mut refused_ids, mut refused_errors, mut refused_after) = (Vec::new(), Vec::new(), Vec::new());
        for (id, outcome) in outcomes {
            if !self.rows.iter().any(|r| r.id == *id) {
                return Err(RelayError::UnknownRow {
                    table: relay.settings.table.to_string(),
                    id: *id,
                });
            }
            match outcome {
                RowOutcome::Admitted => done.push(*id),
                RowOutcome::Retry { error, after } => {
                    retry_ids.push(*id);
                    retry_errors.push(error.clone());
                    retry_after.push(after.as_secs_f64());
                }
                RowOutcome::Refused { error, after } => {
                    refused_ids.push(*id);
                    refused_errors.push(error.clone());
                    refused_after.push(after.as_secs_f64());
                }
                RowOutcome::Skipped => {}
            }
        }
        let mut settled = Settled::default();
        if !done.is_empty() {
            let sql = if relay.settings.retention.is_zero() {
                &relay.delete
            } else {
                &relay.keep
            };
            settled.admitted = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .bind(&done)
                .execute(&mut *self.tx)
                .await
                .map_err(|e| relay.err(e))?
                .rows_affected();
        }
        if !retry_ids.is_empty() {
            settled.retried += sqlx::query(sqlx::AssertSqlSafe(relay.retry.clone()))
                .bind(&retry_ids)
                .bind(&retry_errors)
                .bind(&retry_after)
                .execute(&mut *self.tx)
                .await
                .map_err(|e| relay.err(e))?
                .rows_affected();
        }
        if !refused_ids.is_empty() {
            let rows = sqlx::query(sqlx::AssertSqlSafe(relay.refuse.clone()))
                .bind(&refused_ids)
                .bind(&refused_errors)
                .bind(&refused_after)
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
