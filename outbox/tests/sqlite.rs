//! The SQLite outbox table on a real database file: its schema applies, an application
//! inserts only the message columns, and a rolled-back transaction leaves no row.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sendium_outbox::{Dialect, TableName, schema};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Row, SqlitePool};

async fn database(dir: &tempfile::TempDir, table: &str) -> SqlitePool {
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("app.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(std::time::Duration::from_secs(5));
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    let sql = schema(Dialect::Sqlite, &TableName::new(table).unwrap());
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&pool).await.unwrap();
    pool
}

#[tokio::test]
async fn inserts_need_only_the_message_columns_and_follow_the_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(&dir, "sendium_outbox").await;

    let mut tx = pool.begin().await.unwrap();
    for n in 0..3 {
        sqlx::query(
            "INSERT INTO sendium_outbox (account, source_addr, destination_addr, body, group_key) \
             VALUES ('shop', 'Shop', ?1, 'hello', 'g')",
        )
        .bind(format!("44770090010{n}"))
        .execute(&mut *tx)
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO sendium_outbox (account, source_addr, destination_addr, body) \
         VALUES ('shop', 'Shop', '447700900199', 'rolled back')",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();

    let rows = sqlx::query(
        "SELECT id, event_id, status, attempts, next_attempt_at, created_at FROM sendium_outbox ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 3);
    let mut events = std::collections::HashSet::new();
    for r in &rows {
        let event: String = r.get("event_id");
        // A version-4 UUID in its text form.
        let parsed = uuid::Uuid::parse_str(&event).unwrap_or_else(|e| panic!("{event}: {e}"));
        assert_eq!(parsed.get_version_num(), 4, "{event}");
        assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122, "{event}");
        events.insert(event);
        assert_eq!(r.get::<String, _>("status"), "pending");
        assert_eq!(r.get::<i64, _>("attempts"), 0);
        assert!(r.get::<Option<String>, _>("next_attempt_at").is_none());
        assert!(r.get::<String, _>("created_at").ends_with('Z'));
    }
    assert_eq!(events.len(), 3);
}

#[tokio::test]
async fn the_relay_index_is_partial_and_ids_are_never_reused() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(&dir, "order_sms").await;
    let insert = "INSERT INTO order_sms (account, source_addr, destination_addr, body) VALUES ('a', 's', 'd', 'b')";
    sqlx::query(insert).execute(&pool).await.unwrap();
    sqlx::query(insert).execute(&pool).await.unwrap();
    sqlx::query("DELETE FROM order_sms WHERE id = 2")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(insert).execute(&pool).await.unwrap();
    let max: i64 = sqlx::query("SELECT max(id) AS m FROM order_sms")
        .fetch_one(&pool)
        .await
        .unwrap()
        .get("m");
    assert_eq!(max, 3, "a deleted id is not handed out again");

    let partial: i64 = sqlx::query(
        "SELECT count(*) AS n FROM sqlite_master WHERE type = 'index' AND tbl_name = 'order_sms' AND sql LIKE '%WHERE%'",
    )
    .fetch_one(&pool)
    .await
    .unwrap()
    .get("n");
    assert_eq!(partial, 4);
    let bad = sqlx::query("UPDATE order_sms SET status = 'sent' WHERE id = 1")
        .execute(&pool)
        .await;
    assert!(bad.is_err(), "status is checked");
}
