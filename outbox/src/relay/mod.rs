//! The relay's side of an outbox table: take a partition's due rows, and settle them
//! once the caller has admitted them.
//!
//! A row is inserted once by the application and deleted once here (or marked
//! `relayed`, when the source keeps processed rows for a while): no claim step, no
//! lease. Rows read but not settled — the relay died, or its connection did — are
//! simply read again by whoever relays the partition next. That re-read is why the
//! caller admits with the row's `event_id` as the idempotency key: a row relayed twice
//! is admitted once.
//!
//! * [`PgRelay`] (PostgreSQL): a delivery is a short transaction holding the
//!   partition's `pg_try_advisory_xact_lock`, so several processes split the
//!   partitions and a dead one releases its share with its connection.
//! * [`SqliteRelay`] (SQLite, one node): a delivery reads outside any transaction and
//!   settles in one short write transaction, so the application's writers never wait
//!   behind an admission; a lock file next to the database keeps it to one relay.

use std::time::Duration;

use sqlx::{ColumnIndex, Decode, Row, Type};
use uuid::Uuid;

use crate::publish::OutboxMessage;
use crate::schema::TableName;

mod postgresql;
mod sqlite;

pub use postgresql::{PgDelivery, PgRelay};
pub use sqlite::{SqliteDelivery, SqliteRelay};

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
    /// How long ago the row was inserted, when it was read.
    pub age: Duration,
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

/// A source's backlog, for dashboards.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SourceStats {
    /// Rows not relayed yet (`pending`), due or waiting for a retry.
    pub backlog: u64,
    /// Age of the oldest of them.
    pub oldest: Option<Duration>,
    /// Rows in the dead state.
    pub dead: u64,
}

/// A row in the dead state, as `sendium outbox dead` lists it (without its body).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadRow {
    pub id: i64,
    pub event_id: String,
    pub account: String,
    pub group_key: Option<String>,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub created_at: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("outbox table {table}: {source}")]
    Database {
        table: String,
        #[source]
        source: sqlx::Error,
    },
    /// An outcome for a row the delivery did not read (an internal error). The row's id is
    /// kept for the caller, out of the message: errors are logged, and row ids are per message.
    #[error("outbox table {table}: an outcome for a row this delivery did not read")]
    UnknownRow { table: String, id: i64 },
    #[error("outbox table {table}: {reason}")]
    Source { table: String, reason: String },
}

/// A source of either dialect.
#[derive(Debug)]
pub enum OutboxSource {
    Postgresql(PgRelay),
    Sqlite(SqliteRelay),
}

/// A partition's delivery from either dialect.
pub enum Delivery<'r> {
    Postgresql(PgDelivery<'r>),
    Sqlite(SqliteDelivery<'r>),
}

impl OutboxSource {
    /// A source for `url` (`postgres://…`, `postgresql://…` or `sqlite://…`). Nothing is
    /// connected yet: a database that is down now is retried by every delivery.
    pub fn open(url: &str, settings: RelaySettings) -> Result<Self, RelayError> {
        if url.starts_with("sqlite:") {
            SqliteRelay::open(url, settings).map(OutboxSource::Sqlite)
        } else {
            PgRelay::open(url, settings).map(OutboxSource::Postgresql)
        }
    }

    pub fn settings(&self) -> &RelaySettings {
        match self {
            OutboxSource::Postgresql(r) => r.settings(),
            OutboxSource::Sqlite(r) => r.settings(),
        }
    }

    /// Begin a delivery of `partition`: `None` when another relay holds it now.
    pub async fn begin(&self, partition: u16) -> Result<Option<Delivery<'_>>, RelayError> {
        self.begin_after(partition, 0).await
    }

    /// Begin a delivery reading only rows with an id above `after`: where the previous
    /// delivery stopped. Deleted rows leave dead index entries at the head of the table
    /// until vacuum; a read that starts past them does not walk them again. A row that
    /// commits after rows with higher ids were read is below the position: read from the
    /// start (`after` 0) now and then to pick such rows up.
    pub async fn begin_after(&self, partition: u16, after: i64) -> Result<Option<Delivery<'_>>, RelayError> {
        Ok(match self {
            OutboxSource::Postgresql(r) => r.begin_after(partition, after).await?.map(Delivery::Postgresql),
            OutboxSource::Sqlite(r) => r.begin_after(partition, after).await?.map(Delivery::Sqlite),
        })
    }

    /// Delete rows kept past the source's retention, at most `limit`.
    pub async fn forget_relayed(&self, limit: i64) -> Result<u64, RelayError> {
        match self {
            OutboxSource::Postgresql(r) => r.forget_relayed(limit).await,
            OutboxSource::Sqlite(r) => r.forget_relayed(limit).await,
        }
    }

    pub async fn stats(&self) -> Result<SourceStats, RelayError> {
        match self {
            OutboxSource::Postgresql(r) => r.stats().await,
            OutboxSource::Sqlite(r) => r.stats().await,
        }
    }

    /// Dead rows in `id` order, at most `limit`.
    pub async fn dead(&self, limit: i64) -> Result<Vec<DeadRow>, RelayError> {
        match self {
            OutboxSource::Postgresql(r) => r.dead(limit).await,
            OutboxSource::Sqlite(r) => r.dead(limit).await,
        }
    }

    /// Put dead rows back to pending with their attempts reset: every dead row, or the
    /// one with this event id. Returns how many.
    pub async fn retry_dead(&self, event_id: Option<&str>) -> Result<u64, RelayError> {
        match self {
            OutboxSource::Postgresql(r) => r.retry_dead(event_id).await,
            OutboxSource::Sqlite(r) => r.retry_dead(event_id).await,
        }
    }

    /// Close the source's connections.
    pub async fn close(&self) {
        match self {
            OutboxSource::Postgresql(r) => r.close().await,
            OutboxSource::Sqlite(r) => r.close().await,
        }
    }
}

impl Delivery<'_> {
    /// The partition's due rows, in relay order.
    pub fn rows(&self) -> &[OutboxRow] {
        match self {
            Delivery::Postgresql(d) => d.rows(),
            Delivery::Sqlite(d) => d.rows(),
        }
    }

    /// Give the delivery up without settling anything, freeing the partition at once.
    pub async fn abandon(self) -> Result<(), RelayError> {
        match self {
            Delivery::Postgresql(d) => d.abandon().await,
            Delivery::Sqlite(_) => Ok(()),
        }
    }

    /// Record each row's outcome. Call it only once the admissions are durable: a row
    /// settled `Admitted` is not read again.
    pub async fn settle(self, outcomes: &[(i64, RowOutcome)]) -> Result<Settled, RelayError> {
        match self {
            Delivery::Postgresql(d) => d.settle(outcomes).await,
            Delivery::Sqlite(d) => d.settle(outcomes).await,
        }
    }
}

/// A delivery's outcomes sorted by what they change.
#[derive(Default)]
struct Plan {
    admitted: Vec<i64>,
    retry: Changes,
    refused: Changes,
}

#[derive(Default)]
struct Changes {
    ids: Vec<i64>,
    errors: Vec<String>,
    after: Vec<f64>,
}

impl Changes {
    fn push(&mut self, id: i64, error: &str, after: Duration) {
        self.ids.push(id);
        self.errors.push(error.to_owned());
        self.after.push(after.as_secs_f64());
    }
}

impl Plan {
    fn of(table: &TableName, rows: &[OutboxRow], outcomes: &[(i64, RowOutcome)]) -> Result<Plan, RelayError> {
        let mut plan = Plan::default();
        for (id, outcome) in outcomes {
            if !rows.iter().any(|r| r.id == *id) {
                return Err(RelayError::UnknownRow {
                    table: table.to_string(),
                    id: *id,
                });
            }
            match outcome {
                RowOutcome::Admitted => plan.admitted.push(*id),
                RowOutcome::Retry { error, after } => plan.retry.push(*id, error, *after),
                RowOutcome::Refused { error, after } => plan.refused.push(*id, error, *after),
                RowOutcome::Skipped => {}
            }
        }
        Ok(plan)
    }
}

fn row(id: i64, event_id: Uuid, message: OutboxMessage, attempts: i64, age_seconds: Option<f64>) -> OutboxRow {
    OutboxRow {
        id,
        event_id,
        message,
        attempts: u32::try_from(attempts).unwrap_or(0),
        age: Duration::try_from_secs_f64(age_seconds.unwrap_or(0.0).max(0.0)).unwrap_or_default(),
    }
}

/// A source's counts, from the row of either dialect's stats query (`backlog`,
/// `oldest` in seconds, `dead`).
fn stats_of<R: Row>(r: &R) -> Result<SourceStats, sqlx::Error>
where
    for<'a> i64: Decode<'a, R::Database> + Type<R::Database>,
    for<'a> f64: Decode<'a, R::Database> + Type<R::Database>,
    for<'s> &'s str: ColumnIndex<R>,
{
    let count = |name: &str| -> Result<u64, sqlx::Error> { Ok(u64::try_from(r.try_get::<i64, _>(name)?).unwrap_or(0)) };
    let oldest: Option<f64> = r.try_get("oldest")?;
    Ok(SourceStats {
        backlog: count("backlog")?,
        oldest: oldest.map(|s| Duration::try_from_secs_f64(s.max(0.0)).unwrap_or_default()),
        dead: count("dead")?,
    })
}

/// A dead row, from the row of either dialect's dead query.
fn dead_row_of<R: Row>(r: &R) -> Result<DeadRow, sqlx::Error>
where
    for<'a> i64: Decode<'a, R::Database> + Type<R::Database>,
    for<'a> String: Decode<'a, R::Database> + Type<R::Database>,
    for<'s> &'s str: ColumnIndex<R>,
{
    Ok(DeadRow {
        id: r.try_get("id")?,
        event_id: r.try_get("event_id")?,
        account: r.try_get("account")?,
        group_key: r.try_get("group_key")?,
        attempts: u32::try_from(r.try_get::<i64, _>("attempts")?).unwrap_or(0),
        last_error: r.try_get("last_error")?,
        created_at: r.try_get("created_at")?,
    })
}
