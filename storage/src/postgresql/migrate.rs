//! The schema migrations in `storage/migrations/`, embedded at compile time.
//!
//! `sqlx::migrate!` would embed the directory too, but it needs sqlx's `macros` feature
//! (a proc-macro build of sqlx for the host). `include_str!` embeds the same files with
//! no database and no extra build; sqlx's [`Migrator`] then applies them exactly as the
//! macro's would: each migration in its own transaction together with its row in
//! `_sqlx_migrations` (version + SHA-384 checksum), all of it under a session-level
//! `pg_advisory_lock` keyed on the database name, so several Sendium processes starting
//! at once apply each migration once and the others wait, then find it applied.
//!
//! The lock is session-level, so migrations run on a dedicated connection that is
//! closed afterwards: a failure half-way can never leave the lock held by a pooled
//! connection.

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, SqlSafeStr};

use super::failure::{Location, failure, migrate_failure};
use crate::error::BackendFailure;

/// (version, description, SQL). Append only: an applied migration is never edited
/// (its checksum is checked at every startup). A test checks that this list and the
/// directory agree.
pub(crate) const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "dlr store", include_str!("../../migrations/0001_dlr_store.sql")),
    (2, "sms stages", include_str!("../../migrations/0002_sms_stages.sql")),
    (
        3,
        "dlr deliveries fewer indexes",
        include_str!("../../migrations/0003_dlr_deliveries_fewer_indexes.sql"),
    ),
    (
        4,
        "idempotency digest",
        include_str!("../../migrations/0004_idempotency_digest.sql"),
    ),
    (5, "dlr inbound", include_str!("../../migrations/0005_dlr_inbound.sql")),
    (
        6,
        "dlr progress",
        include_str!("../../migrations/0006_dlr_progress.sql"),
    ),
    (
        7,
        "room for updates",
        include_str!("../../migrations/0007_room_for_updates.sql"),
    ),
];

fn migrator() -> Migrator {
    Migrator::with_migrations(
        MIGRATIONS
            .iter()
            .map(|(version, description, sql)| {
                Migration::new(
                    *version,
                    (*description).into(),
                    MigrationType::Simple,
                    sql.into_sql_str(),
                    false,
                )
            })
            .collect(),
    )
}

/// Apply every migration not yet applied (idempotent; safe concurrently).
pub(crate) async fn run(options: &PgConnectOptions, loc: &Location) -> Result<(), BackendFailure> {
    let mut conn = options.connect().await.map_err(|e| failure(loc, &e))?;
    // `run_direct` is what `run` calls; called directly, the future stays `Send` (with
    // `run`, the `Acquire` bound is not general enough for an `async_trait` caller).
    let result = migrator().run_direct(None, &mut conn, false).await;
    // Closing ends the session, which releases the advisory lock even if run failed.
    let _ = conn.close().await;
    result.map_err(|e| migrate_failure(loc, &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_matches_the_migrations_directory() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".sql"))
            .collect();
        files.sort();
        assert_eq!(
            files.len(),
            MIGRATIONS.len(),
            "every file in {dir:?} is listed in MIGRATIONS"
        );
        for (file, (version, _, sql)) in files.iter().zip(MIGRATIONS) {
            let number: i64 = file.split('_').next().unwrap().parse().unwrap();
            assert_eq!(number, *version, "{file}");
            assert_eq!(std::fs::read_to_string(dir.join(file)).unwrap(), *sql, "{file}");
        }
    }
}
