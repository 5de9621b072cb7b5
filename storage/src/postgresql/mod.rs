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
//! | `dlr_deliveries` | pending downstream receipt: target, outcome, `attempt`, `due_at`, `lease_until`, `account`, `expires_at` | PK id; (due_at, id); (expires_at); partial (account) WHERE smpp |
//! | `dlr_counters`, `dlr_counter_deltas` | maintained totals for `stats` | — |
//!
//! See `docs/postgresql-dlr.md` for the concurrency design and per-operation costs.
//!
//! Tables are created with fillfactor 70 where receipts update rows in place (tracks,
//! correlations), so those updates stay HOT. Receipt targets are JSONB (readable with
//! psql; expanded into deliveries inside the resolving statement).
//!
//! With the `pg-test-cluster` feature (and in this crate's tests), `test_cluster`
//! starts a throwaway PostgreSQL cluster: another crate's tests get it with
//! `sendium-storage = { workspace = true, features = ["pg-test-cluster"] }` under
//! `[dev-dependencies]`, then `TestCluster::shared().fresh_database()`.

pub mod dlr;
mod failure;
mod migrate;
#[cfg(any(test, feature = "pg-test-cluster"))]
pub mod test_cluster;

pub use dlr::{PgDlrOptions, PostgresDlrStore};
