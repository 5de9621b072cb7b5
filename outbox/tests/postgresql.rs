//! The outbox table on a throwaway PostgreSQL cluster: its schema applies, and
//! `publish` inserts exactly when the application's transaction commits.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sendium_outbox::{Dialect, OutboxMessage, PublishError, TableName, publish, publish_to, schema};
use sendium_storage::postgresql::test_cluster::TestCluster;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};
use uuid::Uuid;

async fn database_with(tables: &[&str]) -> PgPool {
    let url = TestCluster::shared().fresh_database();
    let pool = PgPoolOptions::new().max_connections(4).connect(&url).await.unwrap();
    for t in tables {
        let sql = schema(Dialect::Postgresql, &TableName::new(t).unwrap());
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&pool).await.unwrap();
    }
    pool
}

async fn count(pool: &PgPool, table: &str) -> i64 {
    let sql = format!("SELECT count(*) AS n FROM {table}");
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .unwrap()
        .get("n")
}

#[tokio::test]
async fn committed_with_the_business_change_or_not_at_all() {
    let pool = database_with(&["sendium_outbox"]).await;
    sqlx::query("CREATE TABLE orders (id int PRIMARY KEY, paid bool NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();

    // Committed: the order is paid and its SMS is in the outbox.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO orders VALUES (1, true)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let sms = OutboxMessage::new("shop", "Shop", "447700900123", "Order 1 is paid.")
        .callback_url("http://127.0.0.1:9/receipts")
        .group_key("customer-7");
    let published = publish(&mut tx, &sms).await.unwrap();
    tx.commit().await.unwrap();

    // Rolled back: neither.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO orders VALUES (2, true)")
        .execute(&mut *tx)
        .await
        .unwrap();
    publish(
        &mut tx,
        &OutboxMessage::new("shop", "Shop", "447700900124", "Order 2 is paid."),
    )
    .await
    .unwrap();
    tx.rollback().await.unwrap();

    assert_eq!(count(&pool, "orders").await, 1);
    assert_eq!(count(&pool, "sendium_outbox").await, 1);
    let row = sqlx::query(
        "SELECT id, event_id, account, source_addr, destination_addr, body, callback_url, group_key, \
                status, attempts, next_attempt_at IS NULL AS due, lane, created_at <= now() AS stamped \
           FROM sendium_outbox",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(row.get::<i64, _>("id"), published.id);
    assert_eq!(row.get::<Uuid, _>("event_id"), published.event_id);
    assert_eq!(row.get::<String, _>("account"), "shop");
    assert_eq!(row.get::<String, _>("destination_addr"), "447700900123");
    assert_eq!(row.get::<String, _>("body"), "Order 1 is paid.");
    assert_eq!(
        row.get::<Option<String>, _>("callback_url").as_deref(),
        Some("http://127.0.0.1:9/receipts")
    );
    assert_eq!(row.get::<Option<String>, _>("group_key").as_deref(), Some("customer-7"));
    assert_eq!(row.get::<String, _>("status"), "pending");
    assert_eq!(row.get::<i32, _>("attempts"), 0);
    assert!(row.get::<bool, _>("due"));
    assert!((0..1024).contains(&row.get::<i32, _>("lane")));
    assert!(row.get::<bool, _>("stamped"));
}

#[tokio::test]
async fn plain_sql_inserts_need_only_the_message_columns() {
    let pool = database_with(&["sendium_outbox"]).await;
    for n in 0..3 {
        sqlx::query(
            "INSERT INTO sendium_outbox (account, source_addr, destination_addr, body, group_key) \
             VALUES ('shop', 'Shop', $1, 'hello', 'g')",
        )
        .bind(format!("44770090010{n}"))
        .execute(&pool)
        .await
        .unwrap();
    }
    let rows = sqlx::query("SELECT id, event_id, lane FROM sendium_outbox ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(rows.len(), 3);
    let ids: Vec<i64> = rows.iter().map(|r| r.get("id")).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids in insert order: {ids:?}");
    let events: std::collections::HashSet<Uuid> = rows.iter().map(|r| r.get("event_id")).collect();
    assert_eq!(events.len(), 3, "each row gets its own event id");
    // One group, one lane: one relay worker keeps the group's order.
    let lanes: std::collections::HashSet<i32> = rows.iter().map(|r| r.get("lane")).collect();
    assert_eq!(lanes.len(), 1);
}

#[tokio::test]
async fn an_event_is_published_once() {
    let pool = database_with(&["sendium_outbox"]).await;
    let id = Uuid::now_v7();
    let sms = OutboxMessage::new("shop", "Shop", "447700900123", "once").event_id(id);
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(publish(&mut tx, &sms).await.unwrap().event_id, id);
    tx.commit().await.unwrap();

    let mut tx = pool.begin().await.unwrap();
    match publish(&mut tx, &sms).await {
        Err(PublishError::DuplicateEvent(dup)) => assert_eq!(dup, id),
        other => panic!("expected DuplicateEvent, got {other:?}"),
    }
    tx.rollback().await.unwrap();
    assert_eq!(count(&pool, "sendium_outbox").await, 1);
}

#[tokio::test]
async fn empty_fields_are_refused_before_the_insert() {
    let pool = database_with(&["sendium_outbox"]).await;
    let mut tx = pool.begin().await.unwrap();
    for (sms, field) in [
        (OutboxMessage::new("", "Shop", "447700900123", "x"), "account"),
        (OutboxMessage::new("shop", "Shop", "", "x"), "destination_addr"),
        (OutboxMessage::new("shop", "Shop", "447700900123", ""), "body"),
    ] {
        match publish(&mut tx, &sms).await {
            Err(PublishError::Empty(f)) => assert_eq!(f, field),
            other => panic!("expected Empty({field}), got {other:?}"),
        }
    }
    // The transaction is still usable: nothing was sent to the server.
    publish(&mut tx, &OutboxMessage::new("shop", "Shop", "447700900123", "ok"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(count(&pool, "sendium_outbox").await, 1);
}

#[tokio::test]
async fn tables_of_other_names_live_side_by_side() {
    let pool = database_with(&["sendium_outbox", "order_sms", "invoice_sms"]).await;
    let mut tx = pool.begin().await.unwrap();
    let sms = OutboxMessage::new("shop", "Shop", "447700900123", "x");
    publish_to(&mut tx, &TableName::new("order_sms").unwrap(), &sms)
        .await
        .unwrap();
    publish_to(&mut tx, &TableName::new("invoice_sms").unwrap(), &sms)
        .await
        .unwrap();
    publish_to(&mut tx, &TableName::new("invoice_sms").unwrap(), &sms)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(count(&pool, "sendium_outbox").await, 0);
    assert_eq!(count(&pool, "order_sms").await, 1);
    assert_eq!(count(&pool, "invoice_sms").await, 2);
    let indexes: i64 =
        sqlx::query("SELECT count(*) AS n FROM pg_indexes WHERE tablename = 'invoice_sms' AND indexdef LIKE '%WHERE%'")
            .fetch_one(&pool)
            .await
            .unwrap()
            .get("n");
    assert_eq!(indexes, 4, "the four partial indexes");
}

#[tokio::test]
async fn a_committed_insert_notifies_the_relay() {
    let pool = database_with(&["order_sms"]).await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await.unwrap();
    listener.listen("order_sms").await.unwrap();

    let mut tx = pool.begin().await.unwrap();
    publish_to(
        &mut tx,
        &TableName::new("order_sms").unwrap(),
        &OutboxMessage::new("shop", "Shop", "447700900123", "x"),
    )
    .await
    .unwrap();
    // Nothing is announced before the commit.
    let early = tokio::time::timeout(std::time::Duration::from_millis(200), listener.recv()).await;
    assert!(early.is_err(), "notified before the commit: {early:?}");
    tx.commit().await.unwrap();
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification after the commit")
        .unwrap();
    assert_eq!(n.channel(), "order_sms");
}
