//! The relay's reads and settlements on a throwaway PostgreSQL cluster: partitions
//! split the rows and exclude each other, order holds within a group while a retry
//! waits, refusals end dead, and an unsettled delivery leaves its rows to be read again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::time::Duration;

use sendium_outbox::relay::{PgRelay, RelaySettings, RowOutcome};
use sendium_outbox::{Dialect, TableName, schema};
use sendium_storage::postgresql::test_cluster::TestCluster;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};

async fn source() -> PgPool {
    let url = TestCluster::shared().fresh_database();
    let pool = PgPoolOptions::new().max_connections(6).connect(&url).await.unwrap();
    let sql = schema(Dialect::Postgresql, &TableName::default());
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&pool).await.unwrap();
    pool
}

fn settings(partitions: u16) -> RelaySettings {
    RelaySettings {
        table: TableName::default(),
        partitions,
        batch_size: 100,
        retention: Duration::ZERO,
        max_attempts: 2,
    }
}

async fn insert(pool: &PgPool, to: &str, group: Option<&str>) -> i64 {
    sqlx::query(
        "INSERT INTO sendium_outbox (account, source_addr, destination_addr, body, group_key) \
         VALUES ('shop', 'Shop', $1, 'hello', $2) RETURNING id",
    )
    .bind(to)
    .bind(group)
    .fetch_one(pool)
    .await
    .unwrap()
    .get("id")
}

async fn status(pool: &PgPool, id: i64) -> Option<(String, i32)> {
    sqlx::query("SELECT status, attempts FROM sendium_outbox WHERE id = $1")
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
async fn partitions_split_the_rows_and_exclude_each_other() {
    let pool = source().await;
    let mut all = Vec::new();
    for n in 0..40 {
        all.push(insert(&pool, &format!("4477009{n:05}"), None).await);
    }
    let a = PgRelay::new(pool.clone(), settings(2));
    let b = PgRelay::new(pool.clone(), settings(2));

    let d0 = a.begin(0).await.unwrap().expect("partition 0 is free");
    assert!(b.begin(0).await.unwrap().is_none(), "held by the other relay");
    let d1 = b.begin(1).await.unwrap().expect("partition 1 is free");
    let (r0, r1) = (ids(d0.rows()), ids(d1.rows()));
    assert!(!r0.is_empty() && !r1.is_empty(), "{r0:?} {r1:?}");
    assert!(r0.windows(2).all(|w| w[0] < w[1]) && r1.windows(2).all(|w| w[0] < w[1]));
    let union: HashSet<i64> = r0.iter().chain(&r1).copied().collect();
    assert_eq!(union.len(), 40, "disjoint and complete");
    assert_eq!(union, all.iter().copied().collect());

    // Partition 0 settles; partition 1's relay dies without settling (rolled back).
    let outcomes: Vec<_> = r0.iter().map(|id| (*id, RowOutcome::Admitted)).collect();
    assert_eq!(d0.settle(&outcomes).await.unwrap().admitted, r0.len() as u64);
    d1.abandon().await.unwrap();
    let again = a.begin(1).await.unwrap().expect("released with its transaction");
    assert_eq!(ids(again.rows()), r1, "unsettled rows are read again");
    assert!(
        a.begin(0).await.unwrap().unwrap().rows().is_empty(),
        "admitted rows are gone"
    );
}

#[tokio::test]
async fn a_group_waits_for_its_retry_and_others_go_on() {
    let pool = source().await;
    let g1 = insert(&pool, "447700900001", Some("g")).await;
    let g2 = insert(&pool, "447700900001", Some("g")).await;
    let other = insert(&pool, "447700900002", Some("h")).await;
    let g3 = insert(&pool, "447700900001", Some("g")).await;
    let relay = PgRelay::new(pool.clone(), settings(1));

    let d = relay.begin(0).await.unwrap().unwrap();
    assert_eq!(ids(d.rows()), vec![g1, g2, other, g3]);
    let pipeline_full = RowOutcome::Retry {
        error: "pipeline full".into(),
        after: Duration::from_secs(60),
    };
    d.settle(&[
        (g1, pipeline_full),
        (g2, RowOutcome::Skipped),
        (other, RowOutcome::Admitted),
        (g3, RowOutcome::Skipped),
    ])
    .await
    .unwrap();
    assert_eq!(
        status(&pool, g1).await,
        Some(("pending".into(), 0)),
        "a retry counts no attempt"
    );
    let later = insert(&pool, "447700900003", None).await;
    let d = relay.begin(0).await.unwrap().unwrap();
    assert_eq!(ids(d.rows()), vec![later], "g waits behind its first row; others go on");
    d.settle(&[(later, RowOutcome::Admitted)]).await.unwrap();

    // Its retry due: the group resumes in order.
    sqlx::query("UPDATE sendium_outbox SET next_attempt_at = now() WHERE id = $1")
        .bind(g1)
        .execute(&pool)
        .await
        .unwrap();
    let d = relay.begin(0).await.unwrap().unwrap();
    assert_eq!(ids(d.rows()), vec![g1, g2, g3]);
}

#[tokio::test]
async fn a_poison_row_goes_dead_without_blocking_its_group() {
    let pool = source().await;
    let poison = insert(&pool, "not-a-number", Some("g")).await;
    let next = insert(&pool, "447700900001", Some("g")).await;
    let relay = PgRelay::new(pool.clone(), settings(1));
    let refused = || RowOutcome::Refused {
        error: "invalid destination_addr".into(),
        after: Duration::ZERO,
    };

    // Each attempt reads the group from its poison row and leaves the next one alone.
    for (attempt, after) in [(1, (1, 0, "pending")), (2, (0, 1, "dead"))] {
        let d = relay.begin(0).await.unwrap().unwrap();
        assert_eq!(ids(d.rows()), vec![poison, next], "attempt {attempt}");
        let s = d
            .settle(&[(poison, refused()), (next, RowOutcome::Skipped)])
            .await
            .unwrap();
        assert_eq!(
            (s.retried, s.dead),
            (after.0, after.1),
            "attempt {attempt} of max_attempts 2"
        );
        assert_eq!(status(&pool, poison).await, Some((after.2.into(), attempt)));
    }
    let error: String = sqlx::query("SELECT last_error FROM sendium_outbox WHERE id = $1")
        .bind(poison)
        .fetch_one(&pool)
        .await
        .unwrap()
        .get("last_error");
    assert_eq!(error, "invalid destination_addr");

    let d = relay.begin(0).await.unwrap().unwrap();
    assert_eq!(ids(d.rows()), vec![next], "the group goes on past its dead row");
}

#[tokio::test]
async fn kept_rows_are_forgotten_after_their_retention() {
    let pool = source().await;
    let id = insert(&pool, "447700900001", None).await;
    let relay = PgRelay::new(
        pool.clone(),
        RelaySettings {
            retention: Duration::from_millis(300),
            ..settings(1)
        },
    );
    let d = relay.begin(0).await.unwrap().unwrap();
    d.settle(&[(id, RowOutcome::Admitted)]).await.unwrap();
    assert_eq!(status(&pool, id).await, Some(("relayed".into(), 0)));
    assert!(relay.begin(0).await.unwrap().unwrap().rows().is_empty(), "relayed once");
    assert_eq!(relay.forget_relayed(100).await.unwrap(), 0, "kept within its retention");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(relay.forget_relayed(100).await.unwrap(), 1);
    assert_eq!(status(&pool, id).await, None);
}

#[tokio::test]
async fn an_outcome_for_a_row_not_read_is_refused() {
    let pool = source().await;
    let id = insert(&pool, "447700900001", None).await;
    let relay = PgRelay::new(pool.clone(), settings(1));
    let d = relay.begin(0).await.unwrap().unwrap();
    let e = d.settle(&[(id + 1, RowOutcome::Admitted)]).await.unwrap_err();
    assert!(e.to_string().contains("did not read"), "{e}");
    assert_eq!(status(&pool, id).await, Some(("pending".into(), 0)), "nothing settled");
}

#[tokio::test]
async fn a_group_commits_in_id_order_even_from_concurrent_transactions() {
    let pool = source().await;
    // T1 inserts a row of group g and stays open; T2's insert of the same group waits
    // for it, and takes its id only then — so T2's row is after T1's in id order
    // and commits after it.
    let mut t1 = pool.begin().await.unwrap();
    let first: i64 = sqlx::query(
        "INSERT INTO sendium_outbox (account, source_addr, destination_addr, body, group_key) \
         VALUES ('shop', 'Shop', '447700900001', 'first', 'g') RETURNING id",
    )
    .fetch_one(&mut *t1)
    .await
    .unwrap()
    .get("id");
    let p2 = pool.clone();
    let t2 = tokio::spawn(async move {
        let mut t2 = p2.begin().await.unwrap();
        let id: i64 = sqlx::query(
            "INSERT INTO sendium_outbox (account, source_addr, destination_addr, body, group_key) \
             VALUES ('shop', 'Shop', '447700900001', 'second', 'g') RETURNING id",
        )
        .fetch_one(&mut *t2)
        .await
        .unwrap()
        .get("id");
        t2.commit().await.unwrap();
        id
    });
    // Another group is not held up meanwhile.
    let other = insert(&pool, "447700900002", Some("h")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !t2.is_finished(),
        "the same group's insert waits for the open transaction"
    );
    let relay = PgRelay::new(pool.clone(), settings(1));
    let d = relay.begin(0).await.unwrap().unwrap();
    assert_eq!(ids(d.rows()), vec![other], "only committed rows are read");
    d.abandon().await.unwrap();
    t1.commit().await.unwrap();
    let second = t2.await.unwrap();
    assert!(second > first, "{second} after {first}");
    let d = relay.begin(0).await.unwrap().unwrap();
    assert_eq!(ids(d.rows()), vec![first, other, second]);
}

#[tokio::test]
async fn backlog_dead_rows_and_their_revival() {
    let pool = source().await;
    let relay = PgRelay::new(pool.clone(), settings(1));
    assert_eq!(relay.stats().await.unwrap().backlog, 0);
    let a = insert(&pool, "not-a-number", None).await;
    let b = insert(&pool, "447700900001", None).await;
    let stats = relay.stats().await.unwrap();
    assert_eq!((stats.backlog, stats.dead), (2, 0));
    assert!(stats.oldest.is_some());
    let refused = RowOutcome::Refused {
        error: "destination_addr: must be a phone number".into(),
        after: Duration::ZERO,
    };
    for _ in 0..2 {
        let d = relay.begin(0).await.unwrap().unwrap();
        d.settle(&[(a, refused.clone()), (b, RowOutcome::Skipped)])
            .await
            .unwrap();
    }
    let stats = relay.stats().await.unwrap();
    assert_eq!((stats.backlog, stats.dead), (1, 1));
    let dead = relay.dead(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].id, dead[0].attempts), (a, 2));
    assert_eq!(
        dead[0].last_error.as_deref(),
        Some("destination_addr: must be a phone number")
    );
    assert_eq!(
        relay
            .retry_dead(Some("00000000-0000-0000-0000-000000000000"))
            .await
            .unwrap(),
        0
    );
    assert_eq!(relay.retry_dead(Some(&dead[0].event_id)).await.unwrap(), 1);
    assert_eq!(
        status(&pool, a).await,
        Some(("pending".into(), 0)),
        "back with its attempts reset"
    );
    assert_eq!(relay.stats().await.unwrap().dead, 0);
}

#[tokio::test]
async fn a_read_after_a_position_holds_a_group_behind_its_unread_earlier_row() {
    let pool = source().await;
    // A (group g) takes its id and commits late; B (group h) commits meanwhile and is
    // read, moving the position past A.
    let mut ta = pool.begin().await.unwrap();
    let a: i64 = sqlx::query(
        "INSERT INTO sendium_outbox (account, source_addr, destination_addr, body, group_key) \
         VALUES ('shop', 'Shop', '447700900001', 'A', 'g') RETURNING id",
    )
    .fetch_one(&mut *ta)
    .await
    .unwrap()
    .get("id");
    let b = insert(&pool, "447700900002", Some("h")).await;
    let relay = PgRelay::new(pool.clone(), settings(1));
    let d = relay.begin(0).await.unwrap().unwrap();
    assert_eq!(ids(d.rows()), vec![b]);
    d.settle(&[(b, RowOutcome::Admitted)]).await.unwrap();
    ta.commit().await.unwrap();
    let c = insert(&pool, "447700900001", Some("g")).await;
    assert!(a < b && b < c);

    // From the position: C is held behind A, which lies before the position.
    let d = relay.begin_after(0, b).await.unwrap().unwrap();
    assert!(d.rows().is_empty(), "C waits for A: {:?}", ids(d.rows()));
    d.abandon().await.unwrap();
    // From the start: A, then C.
    let d = relay.begin_after(0, 0).await.unwrap().unwrap();
    assert_eq!(ids(d.rows()), vec![a, c]);
}
