//! The SQLite relay on a real database file: one relay per file (a second stands by),
//! rows read in id order outside any transaction, a group waiting for its retry,
//! refusals ending dead and revived, retention, and the backlog count.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sendium_outbox::relay::{RelaySettings, RowOutcome, SqliteRelay};
use sendium_outbox::{Dialect, TableName, schema};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Row, SqlitePool};

async fn database(dir: &tempfile::TempDir) -> (SqlitePool, String) {
    let path = dir.path().join("app.db");
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    let sql = schema(Dialect::Sqlite, &TableName::default());
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&pool).await.unwrap();
    (pool, format!("sqlite://{}", path.display()))
}

fn settings() -> RelaySettings {
    RelaySettings {
        table: TableName::default(),
        partitions: 1,
        batch_size: 100,
        retention: Duration::ZERO,
        max_attempts: 2,
    }
}

async fn insert(pool: &SqlitePool, to: &str, group: Option<&str>) -> i64 {
    sqlx::query(
        "INSERT INTO sendium_outbox (account, source_addr, destination_addr, body, group_key) \
         VALUES ('shop', 'Shop', ?1, 'hello', ?2) RETURNING id",
    )
    .bind(to)
    .bind(group)
    .fetch_one(pool)
    .await
    .unwrap()
    .get("id")
}

async fn status(pool: &SqlitePool, id: i64) -> Option<(String, i64)> {
    sqlx::query("SELECT status, attempts FROM sendium_outbox WHERE id = ?1")
        .bind(id)
        .fetch_optional(pool)
        .await
        .unwrap()
        .map(|r| (r.get("status"), r.get("attempts")))
}

fn ids(rows: &[sendium_outbox::relay::OutboxRow]) -> Vec<i64> {
    rows.iter().map(|r| r.id).collect()
}

#[tokio::test]
async fn one_relay_per_file_reads_in_order_and_settles() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, url) = database(&dir).await;
    let a = insert(&pool, "447700900001", None).await;
    let b = insert(&pool, "447700900002", None).await;
    let relay = SqliteRelay::open(&url, settings()).unwrap();
    let second = SqliteRelay::open(&url, settings()).unwrap();

    let d = relay.begin(0).await.unwrap().expect("the first relay takes the file");
    assert!(second.begin(0).await.unwrap().is_none(), "a second relay stands by");
    assert!(
        relay.begin(1).await.unwrap().is_none(),
        "a SQLite source has one partition"
    );
    assert_eq!(ids(d.rows()), vec![a, b]);
    assert_eq!(d.rows()[0].message.destination_addr, "447700900001");
    // The application writes while a delivery is being admitted: nothing is locked.
    let c = insert(&pool, "447700900003", None).await;
    let s = d.settle(&[(a, RowOutcome::Admitted)]).await.unwrap();
    assert_eq!(s.admitted, 1);
    assert_eq!(status(&pool, a).await, None, "deleted once admitted");
    let d = relay.begin(0).await.unwrap().unwrap();
    assert_eq!(ids(d.rows()), vec![b, c], "unsettled rows are read again");
    drop(d);
    relay.close().await;
    drop(relay);
    assert!(
        second.begin(0).await.unwrap().is_some(),
        "the lock is free once the first relay is gone"
    );
}

#[tokio::test]
async fn a_group_waits_for_its_retry_and_a_poison_row_goes_dead() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, url) = database(&dir).await;
    let poison = insert(&pool, "not-a-number", Some("g")).await;
    let next = insert(&pool, "447700900001", Some("g")).await;
    let other = insert(&pool, "447700900002", Some("h")).await;
    let relay = SqliteRelay::open(&url, settings()).unwrap();
    let refused = RowOutcome::Refused {
        error: "destination_addr: must be a phone number".into(),
        after: Duration::from_secs(60),
    };

    let d = relay.begin(0).await.unwrap().unwrap();
    assert_eq!(ids(d.rows()), vec![poison, next, other]);
    let s = d
        .settle(&[
            (poison, refused.clone()),
            (next, RowOutcome::Skipped),
            (other, RowOutcome::Admitted),
        ])
        .await
        .unwrap();
    assert_eq!((s.admitted, s.retried, s.dead), (1, 1, 0));
    assert_eq!(status(&pool, poison).await, Some(("pending".into(), 1)));
    let d = relay.begin(0).await.unwrap().unwrap();
    assert!(
        d.rows().is_empty(),
        "g waits behind its refused row: {:?}",
        ids(d.rows())
    );
    drop(d);

    sqlx::query("UPDATE sendium_outbox SET next_attempt_at = NULL WHERE id = ?1")
        .bind(poison)
        .execute(&pool)
        .await
        .unwrap();
    let d = relay.begin(0).await.unwrap().unwrap();
    assert_eq!(ids(d.rows()), vec![poison, next]);
    let s = d
        .settle(&[(poison, refused.clone()), (next, RowOutcome::Skipped)])
        .await
        .unwrap();
    assert_eq!(s.dead, 1, "max_attempts 2");
    let stats = relay.stats().await.unwrap();
    assert_eq!((stats.backlog, stats.dead), (1, 1));
    let d = relay.begin(0).await.unwrap().unwrap();
    assert_eq!(ids(d.rows()), vec![next], "the group goes on past its dead row");
    drop(d);

    let dead = relay.dead(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].id, dead[0].attempts), (poison, 2));
    assert_eq!(relay.retry_dead(None).await.unwrap(), 1);
    assert_eq!(status(&pool, poison).await, Some(("pending".into(), 0)));
}

#[tokio::test]
async fn transient_retries_count_no_attempt_and_kept_rows_are_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, url) = database(&dir).await;
    let a = insert(&pool, "447700900001", None).await;
    let relay = SqliteRelay::open(
        &url,
        RelaySettings {
            retention: Duration::from_millis(300),
            ..settings()
        },
    )
    .unwrap();
    let d = relay.begin(0).await.unwrap().unwrap();
    let s = d
        .settle(&[(
            a,
            RowOutcome::Retry {
                error: "the pending stage is full".into(),
                after: Duration::from_millis(200),
            },
        )])
        .await
        .unwrap();
    assert_eq!(s.retried, 1);
    assert_eq!(status(&pool, a).await, Some(("pending".into(), 0)));
    assert!(relay.begin(0).await.unwrap().unwrap().rows().is_empty(), "not due yet");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let d = relay.begin(0).await.unwrap().unwrap();
    assert_eq!(ids(d.rows()), vec![a], "due again");
    d.settle(&[(a, RowOutcome::Admitted)]).await.unwrap();
    assert_eq!(
        status(&pool, a).await,
        Some(("relayed".into(), 0)),
        "kept for its retention"
    );
    assert_eq!(relay.forget_relayed(100).await.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(relay.forget_relayed(100).await.unwrap(), 1);
    assert_eq!(status(&pool, a).await, None);
}

#[tokio::test]
async fn a_missing_database_file_is_an_error_not_a_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("absent.db").display());
    let relay = SqliteRelay::open(&url, settings()).unwrap();
    assert!(relay.begin(0).await.is_err());
    assert!(!dir.path().join("absent.db").exists());
}
