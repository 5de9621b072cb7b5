//! The outbox relay end to end: an application commits a business change and its outbox
//! row together (PostgreSQL on a throwaway cluster, or a real SQLite file), and the real
//! gateway relays the row to the test SMSC and its receipt to the callback. A rolled
//! back transaction sends nothing; a gateway SIGKILLed between admission and settlement
//! sends every row once after its restart; two processes share one source; a group
//! keeps its order; a poison row goes dead alone; a source whose database goes away is
//! named by `/readyz` and relayed again when it returns.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{HashMap, HashSet};
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use sendium_integration_tests::{CallbackServer, GatewayProcess, TestSmsc, sendium_command};
use sendium_outbox::{Dialect, OutboxMessage, TableName, publish, schema};
use sendium_storage::postgresql::test_cluster::TestCluster;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{PgPool, Row, SqlitePool};
use support::*;

/// The application's database: its own `orders` table and the outbox table.
async fn pg_app(url: &str) -> PgPool {
    let pool = PgPoolOptions::new().max_connections(8).connect(url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(schema(Dialect::Postgresql, &TableName::default())))
        .execute(&pool)
        .await
        .unwrap();
    sqlx::raw_sql("CREATE TABLE orders (id bigint PRIMARY KEY, paid boolean NOT NULL DEFAULT false)")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

async fn sqlite_app(path: &std::path::Path) -> SqlitePool {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(schema(Dialect::Sqlite, &TableName::default())))
        .execute(&pool)
        .await
        .unwrap();
    pool
}

/// `[[outbox.sources]]` named `shop` at `url`, plus `extra` keys.
fn source(url: &str, extra: &str) -> String {
    format!(
        "[[outbox.sources]]\nname = \"shop\"\nurl = \"{url}\"\npoll-interval = \"200ms\"\nmax-backoff = \"1s\"\n{extra}\n"
    )
}

fn file_profile_with(outbox: &str) -> String {
    format!("{}\n{outbox}", durable_config("[dlr]\nbackend = \"file\""))
}

/// Mark order `order` paid and publish its SMS in one transaction; commit or roll back.
async fn pay(pool: &PgPool, order: i64, to: &str, callback: Option<&str>, commit: bool) {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id, paid) VALUES ($1, true)")
        .bind(order)
        .execute(&mut *tx)
        .await
        .unwrap();
    let mut m = OutboxMessage::new("esme1", "Shop", to, format!("Order {order} is paid."));
    if let Some(c) = callback {
        m = m.callback_url(c);
    }
    publish(&mut tx, &m).await.unwrap();
    if commit {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
}

async fn insert_pg(pool: &PgPool, account: &str, to: &str, body: &str, group: Option<&str>) -> i64 {
    sqlx::query(
        "INSERT INTO sendium_outbox (account, source_addr, destination_addr, body, group_key) \
         VALUES ($1, 'Shop', $2, $3, $4) RETURNING id",
    )
    .bind(account)
    .bind(to)
    .bind(body)
    .bind(group)
    .fetch_one(pool)
    .await
    .unwrap()
    .get("id")
}

async fn rows_left_pg(pool: &PgPool) -> i64 {
    sqlx::query("SELECT count(*) AS n FROM sendium_outbox WHERE status <> 'dead'")
        .fetch_one(pool)
        .await
        .unwrap()
        .get("n")
}

/// `/admin/outbox`'s entry for `shop`.
async fn view(gw: &GatewayProcess) -> serde_json::Value {
    let (status, body) = gw.admin_get("/admin/outbox").await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v.as_array()
        .and_then(|a| a.iter().find(|s| s["name"] == "shop"))
        .cloned()
        .unwrap_or_else(|| panic!("no source shop in {body}"))
}

/// `relayed_total` of `gw` once it stops changing (a delivery is settled just after its
/// messages may already have reached the SMSC).
async fn relayed_total(gw: &GatewayProcess) -> u64 {
    let mut last = None;
    loop {
        let n = view(gw).await["relayed_total"].as_u64().unwrap();
        if last == Some(n) {
            return n;
        }
        last = Some(n);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Destinations the SMSC got, with how many times each.
fn arrivals(smsc: &TestSmsc) -> HashMap<String, usize> {
    let mut n = HashMap::new();
    for m in smsc.messages() {
        *n.entry(m.destination).or_default() += 1;
    }
    n
}

fn cli(args: &[&str]) -> (bool, String) {
    let out = sendium_command().args(args).output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_row_is_sent_with_its_receipt_and_a_rolled_back_one_never_leaves() {
    let url = TestCluster::shared().fresh_database();
    let app = pg_app(&url).await;
    let smsc = smsc().await;
    let cb = CallbackServer::start().await;
    let gw = gateway(&file_profile_with(&source(&url, "partitions = 2")), &smsc).await;

    pay(&app, 1042, "447700900142", Some(&cb.url("/dlr")), true).await;
    pay(&app, 1043, "447700900143", Some(&cb.url("/dlr")), false).await;
    assert!(smsc.wait_messages(1, WAIT).await, "the committed row reaches the SMSC");
    let m = &smsc.messages_to("447700900142")[0];
    assert_eq!(m.text, "Order 1042 is paid.");
    assert!(cb.wait_accepted(1, WAIT).await, "its receipt reaches the callback");
    assert_eq!(cb.receipts()[0].status, "DELIVRD");
    // The rolled-back one is not in the table, so it can never be sent.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(smsc.messages().len(), 1);
    assert!(smsc.messages_to("447700900143").is_empty());
    assert_eq!(rows_left_pg(&app).await, 0, "a relayed row leaves the outbox");

    assert_eq!(relayed_total(&gw).await, 1);
    let v = view(&gw).await;
    assert_eq!(v["dialect"], "postgresql");
    assert_eq!(v["reachable"], true, "{v}");
    assert!(
        wait_metric(&gw, "sendium_outbox_relayed_total", "source=\"shop\"", |n| n == 1.0).await,
        "relay counter"
    );
    assert!(
        wait_metric(&gw, "sendium_outbox_backlog_rows", "source=\"shop\"", |n| n == 0.0).await,
        "backlog gauge"
    );
    let (_, metrics) = gw.admin_get("/metrics").await;
    assert!(
        metrics.contains("sendium_outbox_relay_delay_seconds_bucket{source=\"shop\""),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_source_relays_committed_rows_and_keeps_them_for_their_retention() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let app = sqlite_app(&path).await;
    let smsc = smsc().await;
    let cb = CallbackServer::start().await;
    let url = format!("sqlite://{}", path.display());
    let gw = gateway(&file_profile_with(&source(&url, "retention = \"1h\"")), &smsc).await;

    let mut tx = app.begin().await.unwrap();
    for n in 0..20 {
        sqlx::query(
            "INSERT INTO sendium_outbox (account, source_addr, destination_addr, body, callback_url, group_key) \
             VALUES ('esme1', 'Shop', ?1, ?2, ?3, ?4)",
        )
        .bind(format!("4477009002{n:02}"))
        .bind(format!("sqlite {n}"))
        .bind(cb.url("/dlr"))
        .bind(format!("g{}", n % 3))
        .execute(&mut *tx)
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
    let mut tx = app.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO sendium_outbox (account, source_addr, destination_addr, body) \
         VALUES ('esme1', 'Shop', '447700900299', 'rolled back')",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();

    assert!(smsc.wait_messages(20, WAIT).await, "{}", smsc.messages().len());
    assert!(cb.wait_accepted(20, WAIT).await);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(smsc.messages().len(), 20);
    let kept: i64 = sqlx::query("SELECT count(*) AS n FROM sendium_outbox WHERE status = 'relayed'")
        .fetch_one(&app)
        .await
        .unwrap()
        .get("n");
    assert_eq!(kept, 20, "kept as relayed for the retention");
    assert_eq!(view(&gw).await["dialect"], "sqlite");
    assert_eq!(relayed_total(&gw).await, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_admission_and_settlement_every_row_arrives_once() {
    let url = TestCluster::shared().fresh_database();
    let app = pg_app(&url).await;
    let smsc = smsc().await;
    let config = file_profile_with(&source(&url, "partitions = 2\nbatch-size = 50"));
    let mut gw = GatewayProcess::builder(&config)
        .smsc_port(smsc.port())
        .env("SENDIUM_FAILPOINT", "outbox-admitted@3")
        .spawn();
    let want: HashSet<String> = (0..400).map(|n| format!("4477009{n:05}")).collect();
    for to in &want {
        insert_pg(&app, "esme1", to, "crash", None).await;
    }
    let status = gw.wait_exit(WAIT).await;
    assert_eq!(
        status.and_then(|s| s.signal()),
        Some(9),
        "killed at outbox-admitted\n{}",
        gw.log()
    );
    assert!(gw.log().contains("FAILPOINT"), "{}", gw.log());
    assert!(rows_left_pg(&app).await > 0, "the crash left rows to relay");
    // What the dead process had sent is still read by the SMSC: count once it is.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before: HashSet<String> = arrivals(&smsc).into_keys().collect();
    gw.restart().await;
    let deadline = Instant::now() + WAIT;
    while arrivals(&smsc).len() < want.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = arrivals(&smsc);
    let missing: Vec<_> = want.iter().filter(|d| !got.contains_key(*d)).take(5).collect();
    assert!(
        missing.is_empty(),
        "{} rows never arrived, e.g. {missing:?}",
        want.len() - got.len()
    );
    // A message the provider had when the process died may be submitted again (the
    // pipeline's at-least-once); a row admitted twice would be a second message of a
    // row the dead process never sent.
    let twice: Vec<_> = got
        .iter()
        .filter(|(d, n)| **n > 1 && !before.contains(*d))
        .take(5)
        .collect();
    assert!(twice.is_empty(), "admitted twice: {twice:?}");
    assert_eq!(rows_left_pg(&app).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_a_source_and_one_killed_leaves_the_rest_to_the_other() {
    let url = TestCluster::shared().fresh_database();
    let app = pg_app(&url).await;
    let smsc = smsc().await;
    let config = format!(
        "{}\n{}",
        memory_config(),
        source(&url, "partitions = 4\nbatch-size = 20")
    );
    let a = gateway(&config, &smsc).await;
    let mut b = gateway(&config, &smsc).await;
    let mut want = HashSet::new();
    for n in 0..300 {
        let to = format!("4478009{n:05}");
        insert_pg(&app, "esme1", &to, "shared", None).await;
        want.insert(to);
        if n % 50 == 49 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(smsc.wait_messages(300, WAIT).await, "{}", smsc.messages().len());
    let (ra, rb) = (relayed_total(&a).await, relayed_total(&b).await);
    eprintln!("relayed by a: {ra}, by b: {rb}");
    assert_eq!(ra + rb, 300, "each row relayed by one of them: {ra} + {rb}");

    // B dies; A relays what comes next.
    b.kill();
    for n in 300..400 {
        let to = format!("4478009{n:05}");
        insert_pg(&app, "esme1", &to, "shared", None).await;
        want.insert(to);
    }
    assert!(smsc.wait_messages(400, WAIT).await, "{}", smsc.messages().len());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = arrivals(&smsc);
    assert_eq!(got.keys().cloned().collect::<HashSet<_>>(), want);
    assert!(got.values().all(|n| *n == 1), "a row sent twice");
    assert_eq!(view(&a).await["partitions"], 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_keeps_its_order_under_concurrent_inserts() {
    let url = TestCluster::shared().fresh_database();
    let app = pg_app(&url).await;
    let smsc = smsc().await;
    let gw = gateway(
        &format!(
            "{}\n{}",
            memory_config(),
            source(&url, "partitions = 4\nbatch-size = 7")
        ),
        &smsc,
    )
    .await;
    // Four writers, each inserting rows of all four groups in its own transactions.
    let mut writers = Vec::new();
    for w in 0..4 {
        let app = app.clone();
        writers.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for n in 0..40 {
                let group = format!("order-{}", (w + n) % 4);
                let to = format!("44790000{}", (w + n) % 4);
                let body = format!("w{w} n{n}");
                ids.push((
                    group.clone(),
                    insert_pg(&app, "esme1", &to, &body, Some(&group)).await,
                    body,
                ));
            }
            ids
        }));
    }
    let mut by_group: HashMap<String, Vec<(i64, String)>> = HashMap::new();
    for w in writers {
        for (group, id, body) in w.await.unwrap() {
            by_group.entry(group).or_default().push((id, body));
        }
    }
    assert!(smsc.wait_messages(160, WAIT).await, "{}", smsc.messages().len());
    for g in 0..4 {
        let mut rows = by_group.remove(&format!("order-{g}")).unwrap();
        rows.sort();
        let expected: Vec<String> = rows.into_iter().map(|(_, b)| b).collect();
        let got: Vec<String> = smsc
            .messages_to(&format!("44790000{g}"))
            .into_iter()
            .map(|m| m.text)
            .collect();
        assert_eq!(got, expected, "group order-{g} arrives in id order");
    }
    assert_eq!(relayed_total(&gw).await, 160);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_row_goes_dead_alone_and_the_cli_lists_and_revives_it() {
    let url = TestCluster::shared().fresh_database();
    let app = pg_app(&url).await;
    let smsc = smsc().await;
    let gw = gateway(
        &format!("{}\n{}", memory_config(), source(&url, "max-attempts = 2")),
        &smsc,
    )
    .await;
    insert_pg(&app, "nobody", "447700900401", "poison", Some("g")).await;
    insert_pg(&app, "esme1", "447700900402", "behind the poison", Some("g")).await;
    insert_pg(&app, "esme1", "447700900403", "bad number next", Some("h")).await;
    insert_pg(&app, "esme1", "not-a-number", "bad number", None).await;
    for n in 0..10 {
        insert_pg(&app, "esme1", &format!("44770090050{n}"), "neighbour", None).await;
    }
    // Neighbours do not wait for the poison rows.
    assert!(
        smsc.wait_messages(11, Duration::from_secs(5)).await,
        "{:?}",
        arrivals(&smsc)
    );
    assert!(smsc.messages_to("447700900402").is_empty(), "its group waits");
    // Refused twice (1 s apart), dead; then its group goes on.
    assert!(smsc.wait_messages(12, WAIT).await, "{:?}", arrivals(&smsc));
    assert_eq!(smsc.messages_to("447700900402").len(), 1);
    assert!(
        wait_metric(&gw, "sendium_outbox_dead_rows", "source=\"shop\"", |n| n == 2.0).await,
        "both poison rows are dead"
    );
    let v = view(&gw).await;
    assert_eq!(v["dead_total"], 2, "{v}");

    let config = gw.config_path().to_str().unwrap().to_owned();
    let (ok, out) = cli(&["outbox", "dead", "--config", &config, "--source", "shop"]);
    assert!(ok, "{out}");
    assert!(out.starts_with("2 dead row(s) in source shop"), "{out}");
    assert!(out.contains("account \"nobody\" is not configured"), "{out}");
    assert!(out.contains("destination_addr: must be a phone number"), "{out}");
    assert!(!out.contains("poison"), "bodies are not listed: {out}");
    let (ok, out) = cli(&["outbox", "dead", "--config", &config, "--source", "nope"]);
    assert!(!ok && out.contains("no outbox source named \"nope\""), "{out}");

    let event_id: String = sqlx::query("SELECT event_id::text AS e FROM sendium_outbox WHERE account = 'nobody'")
        .fetch_one(&app)
        .await
        .unwrap()
        .get("e");
    // The operator fixes the row, then revives it.
    sqlx::query("UPDATE sendium_outbox SET account = 'esme1' WHERE account = 'nobody'")
        .execute(&app)
        .await
        .unwrap();
    let (ok, out) = cli(&[
        "outbox",
        "retry",
        "--config",
        &config,
        "--source",
        "shop",
        "--event-id",
        &event_id,
    ]);
    assert!(ok && out.starts_with("1 dead row(s) of source shop put back"), "{out}");
    assert!(smsc.wait_messages(13, WAIT).await, "the revived row is sent");
    assert_eq!(smsc.messages_to("447700900401").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_database_going_away_is_named_and_relayed_again_when_it_returns() {
    let cluster = TestCluster::start();
    let url = cluster.fresh_database();
    let app = pg_app(&url).await;
    let smsc = smsc().await;
    let gw = gateway(&format!("{}\n{}", memory_config(), source(&url, "")), &smsc).await;
    insert_pg(&app, "esme1", "447700900601", "before", None).await;
    assert!(smsc.wait_messages(1, WAIT).await);
    app.close().await;

    cluster.stop_server().unwrap();
    let deadline = Instant::now() + WAIT;
    let body = loop {
        let (status, body) = gw.admin_get("/readyz").await;
        assert_eq!(status, 200, "the gateway stays ready: {body}");
        if body.contains("outbox source shop") {
            break body;
        }
        assert!(Instant::now() < deadline, "readyz never named the source: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(body.contains("degraded"), "{body}");
    assert_eq!(view(&gw).await["reachable"], false);
    // The rest of the gateway serves on.
    let r = gw
        .post_message(
            "key-1",
            r#"{"from":"Shop","to":"447700900602","text":"http while down"}"#,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 202, "{}", r.text());
    assert!(smsc.wait_messages(2, WAIT).await);

    cluster.start_server().unwrap();
    let app = pg_app_reconnect(&url).await;
    insert_pg(&app, "esme1", "447700900603", "after", None).await;
    assert!(smsc.wait_messages(3, WAIT).await, "relayed again once it returns");
    let deadline = Instant::now() + WAIT;
    while view(&gw).await["reachable"] != true {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, body) = gw.admin_get("/readyz").await;
    assert!(!body.contains("degraded"), "{body}");
}

async fn pg_app_reconnect(url: &str) -> PgPool {
    let deadline = Instant::now() + WAIT;
    loop {
        match PgPoolOptions::new().max_connections(2).connect(url).await {
            Ok(p) => return p,
            Err(e) => {
                assert!(Instant::now() < deadline, "{e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_committed_after_later_ids_were_relayed_is_still_relayed() {
    let url = TestCluster::shared().fresh_database();
    let app = pg_app(&url).await;
    let smsc = smsc().await;
    let _gw = gateway(&format!("{}\n{}", memory_config(), source(&url, "")), &smsc).await;
    // The first row's transaction stays open while a later one commits and is relayed:
    // the relay has read past the first row's id before it becomes visible.
    let mut slow = app.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO sendium_outbox (account, source_addr, destination_addr, body) \
         VALUES ('esme1', 'Shop', '447700900701', 'slow transaction')",
    )
    .execute(&mut *slow)
    .await
    .unwrap();
    for n in 2..5 {
        insert_pg(&app, "esme1", &format!("44770090070{n}"), "fast", None).await;
    }
    assert!(smsc.wait_messages(3, WAIT).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    slow.commit().await.unwrap();
    assert!(
        smsc.wait_messages(4, Duration::from_secs(5)).await,
        "read again from the start within the poll interval"
    );
    assert_eq!(smsc.messages_to("447700900701").len(), 1);
}
