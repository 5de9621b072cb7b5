//! One process on a database's outbound stages: [`ExclusiveLock`], a transaction-level
//! advisory lock held by an open transaction on a connection of its own.
//!
//! The stages' writers are correct with several processes (they take turns on the
//! totals row), but selection and delivery are not divided between processes: two
//! processes would both select every ready unit. So a second process is refused at
//! startup, naming why, as a second process on a data directory is. The lock belongs to
//! the transaction, so it can never be stranded: if the process, its connection or the
//! server dies, PostgreSQL releases it. The transaction only ever runs `SELECT`s, takes
//! no snapshot between them (READ COMMITTED) and has no transaction id, so holding it
//! open does not hold back vacuum. If the connection is lost (the server restarted) the
//! lock is taken again; while it is not held, every write of the stages is refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection};

use super::super::failure::{Location, failure};
use crate::error::{BackendFailure, FailureKind};

/// The advisory lock's two keys: Sendium's class, and the outbound stages.
const LOCK_CLASS: i32 = 0x5345_4E44; // "SEND"
const LOCK_STAGES: i32 = 1;
/// How often the held transaction is checked (and, lost, taken again).
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// How long startup keeps trying a lock another process holds.
const TAKE_WITHIN: Duration = Duration::from_secs(3);

/// The lock, held by a background task for as long as this value lives.
#[derive(Debug)]
pub(crate) struct ExclusiveLock {
    held: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
    loc: Location,
}

impl Drop for ExclusiveLock {
    fn drop(&mut self) {
        // Ending the task drops its connection: the server releases the lock.
        self.task.abort();
    }
}

/// Open a connection and try to take the lock in a transaction left open.
async fn take(options: &PgConnectOptions) -> Result<Option<PgConnection>, sqlx::Error> {
    let mut conn = options.connect().await?;
    sqlx::query("BEGIN").execute(&mut conn).await?;
    let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1, $2)")
        .bind(LOCK_CLASS)
        .bind(LOCK_STAGES)
        .fetch_one(&mut conn)
        .await?;
    if got {
        Ok(Some(conn))
    } else {
        let _ = conn.close().await;
        Ok(None)
    }
}

impl ExclusiveLock {
    /// Take the lock, or refuse: another process holds it. A process SIGKILLed a moment
    /// ago may still hold it until the server notices its connection closed: the lock
    /// is tried for up to [`TAKE_WITHIN`] before refusing.
    pub(crate) async fn acquire(options: PgConnectOptions, loc: Location) -> Result<Self, BackendFailure> {
        let deadline = tokio::time::Instant::now() + TAKE_WITHIN;
        let conn = loop {
            if let Some(conn) = take(&options).await.map_err(|e| failure(&loc, &e))? {
                break conn;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(loc.failure(
                    FailureKind::Locked,
                    "another Sendium process runs the postgresql outbound stages of this database; \
                     one process per database",
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let held = Arc::new(AtomicBool::new(true));
        let task = tokio::spawn(keep(conn, options, held.clone(), loc.clone()));
        Ok(Self { held, task, loc })
    }

    /// Refuse a write while the lock is not held (its connection was lost and it is not
    /// taken again yet, or another process took it meanwhile).
    pub(crate) fn check(&self) -> Result<(), BackendFailure> {
        if self.held.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(self.loc.failure(
                FailureKind::Unavailable,
                "this process does not hold the outbound stages' lock on the database (its connection was lost)",
            ))
        }
    }
}

/// Keep the transaction open; take the lock again after a lost connection.
async fn keep(mut conn: PgConnection, options: PgConnectOptions, held: Arc<AtomicBool>, loc: Location) {
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        if sqlx::query("SELECT 1").execute(&mut conn).await.is_ok() {
            continue;
        }
        held.store(false, Ordering::Release);
        tracing::warn!(database = %loc, "lost the connection holding the outbound stages' lock; taking it again");
        conn = loop {
            tokio::time::sleep(CHECK_EVERY).await;
            match take(&options).await {
                Ok(Some(c)) => break c,
                Ok(None) => {
                    tracing::error!(
                        database = %loc,
                        "another Sendium process took the outbound stages' lock of this database; this process \
                         refuses every write to them"
                    );
                }
                Err(e) => tracing::debug!(database = %loc, error = %e, "cannot take the stages' lock yet"),
            }
        };
        held.store(true, Ordering::Release);
        tracing::info!(database = %loc, "holding the outbound stages' lock again");
    }
}
