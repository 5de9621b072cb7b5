//! The application side of the outbox benchmark: the outbox table in a PostgreSQL
//! database, a backlog of committed rows, and a paced trickle of one-row transactions
//! (each commit notifies the relay, as an application's would).

use std::time::{Duration, Instant};

use sendium_outbox::{Dialect, TableName, schema};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};

/// Rows per backlog statement (one transaction each).
const BACKLOG_CHUNK: u64 = 50_000;
/// Connections inserting the trickle side by side: one commit waits for its WAL flush,
/// so a single connection could not keep a fast trickle's pace.
const TRICKLE_WRITERS: u64 = 32;

/// Create the outbox table (and its trigger) in the database at `url`.
pub async fn create_table(url: &str) -> Result<PgPool, sqlx::Error> {
    let pool = PgPoolOptions::new()
        .max_connections(u32::try_from(TRICKLE_WRITERS).unwrap_or(32) + 2)
        .connect(url)
        .await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(schema(Dialect::Postgresql, &TableName::default())))
        .execute(&pool)
        .await?;
    Ok(pool)
}

/// Commit `rows` rows for `account` to destinations `<prefix><n>`, in transactions of
/// 50,000; how long it took.
pub async fn commit_backlog(pool: &PgPool, account: &str, prefix: &str, rows: u64) -> Result<Duration, sqlx::Error> {
    let started = Instant::now();
    let mut next = 0u64;
    while next < rows {
        let last = (next + BACKLOG_CHUNK).min(rows) - 1;
        sqlx::query(
            "INSERT INTO sendium_outbox (account, source_addr, destination_addr, body) \
             SELECT $1, 'Bench', $2 || lpad(g::text, 8, '0'), 'Your outbox message ' || g \
               FROM generate_series($3::int8, $4::int8) AS g",
        )
        .bind(account)
        .bind(prefix)
        .bind(i64::try_from(next).unwrap_or(i64::MAX))
        .bind(i64::try_from(last).unwrap_or(i64::MAX))
        .execute(pool)
        .await?;
        next = last + 1;
    }
    sqlx::query("ANALYZE sendium_outbox").execute(pool).await?;
    Ok(started.elapsed())
}

/// What a trickle did: rows committed, the rate achieved, and how long each insert
/// (its transaction, commit included) took at the 50th and 99th percentile.
#[derive(Debug, Clone, Copy)]
pub struct Trickle {
    pub rows: u64,
    pub rate: f64,
    pub commit_p50: Duration,
    pub commit_p99: Duration,
}

/// Insert one row per transaction at `rate` rows per second for `duration`.
pub async fn trickle(
    pool: &PgPool,
    account: &str,
    prefix: &str,
    rate: u32,
    duration: Duration,
) -> Result<Trickle, sqlx::Error> {
    let total = (f64::from(rate) * duration.as_secs_f64()) as u64;
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let start = tokio::time::Instant::now();
    let mut writers = Vec::new();
    for w in 0..TRICKLE_WRITERS {
        let (pool, account, prefix) = (pool.clone(), account.to_owned(), prefix.to_owned());
        writers.push(tokio::spawn(async move {
            let mut took = Vec::new();
            let mut n = w;
            while n < total {
                tokio::time::sleep_until(start + interval * u32::try_from(n).unwrap_or(u32::MAX)).await;
                let began = Instant::now();
                sqlx::query(
                    "INSERT INTO sendium_outbox (account, source_addr, destination_addr, body) \
                     VALUES ($1, 'Bench', $2, 'Your order is paid.')",
                )
                .bind(&account)
                .bind(format!("{prefix}{n:08}"))
                .execute(&pool)
                .await?;
                took.push(began.elapsed());
                n += TRICKLE_WRITERS;
            }
            Ok::<Vec<Duration>, sqlx::Error>(took)
        }));
    }
    let mut took = Vec::new();
    for w in writers {
        took.extend(w.await.map_err(|e| sqlx::Error::Protocol(e.to_string()))??);
    }
    let elapsed = start.elapsed().as_secs_f64();
    took.sort();
    let at = |q: f64| {
        took.get(((took.len() as f64 * q) as usize).min(took.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Ok(Trickle {
        rows: total,
        rate: total as f64 / elapsed.max(f64::EPSILON),
        commit_p50: at(0.5),
        commit_p99: at(0.99),
    })
}

/// `VACUUM` the table, as autovacuum would after a drained backlog: the steady state a
/// trickle is measured in.
pub async fn vacuum(pool: &PgPool) -> Result<Duration, sqlx::Error> {
    let started = Instant::now();
    sqlx::query("VACUUM (ANALYZE) sendium_outbox").execute(pool).await?;
    Ok(started.elapsed())
}

/// Rows not relayed yet.
pub async fn backlog(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query("SELECT count(*) AS n FROM sendium_outbox WHERE status = 'pending'")
        .fetch_one(pool)
        .await?
        .try_get("n")
}
