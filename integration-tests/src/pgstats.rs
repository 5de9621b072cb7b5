//! What a PostgreSQL server spent on a benchmark phase: statements, WAL bytes and the
//! server's CPU time, sampled before and after and divided by the messages.
//!
//! * Statements come from `pg_stat_statements` (every statement of the benchmarked
//!   database, `BEGIN` and `COMMIT` included), when the server preloads it.
//! * WAL bytes are the distance the server's WAL insert position moved
//!   (`pg_current_wal_lsn()`): exact at the moment of sampling, where `pg_stat_wal`'s
//!   counters reach the view only when a backend flushes its statistics.
//! * CPU is the user and system time of the server process and its children (backends,
//!   WAL writer, checkpointer) from `/proc`, when the server runs on this machine.

use std::time::Duration;

use sqlx::{Connection, PgConnection};

/// Where to sample.
#[derive(Debug, Clone)]
pub struct PgProbe {
    /// A URL of the benchmarked database.
    pub url: String,
    /// The postmaster's pid, when the server is local.
    pub server_pid: Option<u32>,
}

/// Counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PgSample {
    /// Statements run in the database so far (None without `pg_stat_statements`).
    pub statements: Option<f64>,
    /// The WAL insert position, in bytes.
    pub wal_bytes: f64,
    /// utime + stime of the server and its children, in clock ticks.
    pub server_cpu_ticks: Option<u64>,
}

/// Per message between two samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PgCost {
    pub statements_per_msg: Option<f64>,
    pub wal_bytes_per_msg: f64,
    /// Server CPU seconds per 10,000 messages.
    pub server_cpu_s_per_10k: Option<f64>,
}

impl PgProbe {
    /// Makes `pg_stat_statements` visible in the database when the server preloads it.
    /// False when it does not (statements are then not counted).
    pub async fn prepare(&self) -> bool {
        let Ok(mut conn) = self.connect().await else {
            return false;
        };
        let created = sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(&mut conn)
            .await
            .is_ok();
        let readable = created && statements(&mut conn).await.is_some();
        let _ = conn.close().await;
        readable
    }

    /// The counters now (None when the database cannot be reached).
    pub async fn sample(&self) -> Option<PgSample> {
        let mut conn = self.connect().await.ok()?;
        let wal_bytes: f64 = sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8")
            .fetch_one(&mut conn)
            .await
            .ok()?;
        let statements = statements(&mut conn).await;
        let _ = conn.close().await;
        Some(PgSample {
            statements,
            wal_bytes,
            server_cpu_ticks: self.server_pid.and_then(tree_cpu_ticks),
        })
    }

    async fn connect(&self) -> Result<PgConnection, sqlx::Error> {
        tokio::time::timeout(Duration::from_secs(5), PgConnection::connect(&self.url))
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?
    }
}

async fn statements(conn: &mut PgConnection) -> Option<f64> {
    sqlx::query_scalar(
        "SELECT coalesce(sum(calls), 0)::float8 FROM pg_stat_statements \
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(conn)
    .await
    .ok()
}

impl PgSample {
    /// What the server spent per message from `self` to `after`.
    pub fn cost_until(&self, after: &PgSample, messages: u64, ticks_per_s: u64) -> Option<PgCost> {
        if messages == 0 {
            return None;
        }
        let n = messages as f64;
        Some(PgCost {
            statements_per_msg: self.statements.zip(after.statements).map(|(b, a)| (a - b) / n),
            wal_bytes_per_msg: (after.wal_bytes - self.wal_bytes) / n,
            server_cpu_s_per_10k: self
                .server_cpu_ticks
                .zip(after.server_cpu_ticks)
                .map(|(b, a)| a.saturating_sub(b) as f64 / ticks_per_s as f64 / n * 10_000.0),
        })
    }
}

/// utime + stime of `root` and every process whose parent it is.
fn tree_cpu_ticks(root: u32) -> Option<u64> {
    let mut total = own_ticks(&std::fs::read_to_string(format!("/proc/{root}/stat")).ok()?)?.1;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == root {
            continue;
        }
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            && let Some((ppid, ticks)) = own_ticks(&stat)
            && ppid == root
        {
            total += ticks;
        }
    }
    Some(total)
}

/// (parent pid, utime + stime) from the text of `/proc/<pid>/stat`; fields are counted
/// after the last `)`, as the command name may hold spaces and parentheses.
fn own_ticks(stat: &str) -> Option<(u32, u64)> {
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state): ppid is field 4, utime 14, stime 15.
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((ppid, utime + stime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_parent_and_cpu_time() {
        let stat = "4242 (postgres: a (b)) S 4200 4200 4200 0 -1 4194560 10 0 0 0 7 5 0 0 20 0 1 0 1 1 1";
        assert_eq!(own_ticks(stat), Some((4200, 12)));
        assert_eq!(own_ticks("garbage"), None);
    }

    #[test]
    fn cost_per_message() {
        let before = PgSample {
            statements: Some(100.0),
            wal_bytes: 1000.0,
            server_cpu_ticks: Some(10),
        };
        let after = PgSample {
            statements: Some(300.0),
            wal_bytes: 21_000.0,
            server_cpu_ticks: Some(110),
        };
        let c = before.cost_until(&after, 1000, 100).unwrap();
        assert_eq!(c.statements_per_msg, Some(0.2));
        assert_eq!(c.wal_bytes_per_msg, 20.0);
        assert_eq!(c.server_cpu_s_per_10k, Some(10.0));
        assert_eq!(before.cost_until(&after, 0, 100), None);
    }
}
