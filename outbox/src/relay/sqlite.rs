//! A SQLite outbox table (one node). SQLite has one writer at a time, so a delivery
//! holds no transaction while Sendium admits its rows: the batch is read in autocommit,
//! admitted, and settled in one short write transaction. Holding the write lock across
//! an admission would stall every writer of the application.
//!
//! Exclusivity does not come from the database: an exclusive lock on a file beside it
//! (`<database>.sendium-relay`) keeps the table to one relay, so a second Sendium
//! process pointed at the same file stands by until the first one exits.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use parking_lot::Mutex;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions, SqliteRow};
use sqlx::{Row, Sqlite, Transaction};
use uuid::Uuid;

use super::{DeadRow, OutboxRow, Plan, RelayError, RelaySettings, RowOutcome, Settled, SourceStats, row};
use crate::publish::OutboxMessage;

/// How long a statement waits for the application's writers to let go of the lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// SQLite's current time in the table's timestamp format.
const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

/// One source table's relay queries.
#[derive(Debug)]
pub struct SqliteRelay {
    pool: SqlitePool,
    settings: RelaySettings,
    lock_path: PathBuf,
    /// The relay lock, once taken; held until the process ends.
    lock: Mutex<Option<File>>,
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

/// A delivery's rows, read outside any transaction.
pub struct SqliteDelivery<'r> {
    relay: &'r SqliteRelay,
    rows: Vec<OutboxRow>,
}

impl SqliteRelay {
    /// A relay for the database file at `url` (`sqlite:///path`); the file must exist
    /// (the application creates it with the table), and nothing is opened yet.
    pub fn open(url: &str, settings: RelaySettings) -> Result<Self, RelayError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|source| RelayError::Database {
                table: settings.table.to_string(),
                source,
            })?
            .create_if_missing(false)
            .busy_timeout(BUSY_TIMEOUT);
        let mut lock_path = options.get_filename().as_os_str().to_owned();
        lock_path.push(".sendium-relay");
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .acquire_timeout(BUSY_TIMEOUT * 2)
            .connect_lazy_with(options);
        let t = settings.table.as_str();
        Ok(Self {
            take: format!(
                "SELECT id, event_id, account, source_addr, destination_addr, body, callback_url, group_key, attempts, \
                        (julianday('now') - julianday(created_at)) * 86400.0 AS age \
                   FROM {t} o \
                  WHERE status = 'pending' AND id > ?2 AND (next_attempt_at IS NULL OR next_attempt_at <= {NOW}) \
                    AND (group_key IS NULL OR NOT EXISTS ( \
                         SELECT 1 FROM {t} e \
                          WHERE e.status = 'pending' AND e.group_key = o.group_key AND e.id < o.id \
                            AND (e.next_attempt_at > {NOW} OR e.id <= ?2))) \
                  ORDER BY id LIMIT ?1"
            ),
            delete: format!("DELETE FROM {t} WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'pending'"),
            keep: format!(
                "UPDATE {t} SET status = 'relayed', relayed_at = {NOW}, last_error = NULL \
                  WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'pending'"
            ),
            retry: format!(
                "UPDATE {t} SET next_attempt_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?2), last_error = ?3 \
                  WHERE id = ?1 AND status = 'pending'"
            ),
            refuse: format!(
                "UPDATE {t} SET attempts = attempts + 1, last_error = ?3, \
                        status = CASE WHEN attempts + 1 >= ?4 THEN 'dead' ELSE 'pending' END, \
                        next_attempt_at = CASE WHEN attempts + 1 >= ?4 THEN NULL \
                                               ELSE strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?2) END \
                  WHERE id = ?1 AND status = 'pending' \
                 RETURNING status = 'dead' AS dead"
            ),
            forget: format!(
                "DELETE FROM {t} WHERE id IN ( \
                   SELECT id FROM {t} WHERE status = 'relayed' \
                      AND relayed_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?1) LIMIT ?2)"
            ),
            stats: format!(
                "SELECT (SELECT count(*) FROM {t} WHERE status = 'pending') AS backlog, \
                        (SELECT (julianday('now') - julianday(created_at)) * 86400.0 FROM {t} \
                          WHERE status = 'pending' ORDER BY id LIMIT 1) AS oldest, \
                        (SELECT count(*) FROM {t} WHERE status = 'dead') AS dead"
            ),
            dead: format!(
                "SELECT id, event_id, account, group_key, attempts, last_error, created_at \
                   FROM {t} WHERE status = 'dead' ORDER BY id LIMIT ?1"
            ),
            revive: format!(
                "UPDATE {t} SET status = 'pending', attempts = 0, next_attempt_at = NULL \
                  WHERE status = 'dead' AND (?1 IS NULL OR event_id = ?1)"
            ),
            pool,
            settings,
            lock_path: PathBuf::from(lock_path),
            lock: Mutex::new(None),
        })
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

    /// Take the relay lock if this relay does not hold it yet: false while another
    /// process holds it.
    fn hold_lock(&self) -> Result<bool, RelayError> {
        let mut held = self.lock.lock();
        if held.is_some() {
            return Ok(true);
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.lock_path)
            .map_err(|e| RelayError::Source {
                table: self.settings.table.to_string(),
                reason: format!("cannot open the relay lock {}: {e}", self.lock_path.display()),
            })?;
        match file.try_lock() {
            Ok(()) => {
                *held = Some(file);
                Ok(true)
            }
            Err(TryLockError::WouldBlock) => Ok(false),
            Err(TryLockError::Error(e)) => Err(RelayError::Source {
                table: self.settings.table.to_string(),
                reason: format!("cannot lock {}: {e}", self.lock_path.display()),
            }),
        }
    }

    /// Begin a delivery: `None` when another relay holds the file's lock. A SQLite
    /// source has one partition, 0.
    pub async fn begin(&self, partition: u16) -> Result<Option<SqliteDelivery<'_>>, RelayError> {
        self.begin_after(partition, 0).await
    }

    /// [`SqliteRelay::begin`] reading only rows after id `after`.
    pub async fn begin_after(&self, partition: u16, after: i64) -> Result<Option<SqliteDelivery<'_>>, RelayError> {
        if partition != 0 || !self.hold_lock()? {
            return Ok(None);
        }
        let rows = sqlx::query(sqlx::AssertSqlSafe(self.take.clone()))
            .bind(i64::from(self.settings.batch_size.max(1)))
            .bind(after)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        let rows = rows
            .iter()
            .map(row_of)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))?;
        Ok(Some(SqliteDelivery { relay: self, rows }))
    }

    pub async fn forget_relayed(&self, limit: i64) -> Result<u64, RelayError> {
        if self.settings.retention.is_zero() {
            return Ok(0);
        }
        sqlx::query(sqlx::AssertSqlSafe(self.forget.clone()))
            .bind(seconds(-self.settings.retention.as_secs_f64()))
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

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// An SQLite date modifier adding `secs` seconds.
fn seconds(secs: f64) -> String {
    format!("{secs:+.3} seconds")
}

fn row_of(r: &SqliteRow) -> Result<OutboxRow, sqlx::Error> {
    let event_text: String = r.try_get("event_id")?;
    // The column is text: an application may store any stable identity there. One that
    // is not a UUID maps to a name-based UUID of it, just as stable.
    let event_id =
        Uuid::parse_str(&event_text).unwrap_or_else(|_| Uuid::new_v5(&Uuid::NAMESPACE_OID, event_text.as_bytes()));
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
        r.try_get("attempts")?,
        r.try_get("age")?,
    ))
}

impl SqliteDelivery<'_> {
    /// The due rows, in relay order.
    pub fn rows(&self) -> &[OutboxRow] {
        &self.rows
    }

    /// Record each row's outcome in one short write transaction.
    pub async fn settle(self, outcomes: &[(i64, RowOutcome)]) -> Result<Settled, RelayError> {
        let relay = self.relay;
        let plan = Plan::of(&relay.settings.table, &self.rows, outcomes)?;
        let mut tx: Transaction<'_, Sqlite> = relay.pool.begin().await.map_err(|e| relay.err(e))?;
        let mut settled = Settled::default();
        if !plan.admitted.is_empty() {
            let sql = if relay.settings.retention.is_zero() {
                &relay.delete
            } else {
                &relay.keep
            };
            let ids = serde_json::to_string(&plan.admitted).unwrap_or_else(|_| "[]".into());
            settled.admitted = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .bind(ids)
                .execute(&mut *tx)
                .await
                .map_err(|e| relay.err(e))?
                .rows_affected();
        }
        for ((id, error), after) in plan.retry.ids.iter().zip(&plan.retry.errors).zip(&plan.retry.after) {
            settled.retried += sqlx::query(sqlx::AssertSqlSafe(relay.retry.clone()))
                .bind(id)
                .bind(seconds(*after))
                .bind(error)
                .execute(&mut *tx)
                .await
                .map_err(|e| relay.err(e))?
                .rows_affected();
        }
        let max_attempts = i64::from(relay.settings.max_attempts.max(1));
        for ((id, error), after) in plan
            .refused
            .ids
            .iter()
            .zip(&plan.refused.errors)
            .zip(&plan.refused.after)
        {
            let dead: Option<bool> = sqlx::query(sqlx::AssertSqlSafe(relay.refuse.clone()))
                .bind(id)
                .bind(seconds(*after))
                .bind(error)
                .bind(max_attempts)
                .fetch_optional(&mut *tx)
                .await
                .and_then(|r| r.map(|r| r.try_get("dead")).transpose())
                .map_err(|e| relay.err(e))?;
            match dead {
                Some(true) => settled.dead += 1,
                Some(false) => settled.retried += 1,
                None => {}
            }
        }
        tx.commit().await.map_err(|e| relay.err(e))?;
        Ok(settled)
    }
}
