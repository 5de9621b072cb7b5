//! The PostgreSQL outbound stages — pending, router-queue, routed-work — on one
//! connection pool: [`PgStages`] opens the database once and hands out the three
//! stores.
//!
//! The tables are in `storage/migrations/0002_sms_stages.sql`. A message is inserted
//! once (one multi-row `INSERT … SELECT FROM UNNEST` per group commit, committed before
//! any acknowledgement) and deleted once (when its source completes). Records, groups
//! and routed units are the versioned envelopes the file stages store, so both
//! backends decode and check them with the same code.
//!
//! * `pending.rs`: admissions and completions in one transaction; multipart groups and
//!   idempotency keys; ready units in commit order.
//! * `router_queue.rs`: staged units and the selection cursor.
//! * `routed_work.rs`: routed units, failovers, branch completions.
//! * `ownership.rs`: which process works on which partitions.

mod ownership;
mod pending;
mod routed_work;
mod router_queue;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

pub use self::ownership::{Assignment, CHECK_EVERY, Ownership, OwnershipStatus, StageAccess};
pub use self::pending::PgPendingStore;
pub use self::routed_work::PgRoutedWorkStore;
pub use self::router_queue::PgRouterQueueStore;
use super::OpError;
use super::failure::{Location, failure};
use super::migrate;
use crate::error::{BackendFailure, FailureKind};
use crate::memory::PendingLimits;

/// Connection settings of the outbound stages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgStageOptions {
    /// Pool size of this process, shared by the three stages.
    pub max_connections: u32,
    /// How long an operation waits for a pooled connection (including connecting): a
    /// stopped server answers `Unavailable` after this, not a hang.
    pub acquire_timeout: Duration,
    /// Upper bound on one whole operation.
    pub operation_timeout: Duration,
    /// The schema the tables live in (`search_path`), when not the server's default.
    pub schema: Option<String>,
    /// How many partitions messages are spread over (see [`partition_of`]).
    pub partitions: u16,
    /// Serving alone, one of several, or reading only (see [`StageAccess`]).
    pub access: StageAccess,
    pub limits: PendingLimits,
}

impl PgStageOptions {
    pub fn new(max_connections: u32, limits: PendingLimits) -> Self {
        Self {
            max_connections,
            // Clients wait for their acknowledgement meanwhile: a database that does not
            // answer makes admissions refuse within seconds, not time out at the ESME.
            acquire_timeout: Duration::from_secs(2),
            operation_timeout: Duration::from_secs(10),
            schema: None,
            partitions: 16,
            access: StageAccess::Sole,
            limits,
        }
    }
}

/// The database of the outbound stages: one pool, shared by its three stores.
#[derive(Debug)]
pub(crate) struct Db {
    pub(crate) pool: PgPool,
    pub(crate) loc: Location,
    operation_timeout: Duration,
    ownership: Arc<Ownership>,
    view: Arc<ownership::PartitionView>,
}

impl Db {
    /// Bound `op` by the operation timeout.
    pub(crate) async fn timed<T, E: From<BackendFailure>>(
        &self,
        op: impl Future<Output = Result<T, BackendFailure>>,
    ) -> Result<T, E> {
        match tokio::time::timeout(self.operation_timeout, op).await {
            Ok(r) => r.map_err(E::from),
            Err(_) => Err(E::from(self.loc.failure(
                FailureKind::Unavailable,
                format_args!("no answer within {:?}", self.operation_timeout),
            ))),
        }
    }

    /// Refuse a write while this process does not hold the stages lock it was opened
    /// with.
    pub(crate) fn may_write(&self) -> Result<(), BackendFailure> {
        self.ownership.check()
    }

    /// The partitions whose work this process reads now.
    pub(crate) fn selectable(&self) -> Arc<[i16]> {
        self.view.selectable()
    }

    pub(crate) fn corrupt(&self, detail: impl std::fmt::Display) -> OpError {
        OpError::Failure(self.loc.failure(FailureKind::Corrupt, detail))
    }

    pub(crate) fn done<T>(&self, r: Result<T, OpError>) -> Result<T, BackendFailure> {
        r.map_err(|e| match e {
            OpError::Sql(e) => failure(&self.loc, &e),
            OpError::Failure(f) => f,
        })
    }
}

/// The three outbound stages on one PostgreSQL database.
pub struct PgStages {
    pub pending: Arc<PgPendingStore>,
    pub router_queue: Arc<PgRouterQueueStore>,
    pub routed_work: Arc<PgRoutedWorkStore>,
    db: Arc<Db>,
}

impl PgStages {
    /// `host:port/database` (no credentials), for logs and errors.
    pub fn location(&self) -> String {
        self.db.loc.to_string()
    }

    /// This process's locks and partitions.
    pub fn ownership(&self) -> Arc<Ownership> {
        self.db.ownership.clone()
    }

    /// Who holds each partition: the database backend pid of its lock's connection.
    pub async fn partition_holders(&self) -> Result<std::collections::BTreeMap<u16, i32>, BackendFailure> {
        let db = &self.db;
        db.timed(async {
            let r: Result<_, OpError> = async {
                let mut conn = db.pool.acquire().await?;
                Ok(ownership::holders(&mut conn).await?)
            }
            .await;
            db.done(r)
        })
        .await
    }

    /// Close the pool's connections (in-flight operations finish first).
    pub async fn close(&self) {
        self.db.pool.close().await;
    }

    /// Connect, apply the schema migrations (idempotent, safe when several processes
    /// start at once; a database migrated by a newer build is refused) and open a pool.
    pub async fn connect(url: &str, options: PgStageOptions) -> Result<Self, BackendFailure> {
        let mut connect = PgConnectOptions::from_str(url)
            .map_err(|_| {
                // The URL itself may hold a password: never echo it.
                BackendFailure::new(
                    FailureKind::Unavailable,
                    "postgresql (storage.postgresql.url)",
                    "invalid database URL",
                )
            })?
            .application_name("sendium")
            .options(crate::postgresql::SESSION_SETTINGS);
        if let Some(schema) = &options.schema {
            connect = connect.options([("search_path", schema.as_str())]);
        }
        let loc = Location::of(&connect);
        tokio::time::timeout(options.operation_timeout, migrate::run(&connect, &loc))
            .await
            .map_err(|_| loc.failure(FailureKind::Unavailable, "timed out applying schema migrations"))??;
        let partitions = options.partitions.max(1);
        let ownership = Arc::new(Ownership::acquire(options.access, partitions, connect.clone(), loc.clone()).await?);
        // Lazy: the migrations just proved the server reachable; connections open on
        // demand and reopen by themselves after a restart of the server.
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(options.acquire_timeout)
            .connect_lazy_with(connect);
        if options.access != StageAccess::ReadOnly {
            tokio::time::timeout(
                options.operation_timeout,
                agree_partitions(&pool, partitions, options.access, &loc),
            )
            .await
            .map_err(|_| loc.failure(FailureKind::Unavailable, "timed out checking the partition count"))??;
        }
        let db = Arc::new(Db {
            pool,
            loc,
            operation_timeout: options.operation_timeout,
            view: ownership.view(),
            ownership,
        });
        Ok(Self {
            pending: Arc::new(PgPendingStore::new(db.clone(), options.limits, partitions)),
            router_queue: Arc::new(PgRouterQueueStore::new(db.clone())),
            routed_work: Arc::new(PgRoutedWorkStore::new(db.clone())),
            db,
        })
    }
}

/// Every process on a database spreads work over the same number of partitions: a
/// unit stored in partition 20 would never be read by processes working on 16. The
/// stored number changes only while the pending stage holds no unit and no other
/// process serves the database; otherwise a different configured number is refused.
async fn agree_partitions(
    pool: &PgPool,
    partitions: u16,
    access: StageAccess,
    loc: &super::failure::Location,
) -> Result<(), BackendFailure> {
    let r: Result<Option<(i16, i64)>, OpError> = async {
        let mut tx = pool.begin().await?;
        // The totals row lock orders processes starting together: the census below sees
        // every process that locked it earlier.
        let row = sqlx::query("SELECT partitions, units FROM sms_pending_totals WHERE id = 1 FOR UPDATE")
            .fetch_one(&mut *tx)
            .await?;
        let (stored, units): (i16, i64) = (row.try_get("partitions")?, row.try_get("units")?);
        let wanted = i16::try_from(partitions).unwrap_or(i16::MAX);
        if stored == wanted {
            return Ok(None);
        }
        let alone = access == StageAccess::Sole || ownership::members(&mut tx).await? <= 1;
        if units != 0 || !alone {
            return Ok(Some((stored, units)));
        }
        sqlx::query("UPDATE sms_pending_totals SET partitions = $1 WHERE id = 1")
            .bind(wanted)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(None)
    }
    .await;
    match r {
        Ok(None) => Ok(()),
        Ok(Some((stored, units))) => Err(loc.failure(
            FailureKind::Locked,
            format!(
                "storage.postgresql.partitions is {partitions}, but the database's work is spread over {stored} \
                 partitions{}; use {stored}, or change it when the outbound stages are empty and no other \
                 process serves the database",
                if units != 0 {
                    format!(" ({units} units pending)")
                } else {
                    " (another process serves it)".to_string()
                }
            ),
        )),
        Err(OpError::Sql(e)) => Err(failure(loc, &e)),
        Err(OpError::Failure(f)) => Err(f),
    }
}

/// The partition a message's work belongs to: a stable hash (CRC-32) of its account and
/// destination number, so one number's messages always share a partition (and keep
/// their order) whatever process admitted them.
pub fn partition_of(account: &str, destination: &str, partitions: u16) -> u16 {
    let mut bytes = Vec::with_capacity(account.len() + destination.len() + 1);
    bytes.extend_from_slice(account.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(destination.as_bytes());
    let hash = crate::envelope::crc32(&bytes);
    u16::try_from(hash % u32::from(partitions.max(1))).unwrap_or(0)
}

/// The one row of a read over a whole table (a stage's stats: how many rows it holds).
/// A sequential scan is the plan for that, so the session's pricing-out of sequential
/// scans (see [`SESSION_SETTINGS`](crate::postgresql::SESSION_SETTINGS)) is lifted for
/// its transaction; a full index scan of a queue table's index, most of it dead entries
/// until a vacuum, costs several times more.
pub(super) async fn whole_table_row(pool: &PgPool, sql: &'static str) -> Result<sqlx::postgres::PgRow, OpError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET LOCAL enable_seqscan = on").execute(&mut *tx).await?;
    let row = sqlx::query(sql).fetch_one(&mut *tx).await?;
    tx.commit().await?;
    Ok(row)
}

/// `Vec<T>` from one column of rows.
pub(crate) fn column<T>(rows: &[sqlx::postgres::PgRow], name: &str) -> Result<Vec<T>, sqlx::Error>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    use sqlx::Row;
    rows.iter().map(|r| r.try_get::<T, _>(name)).collect()
}

/// Milliseconds as PostgreSQL stores them (bigint).
pub(crate) fn ms(t: crate::ids::Timestamp) -> i64 {
    i64::try_from(t.as_millis()).unwrap_or(i64::MAX)
}

/// A stored millisecond count as a timestamp.
pub(crate) fn ts(ms: i64) -> crate::ids::Timestamp {
    crate::ids::Timestamp(u64::try_from(ms).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_number_keeps_its_partition() {
        let p = partition_of("esme1", "447700900123", 16);
        assert!(p < 16);
        assert_eq!(partition_of("esme1", "447700900123", 16), p);
        assert_eq!(partition_of("esme1", "447700900123", 1), 0);
        assert_eq!(partition_of("esme1", "447700900123", 0), 0);
        let spread: std::collections::HashSet<u16> = (0..200)
            .map(|i| partition_of("esme1", &format!("4477009{i:05}"), 16))
            .collect();
        assert!(spread.len() > 12, "numbers spread over the partitions: {spread:?}");
    }
}
