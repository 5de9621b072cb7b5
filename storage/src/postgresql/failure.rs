//! Mapping sqlx errors onto [`BackendFailure`].
//!
//! The caller reacts to the kind, not to PostgreSQL's details: `Unavailable` makes the
//! DlrCorrelator retry and readiness go false, `Full` is a disk the operator must grow,
//! `Corrupt`/`UnsupportedVersion` mean the schema or the stored data is not what this
//! build expects. The location is `host:port/database` — never the URL, which may carry
//! a password.

use std::fmt;

use sqlx::migrate::MigrateError;
use sqlx::postgres::PgConnectOptions;

use crate::error::{BackendFailure, FailureKind};

/// Where a store lives, as shown in errors and logs (no credentials).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Location(String);

impl Location {
    pub(crate) fn of(options: &PgConnectOptions) -> Self {
        let db = options.get_database().unwrap_or(options.get_username());
        match options.get_socket() {
            Some(socket) => Self(format!("{}:{}/{db}", socket.display(), options.get_port())),
            None => Self(format!("{}:{}/{db}", options.get_host(), options.get_port())),
        }
    }

    pub(crate) fn failure(&self, kind: FailureKind, detail: impl fmt::Display) -> BackendFailure {
        BackendFailure::new(kind, format!("postgresql {}", self.0), detail)
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// SQLSTATEs worth retrying the whole transaction for: a deadlock (the server aborted
/// one of two transactions that waited on each other) or a serialization failure.
pub(crate) fn is_retryable(e: &sqlx::Error) -> bool {
    sqlstate(e).is_some_and(|c| c == "40P01" || c == "40001")
}

fn sqlstate(e: &sqlx::Error) -> Option<String> {
    e.as_database_error().and_then(|d| d.code()).map(|c| c.into_owned())
}

/// The failure kind of a SQLSTATE (see PostgreSQL's Appendix A, "Error Codes").
fn kind_of_sqlstate(code: &str) -> FailureKind {
    match code {
        // disk_full: the database volume is out of space.
        "53100" => FailureKind::Full,
        // lock_not_available: another session holds what we need.
        "55P03" => FailureKind::Locked,
        // undefined_table / undefined_column / undefined_function: the schema is not
        // the one this build migrated to.
        "42P01" | "42703" | "42883" => FailureKind::UnsupportedVersion,
        // data_corrupted, index_corrupted.
        "XX001" | "XX002" => FailureKind::Corrupt,
        _ => match &code[..2.min(code.len())] {
            // data exceptions and integrity violations: what we read or wrote does not
            // fit the schema.
            "22" | "23" => FailureKind::Corrupt,
            // connection exceptions (08), insufficient resources (53: out of memory,
            // too many connections), operator intervention (57: shutdown, cannot
            // connect now), system errors (58), read-only standby (25006), auth (28):
            // the database cannot serve us right now.
            _ => FailureKind::Unavailable,
        },
    }
}

/// Map an sqlx error to a [`BackendFailure`] at `loc`.
pub(crate) fn failure(loc: &Location, e: &sqlx::Error) -> BackendFailure {
    use sqlx::Error as E;
    match e {
        E::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            loc.failure(
                kind_of_sqlstate(&code),
                format_args!("{} (SQLSTATE {code})", db.message()),
            )
        }
        E::Io(io) => loc.failure(FailureKind::Unavailable, format_args!("I/O error: {io}")),
        E::Tls(t) => loc.failure(FailureKind::Unavailable, format_args!("TLS error: {t}")),
        E::PoolTimedOut => loc.failure(
            FailureKind::Unavailable,
            "no database connection within the acquire timeout (server down or unreachable, or pool exhausted)",
        ),
        E::PoolClosed => loc.failure(FailureKind::Unavailable, "connection pool closed"),
        E::WorkerCrashed => loc.failure(FailureKind::Unavailable, "database driver worker crashed"),
        E::Protocol(p) => loc.failure(FailureKind::Unavailable, format_args!("protocol error: {p}")),
        E::Configuration(c) => loc.failure(FailureKind::Unavailable, format_args!("configuration: {c}")),
        E::Migrate(m) => migrate_failure(loc, m),
        E::RowNotFound
        | E::TypeNotFound { .. }
        | E::ColumnIndexOutOfBounds { .. }
        | E::ColumnNotFound(_)
        | E::ColumnDecode { .. }
        | E::Decode(_)
        | E::Encode(_) => loc.failure(FailureKind::Corrupt, e),
        other => loc.failure(FailureKind::Unavailable, other),
    }
}

/// Migration failures: a database migrated by a newer Sendium (a version we do not
/// know) is `UnsupportedVersion`; an applied migration whose text changed, or one left
/// half-applied, is `Corrupt`.
pub(crate) fn migrate_failure(loc: &Location, e: &MigrateError) -> BackendFailure {
    match e {
        MigrateError::Execute(inner) | MigrateError::ExecuteMigration(inner, _) => failure(loc, inner),
        MigrateError::VersionMissing(v) => loc.failure(
            FailureKind::UnsupportedVersion,
            format_args!(
                "the database has schema migration {v}, which this Sendium does not know (written by a newer version?)"
            ),
        ),
        MigrateError::VersionMismatch(v) => loc.failure(
            FailureKind::Corrupt,
            format_args!("applied schema migration {v} differs from this Sendium's copy"),
        ),
        MigrateError::Dirty(v) => loc.failure(
            FailureKind::Corrupt,
            format_args!("schema migration {v} was left partially applied"),
        ),
        other => loc.failure(FailureKind::Unavailable, format_args!("schema migration: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    #[test]
    fn location_never_shows_the_password() {
        let o = PgConnectOptions::from_str("postgres://sendium:s3cret@db.example:6543/dlr").unwrap();
        let loc = Location::of(&o);
        assert_eq!(loc.to_string(), "db.example:6543/dlr");
        let f = failure(&loc, &sqlx::Error::PoolTimedOut);
        assert_eq!(f.kind, FailureKind::Unavailable);
        assert!(!f.to_string().contains("s3cret"));
        assert!(f.location.contains("db.example:6543/dlr"));
    }

    #[test]
    fn sqlstates_map_to_kinds() {
        assert_eq!(kind_of_sqlstate("53100"), FailureKind::Full);
        assert_eq!(kind_of_sqlstate("57P01"), FailureKind::Unavailable);
        assert_eq!(kind_of_sqlstate("08006"), FailureKind::Unavailable);
        assert_eq!(kind_of_sqlstate("53300"), FailureKind::Unavailable);
        assert_eq!(kind_of_sqlstate("22P02"), FailureKind::Corrupt);
        assert_eq!(kind_of_sqlstate("42P01"), FailureKind::UnsupportedVersion);
        assert_eq!(kind_of_sqlstate("55P03"), FailureKind::Locked);
        assert_eq!(kind_of_sqlstate(""), FailureKind::Unavailable);
    }
}
