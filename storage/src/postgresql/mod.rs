//! PostgreSQL backends: the DLR store ([`PostgresDlrStore`]).
//!
//! One database may be shared by several Sendium processes. The schema lives in
//! `storage/migrations/` (SQL, embedded in the binary) and is applied at startup by
//! [`PostgresDlrStore::connect`], idempotently and under an advisory lock. Tables:
//!
//! | table | one row per | key / indexes |
//! |---|---|---|
//! | `dlr_tracks` | handed-off branch (unit, branch): receipt targets (JSONB), expected parts, first failure, `resolved_at`, `expires_at` | PK (unit, branch); (expires_at) |
//! | `dlr_correlations` | (destination, provider id): a correlation to (unit, branch, part, generation) with that part's final state — or an orphan receipt (unit NULL) | PK (destination, provider_key); (unit, branch); partial (orphan_expires_at) for orphans |
//! | `dlr_orphans` | view of the orphan rows | — |
//! | `dlr_deliveries` | pending downstream delivery: target, a receipt's outcome or an inbound message (JSONB + payload bytea), `attempt`, `due_at`, `lease_until`, `account`, `expires_at` | PK id; (due_at, id); (expires_at); partial (account, due_at, id) WHERE smpp; partial (due_at, id) WHERE NOT smpp |
//! | `dlr_inbound_groups` | multipart inbound group: key, deadline, `closed`, `due_at` (0 once complete or closed) | PK no; (due_at, no); unique partial key WHERE NOT closed |
//! | `dlr_inbound_parts` | held part: group, seq, deadline, message (JSONB), payload (bytea) | PK (group_no, seq) |
//! | `dlr_counters`, `dlr_counter_deltas` | maintained totals for `stats` | — |
//!
//! See `docs/postgresql-dlr.md` for the concurrency design and per-operation costs.
//!
//! Rows updated in place about once per message (tracks, correlations, routed work)
//! have half of each page kept free (fillfactor 50), so those updates stay HOT. Receipt targets are JSONB (readable with
//! psql; expanded into deliveries inside the resolving statement).
//!
//! With the `pg-test-cluster` feature (and in this crate's tests), `test_cluster`
//! starts a throwaway PostgreSQL cluster: another crate's tests get it with
//! `sendium-storage = { workspace = true, features = ["pg-test-cluster"] }` under
//! `[dev-dependencies]`, then `TestCluster::shared().fresh_database()`.

/// Planner settings of every Sendium connection. The tables are queues, emptied as fast
/// as they fill, so the statistics autovacuum last took are often those of a nearly empty
/// table, and a plan cached from them (a prepared statement's generic plan) is kept as
/// the table grows. A sequential scan or a hash or merge join then reads the whole
/// table on every call, which costs seconds once a backlog has built.
/// Every statement is written to reach its rows through an index on its own bounded
/// list, so sequential scans and hash and merge joins are disabled (priced out, still
/// possible where nothing else is), and a nested loop of index probes is chosen
/// whatever the statistics say. JIT is off: compiling a short statement (which a cost
/// estimate from stale statistics can trigger) takes longer than running it.
pub(crate) const SESSION_SETTINGS: [(&str, &str); 4] = [
    ("jit", "off"),
    ("enable_seqscan", "off"),
    ("enable_hashjoin", "off"),
    ("enable_mergejoin", "off"),
];

/// Transactions retried on deadlock / serialization failure before giving up.
pub(crate) const MAX_TX_RETRIES: u32 = 8;

/// Errors inside an operation: retryable database errors are told apart from final
/// failures.
#[derive(Debug)]
pub(crate) enum OpError {
    Sql(sqlx::Error),
    Failure(crate::error::BackendFailure),
}

impl From<sqlx::Error> for OpError {
    fn from(e: sqlx::Error) -> Self {
        OpError::Sql(e)
    }
}

/// Run `$body` (which uses `$tx`, a `&mut PgConnection` inside a transaction) and
/// commit; retry the whole transaction on deadlock or serialization failure. `$self`
/// has the store's `pool` and `loc`. A macro rather than a closure-taking fn: the
/// future must stay `Send` for `async_trait`.
macro_rules! in_transaction {
    ($self:ident, $tx:ident => $body:expr) => {{
        let mut retries = 0u32;
        loop {
            let result: Result<_, $crate::postgresql::OpError> = async {
                let mut txn = $self.pool.begin().await?;
                let $tx: &mut sqlx::PgConnection = &mut txn;
                let out = $body;
                txn.commit().await?;
                Ok(out)
            }
            .await;
            match result {
                Ok(v) => break Ok(v),
                Err($crate::postgresql::OpError::Sql(e))
                    if $crate::postgresql::failure::is_retryable(&e) && retries < $crate::postgresql::MAX_TX_RETRIES =>
                {
                    retries += 1;
                    tracing::debug!(retries, error = %e, "postgresql: transaction retried");
                    tokio::time::sleep(std::time::Duration::from_millis(u64::from(retries) * 5)).await;
                }
                Err($crate::postgresql::OpError::Sql(e)) => break Err($crate::postgresql::failure::failure(&$self.loc, &e)),
                Err($crate::postgresql::OpError::Failure(f)) => break Err(f),
            }
        }
    }};
}

pub mod dlr;
mod failure;
pub(crate) mod migrate;
pub mod sms;
#[cfg(any(test, feature = "pg-test-cluster"))]
pub mod test_cluster;

pub use dlr::{PgDlrOptions, PostgresDlrStore};
pub use sms::{
    Assignment, CHECK_EVERY, Ownership, OwnershipStatus, PgPendingStore, PgRoutedWorkStore, PgRouterQueueStore,
    PgStageOptions, PgStages, StageAccess, partition_of,
};
