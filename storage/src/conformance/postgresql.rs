//! Test-only module: compiled under `#[cfg(test)]` (see its `mod` declaration).
//!
//! The conformance suite against the postgresql backends, and the cases only a shared
//! database has: two stores on one database stand for two Sendium processes
//! (two pools, two sets of connections).

use std::sync::Arc;

use async_trait::async_trait;

use super::{DlrFactory, Factory};
use crate::conformance::ops::DlrOps as _;
use crate::dlr::{DlrRetention, DlrStore};
use crate::memory::PendingLimits;
use crate::pending::PendingStore;
use crate::postgresql::PostgresDlrStore;
use crate::postgresql::test_cluster::TestCluster;
use crate::postgresql::{PgStageOptions, PgStages};
use crate::routed_work::RoutedWorkStore;
use crate::router_queue::RouterQueueStore;

/// Every store gets a fresh database on the test binary's shared cluster.
pub(crate) struct PgFactory;

impl PgFactory {
    async fn stages(&self, limits: PendingLimits) -> PgStages {
        let url = TestCluster::shared().fresh_database();
        PgStages::connect(&url, PgStageOptions::new(4, limits))
            .await
            .expect("connect")
    }
}

#[async_trait]
impl DlrFactory for PgFactory {
    async fn dlr(&self, _capacity: u64, retention: DlrRetention) -> Arc<dyn DlrStore> {
        let url = TestCluster::shared().fresh_database();
        Arc::new(PostgresDlrStore::connect(&url, 4, retention).await.expect("connect"))
    }
}

#[async_trait]
impl Factory for PgFactory {
    async fn pending(&self, limits: PendingLimits) -> Arc<dyn PendingStore> {
        self.stages(limits).await.pending
    }
    async fn router_queue(&self) -> Arc<dyn RouterQueueStore> {
        self.stages(PendingLimits::default()).await.router_queue
    }
    async fn routed_work(&self) -> Arc<dyn RoutedWorkStore> {
        self.stages(PendingLimits::default()).await.routed_work
    }
}

/// Every case of the conformance suite against PostgreSQL.
mod suite {
    use super::PgFactory;
    crate::conformance::sms_cases!(PgFactory);
    crate::conformance::dlr_cases!(PgFactory);
}

// ---------------------------------------------------------------------------------
// PostgreSQL-only cases: several processes on one database, restarts, migrations.
// ---------------------------------------------------------------------------------

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::fixtures::{account_target, outcome_of, receipt, retention, unit_handoff};
use crate::dlr::{
    ClaimScope, Delivery, DeliveryFinish, DeliveryResult, DlrState, Handoff, HandoffOutcome, ProviderReceipt,
    ReceiptMatch, ReceiptTarget, ReplyPath,
};
use crate::error::FailureKind;
use crate::ids::{MessageId, Timestamp, UnitId};
use crate::postgresql::PgDlrOptions;

const LEASE: Duration = Duration::from_secs(30);

fn target(account: &str) -> ReceiptTarget {
    account_target(account, ReplyPath::Smpp)
}

fn handoff(unit: UnitId, keys: Vec<String>, targets: Vec<ReceiptTarget>) -> Handoff {
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    unit_handoff(unit, &keys, targets)
}

fn delivered(key: &str) -> ProviderReceipt {
    receipt(key, DlrState::Delivered)
}

fn kind(e: &crate::error::DlrError) -> FailureKind {
    let crate::error::DlrError::Backend(f) = e;
    f.kind
}

/// Two stores on one fresh database: two processes.
async fn two_processes() -> (String, PostgresDlrStore, PostgresDlrStore) {
    let url = TestCluster::shared().fresh_database();
    let a = PostgresDlrStore::connect(&url, 4, retention()).await.unwrap();
    let b = PostgresDlrStore::connect(&url, 4, retention()).await.unwrap();
    (url, a, b)
}

async fn sql_count(url: &str, sql: &'static str) -> i64 {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let n: i64 = sqlx::query_scalar(sql).fetch_one(&pool).await.unwrap();
    pool.close().await;
    n
}

/// `n` resolved messages with one SMPP target each: `n` pending deliveries.
async fn resolved_messages(s: &PostgresDlrStore, n: usize) {
    let tag = MessageId::generate();
    let keys: Vec<String> = (0..n).map(|i| format!("{tag}-{i}")).collect();
    for chunk in keys.chunks(500) {
        let hs = chunk
            .iter()
            .map(|k| handoff(MessageId::generate(), vec![k.clone()], vec![target("esme1")]))
            .collect();
        s.hand_off(hs).await.unwrap();
        s.record_receipts(chunk.iter().map(|k| delivered(k)).collect())
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_never_claim_the_same_delivery() {
    let (_url, a, b) = two_processes().await;
    resolved_messages(&a, 2_000).await;
    let stores = [Arc::new(a), Arc::new(b)];
    let now = Timestamp::now().saturating_add(Duration::from_secs(1));
    let mut tasks = Vec::new();
    for w in 0..6 {
        let s = stores[w % 2].clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = s.claim_due(now, LEASE, 37, ClaimScope::All).await.unwrap();
                if got.is_empty() {
                    return mine;
                }
                s.finish(
                    got.iter()
                        .map(|d| DeliveryFinish {
                            id: d.id,
                            attempt: d.attempt,
                            result: DeliveryResult::Delivered,
                        })
                        .collect(),
                )
                .await
                .unwrap();
                mine.extend(got.into_iter().map(|d| (d.id, d.attempt)));
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let distinct: HashSet<_> = all.iter().map(|(id, _)| *id).collect();
    assert_eq!(all.len(), 2_000, "every delivery claimed once");
    assert_eq!(distinct.len(), 2_000, "no delivery claimed twice");
    assert!(all.iter().all(|(_, attempt)| *attempt == 1));
    assert_eq!(stores[1].stats().await.unwrap().pending_deliveries, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_receipts_from_two_processes_resolve_each_message_once() {
    const MESSAGES: usize = 300;
    const PARTS: usize = 3;
    let (url, a, b) = two_processes().await;
    let tag = MessageId::generate();
    let mut handoffs = Vec::new();
    let mut receipts = Vec::new();
    for m in 0..MESSAGES {
        let keys: Vec<String> = (0..PARTS).map(|p| format!("{tag}-{m}-{p}")).collect();
        receipts.extend(keys.iter().map(|k| delivered(k)));
        handoffs.push(handoff(
            MessageId::generate(),
            keys,
            vec![target("esme1"), target("esme2")],
        ));
    }
    for chunk in handoffs.chunks(100) {
        a.hand_off(chunk.to_vec()).await.unwrap();
    }
    // Every receipt reaches both processes (an SMSC resending to another session),
    // one in order and one in reverse, in batches: the same messages' parts race.
    let forward = receipts.clone();
    let mut backward = receipts;
    backward.reverse();
    let (a, b) = (Arc::new(a), Arc::new(b));
    let run = |s: Arc<PostgresDlrStore>, rs: Vec<ProviderReceipt>| {
        tokio::spawn(async move {
            let mut out = Vec::new();
            for chunk in rs.chunks(50) {
                let m = s.record_receipts(chunk.to_vec()).await.unwrap();
                out.extend(chunk.iter().map(|r| r.keys[0].clone()).zip(m));
            }
            out
        })
    };
    let ta = run(a.clone(), forward);
    let tb = run(b.clone(), backward);
    let mut results = ta.await.unwrap();
    results.extend(tb.await.unwrap());

    let mut per_key: HashMap<String, (u32, u32)> = HashMap::new();
    let mut resolutions: HashMap<UnitId, u32> = HashMap::new();
    for (key, m) in &results {
        let e = per_key.entry(key.clone()).or_default();
        match m {
            ReceiptMatch::Matched { unit, resolved } => {
                e.0 += 1;
                if *resolved {
                    *resolutions.entry(*unit).or_default() += 1;
                }
            }
            ReceiptMatch::Duplicate { .. } => e.1 += 1,
            ReceiptMatch::Orphaned => panic!("{key} was correlated"),
        }
    }
    assert!(
        per_key.values().all(|&(m, d)| m == 1 && d == 1),
        "each part accepted once"
    );
    assert_eq!(resolutions.len(), MESSAGES);
    assert!(resolutions.values().all(|&n| n == 1), "each message resolved once");

    let later = Timestamp::now().saturating_add(Duration::from_secs(1));
    let mut claimed: Vec<Delivery> = Vec::new();
    loop {
        let got = b.claim_due(later, LEASE, 500, ClaimScope::All).await.unwrap();
        if got.is_empty() {
            break;
        }
        claimed.extend(got);
    }
    assert_eq!(claimed.len(), MESSAGES * 2, "one delivery per receipt target");
    let targets: HashSet<MessageId> = claimed.iter().map(|d| d.target.submit_id).collect();
    assert_eq!(targets.len(), MESSAGES * 2, "no target got two deliveries");

    // The maintained counters agree with the tables.
    let st = a.stats().await.unwrap();
    assert_eq!(st.awaiting_receipts, 0);
    assert_eq!(st.pending_deliveries, (MESSAGES * 2) as u64);
    assert_eq!(
        st.correlations as i64,
        sql_count(&url, "SELECT count(*) FROM dlr_correlations WHERE unit IS NOT NULL").await
    );
    assert_eq!(
        st.pending_deliveries as i64,
        sql_count(&url, "SELECT count(*) FROM dlr_deliveries").await
    );
}

#[tokio::test]
async fn a_stale_attempt_from_another_process_is_ignored() {
    let (_url, a, b) = two_processes().await;
    resolved_messages(&a, 1).await;
    let t0 = Timestamp::now().saturating_add(Duration::from_secs(1));
    let first = a.claim_due(t0, LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(first.len(), 1);
    // Process A stalls past its lease; B claims the delivery again.
    let t1 = t0.saturating_add(LEASE).saturating_add(Duration::from_secs(1));
    let second = b.claim_due(t1, LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(second.len(), 1);
    assert_eq!((second[0].id, second[0].attempt), (first[0].id, 2));
    a.finish(vec![DeliveryFinish {
        id: first[0].id,
        attempt: first[0].attempt,
        result: DeliveryResult::Dead,
    }])
    .await
    .unwrap();
    assert_eq!(
        b.stats().await.unwrap().pending_deliveries,
        1,
        "A's stale result is ignored"
    );
    b.finish(vec![DeliveryFinish {
        id: second[0].id,
        attempt: second[0].attempt,
        result: DeliveryResult::Delivered,
    }])
    .await
    .unwrap();
    assert_eq!(a.stats().await.unwrap().pending_deliveries, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrations_applied_by_several_processes_at_once() {
    let url = TestCluster::shared().fresh_database();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            PostgresDlrStore::connect(&url, 1, retention()).await.map(|_| ())
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    // And again, as a restart would.
    let s = PostgresDlrStore::connect(&url, 1, retention()).await.unwrap();
    s.hand_off(vec![handoff(
        MessageId::generate(),
        vec!["m".into()],
        vec![target("e")],
    )])
    .await
    .unwrap();
    assert_eq!(
        sql_count(&url, "SELECT count(*) FROM _sqlx_migrations").await,
        crate::postgresql::migrate::MIGRATIONS.len() as i64
    );
    assert_eq!(s.stats().await.unwrap().awaiting_receipts, 1);
}

/// A database migrated by a newer Sendium (a migration this build does not know) is
/// refused at connect, naming the version, rather than written with an old schema.
#[tokio::test]
async fn a_schema_from_a_newer_version_is_refused() {
    let url = TestCluster::shared().fresh_database();
    PostgresDlrStore::connect(&url, 1, retention()).await.unwrap();
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (9999, 'from the future', true, '\\x00'::bytea, 0)",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    let Err(e) = PostgresDlrStore::connect(&url, 1, retention()).await else {
        panic!("a newer schema was accepted");
    };
    assert_eq!(e.kind, FailureKind::UnsupportedVersion, "{e}");
    assert!(e.to_string().contains("9999"), "{e}");
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable_without_leaking_the_password() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://sendium:hunter2@127.0.0.1:{port}/dlr");
    let started = Instant::now();
    let e = PostgresDlrStore::connect(&url, 1, retention()).await.unwrap_err();
    assert_eq!(e.kind, FailureKind::Unavailable);
    assert_eq!(e.location, format!("postgresql 127.0.0.1:{port}/dlr"));
    assert!(!e.to_string().contains("hunter2"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// A dedicated cluster (the shared one must stay up): the server crashes and comes
/// back; committed state survives, the same store reconnects by itself, and while the
/// server is down every call answers Unavailable within the acquire timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_a_server_crash_and_is_unavailable_while_down() {
    let cluster = TestCluster::start();
    let url = cluster.fresh_database();
    let mut options = PgDlrOptions::new(2, retention());
    options.acquire_timeout = Duration::from_millis(500);
    let s = PostgresDlrStore::connect_with(&url, options).await.unwrap();
    let unit = MessageId::generate();
    s.hand_off(vec![handoff(
        unit,
        vec!["c1".into(), "c2".into()],
        vec![target("esme1")],
    )])
    .await
    .unwrap();
    s.record_receipts(vec![delivered("c1")]).await.unwrap();

    cluster.stop_server().unwrap();
    let started = Instant::now();
    let e = s.stats().await.unwrap_err();
    assert_eq!(kind(&e), FailureKind::Unavailable, "{e}");
    let e = s.record_receipts(vec![delivered("c2")]).await.unwrap_err();
    assert_eq!(kind(&e), FailureKind::Unavailable, "{e}");
    let e = s
        .claim_due(Timestamp::now(), LEASE, 10, ClaimScope::All)
        .await
        .unwrap_err();
    assert_eq!(kind(&e), FailureKind::Unavailable, "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "no hang: {:?}",
        started.elapsed()
    );

    cluster.start_server().unwrap();
    // The pool drops its dead connections and reconnects.
    let st = s.stats().await.unwrap();
    assert_eq!(
        (st.awaiting_receipts, st.correlations),
        (1, 2),
        "committed state survived the crash"
    );
    let m = s.record_receipts(vec![delivered("c2")]).await.unwrap();
    assert_eq!(m, vec![ReceiptMatch::Matched { unit, resolved: true }]);
    let m = s.record_receipts(vec![delivered("c1")]).await.unwrap();
    assert_eq!(
        m,
        vec![ReceiptMatch::Duplicate { unit }],
        "c1 was recorded before the crash"
    );
    // A new process sees the same.
    let other = PostgresDlrStore::connect(&url, 1, retention()).await.unwrap();
    let due = other
        .claim_due(
            Timestamp::now().saturating_add(Duration::from_secs(1)),
            LEASE,
            10,
            ClaimScope::All,
        )
        .await
        .unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(outcome_of(&due[0]).state, DlrState::Delivered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn receipts_racing_their_handoffs_in_another_process_are_never_stranded() {
    const MESSAGES: usize = 1_000;
    let (_url, a, b) = two_processes().await;
    let tag = MessageId::generate();
    let keys: Vec<String> = (0..MESSAGES).map(|i| format!("{tag}-{i}")).collect();
    let handoffs: Vec<Handoff> = keys
        .iter()
        .map(|k| handoff(MessageId::generate(), vec![k.clone()], vec![target("esme1")]))
        .collect();
    // Receipts in another order than the handoffs, so some come first and some race.
    let mut receipts: Vec<ProviderReceipt> = keys.iter().map(|k| delivered(k)).collect();
    receipts.reverse();
    let (a, b) = (Arc::new(a), Arc::new(b));
    let ha = {
        let a = a.clone();
        tokio::spawn(async move {
            for c in handoffs.chunks(50) {
                a.hand_off(c.to_vec()).await.unwrap();
            }
        })
    };
    let rb = {
        let b = b.clone();
        tokio::spawn(async move {
            for c in receipts.chunks(50) {
                b.record_receipts(c.to_vec()).await.unwrap();
            }
        })
    };
    ha.await.unwrap();
    rb.await.unwrap();
    let st = a.stats().await.unwrap();
    assert_eq!(st.orphans, 0, "every early receipt was adopted by its handoff");
    assert_eq!(st.awaiting_receipts, 0, "every message resolved");
    assert_eq!(st.pending_deliveries, MESSAGES as u64, "exactly one delivery each");
}

#[tokio::test]
async fn earlier_provider_ids_keep_matching_after_a_resubmission() {
    let (_url, a, b) = two_processes().await;
    let unit = MessageId::generate();
    let h = handoff(unit, vec!["first".into()], vec![target("esme1")]);
    a.hand_off(vec![h.clone()]).await.unwrap();
    let mut again = h;
    again.outcome = HandoffOutcome::Submitted {
        provider_keys: vec!["second".into()],
    };
    b.hand_off(vec![again]).await.unwrap();
    // The first submission's receipt is recognised (not an orphan) but does not decide.
    let m = a.record_receipts(vec![delivered("first")]).await.unwrap();
    assert_eq!(m, vec![ReceiptMatch::Matched { unit, resolved: false }]);
    assert_eq!(a.stats().await.unwrap().orphans, 0);
    let m = b.record_receipts(vec![delivered("second")]).await.unwrap();
    assert_eq!(m, vec![ReceiptMatch::Matched { unit, resolved: true }]);
    let m = a.record_receipts(vec![delivered("first")]).await.unwrap();
    assert_eq!(m, vec![ReceiptMatch::Duplicate { unit }]);
    let due = a
        .claim_due(
            Timestamp::now().saturating_add(Duration::from_secs(1)),
            LEASE,
            10,
            ClaimScope::All,
        )
        .await
        .unwrap();
    assert_eq!(due.len(), 1);
}

#[tokio::test]
async fn a_correlation_without_its_branch_does_not_wedge_receipts() {
    let (url, a, _b) = two_processes().await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    // Not producible through the store; written by hand to prove the fallback.
    sqlx::query(
        "INSERT INTO dlr_correlations (destination, provider_key, unit, branch, part, gen)
         VALUES ('up', 'dangling', gen_random_uuid(), 0, 0, 1)",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    let m = a.record_receipts(vec![delivered("dangling")]).await.unwrap();
    assert_eq!(m, vec![ReceiptMatch::Orphaned]);
    // A handoff of that id takes the row over and matches normally.
    let unit = MessageId::generate();
    a.hand_off(vec![handoff(unit, vec!["dangling".into()], vec![target("esme1")])])
        .await
        .unwrap();
    let m = a.record_receipts(vec![delivered("dangling")]).await.unwrap();
    assert_eq!(m, vec![ReceiptMatch::Matched { unit, resolved: true }]);
}

#[tokio::test]
async fn a_batch_repeating_one_branch_and_one_receipt_many_times() {
    let (_url, a, _b) = two_processes().await;
    let unit = MessageId::generate();
    let h = handoff(unit, vec!["r1".into(), "r2".into()], vec![target("esme1")]);
    a.hand_off(vec![h; 40]).await.unwrap();
    assert_eq!(a.stats().await.unwrap().awaiting_receipts, 1);
    let mut batch = vec![delivered("r1"); 40];
    batch.push(delivered("r2"));
    let m = a.record_receipts(batch).await.unwrap();
    assert_eq!(m[0], ReceiptMatch::Matched { unit, resolved: false });
    assert!(m[1..40].iter().all(|x| *x == ReceiptMatch::Duplicate { unit }));
    assert_eq!(m[40], ReceiptMatch::Matched { unit, resolved: true });
    assert_eq!(a.stats().await.unwrap().pending_deliveries, 1);
}

/// Throughput on the shared test cluster (fsync on). Not a unit test:
/// `cargo test -p sendium-storage --release bench_postgresql_dlr -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "benchmark: run explicitly with --ignored --nocapture"]
async fn bench_postgresql_dlr() {
    const MESSAGES: usize = 40_000;
    println!("postgresql DLR store, fsync=on, {MESSAGES} messages (1 provider part, 1 receipt target) per row");
    println!("| batch | writers | handoffs/s | receipts/s | claim+finish/s |");
    println!("|---:|---:|---:|---:|---:|");
    for (batch, writers) in [(100, 1), (1000, 1), (100, 4), (1000, 4)] {
        let url = TestCluster::shared().fresh_database();
        let s = Arc::new(PostgresDlrStore::connect(&url, 8, retention()).await.unwrap());
        let tag = MessageId::generate();
        let keys: Vec<String> = (0..MESSAGES).map(|i| format!("{tag}-{i}")).collect();
        let handoffs: Vec<Handoff> = keys
            .iter()
            .map(|k| handoff(MessageId::generate(), vec![k.clone()], vec![target("esme1")]))
            .collect();
        let receipts: Vec<ProviderReceipt> = keys.iter().map(|k| delivered(k)).collect();

        // Split the work into `writers` interleaved shares of `batch`-sized batches.
        async fn parallel<T: Clone + Send + Sync + 'static, F, Fut>(
            items: &[T],
            batch: usize,
            writers: usize,
            f: F,
        ) -> f64
        where
            F: Fn(Vec<T>) -> Fut + Send + Sync + Clone + 'static,
            Fut: std::future::Future<Output = ()> + Send,
        {
            let chunks: Vec<Vec<T>> = items.chunks(batch).map(|c| c.to_vec()).collect();
            let mut shares: Vec<Vec<Vec<T>>> = vec![Vec::new(); writers];
            for (i, c) in chunks.into_iter().enumerate() {
                shares[i % writers].push(c);
            }
            let started = Instant::now();
            let tasks: Vec<_> = shares
                .into_iter()
                .map(|share| {
                    let f = f.clone();
                    tokio::spawn(async move {
                        for c in share {
                            f(c).await;
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
            items.len() as f64 / started.elapsed().as_secs_f64()
        }

        let st = s.clone();
        let h = parallel(&handoffs, batch, writers, move |c| {
            let st = st.clone();
            async move { st.hand_off(c).await.unwrap() }
        })
        .await;
        let st = s.clone();
        let r = parallel(&receipts, batch, writers, move |c| {
            let st = st.clone();
            async move {
                st.record_receipts(c).await.unwrap();
            }
        })
        .await;
        // Claimers: each claims `batch` and finishes them, until nothing is due.
        let now = Timestamp::now().saturating_add(Duration::from_secs(1));
        let started = Instant::now();
        let tasks: Vec<_> = (0..writers)
            .map(|_| {
                let s = s.clone();
                tokio::spawn(async move {
                    let mut n = 0usize;
                    loop {
                        let got = s.claim_due(now, LEASE, batch, ClaimScope::All).await.unwrap();
                        if got.is_empty() {
                            return n;
                        }
                        n += got.len();
                        s.finish(
                            got.iter()
                                .map(|d| DeliveryFinish {
                                    id: d.id,
                                    attempt: d.attempt,
                                    result: DeliveryResult::Delivered,
                                })
                                .collect(),
                        )
                        .await
                        .unwrap();
                    }
                })
            })
            .collect();
        let mut claimed = 0;
        for t in tasks {
            claimed += t.await.unwrap();
        }
        let c = claimed as f64 / started.elapsed().as_secs_f64();
        assert_eq!(claimed, MESSAGES);
        println!("| {batch} | {writers} | {h:.0} | {r:.0} | {c:.0} |");
        s.close().await;
    }

    // End to end through the store, the stages running at once as in the gateway:
    // handoffs, receipts for what was handed off, claims + finishes of what resolved.
    for batch in [100, 500] {
        let url = TestCluster::shared().fresh_database();
        let s = Arc::new(PostgresDlrStore::connect(&url, 8, retention()).await.unwrap());
        let tag = MessageId::generate();
        let keys: Vec<String> = (0..MESSAGES).map(|i| format!("{tag}-{i}")).collect();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<String>>();
        let started = Instant::now();
        let handing = {
            let s = s.clone();
            let keys = keys.clone();
            tokio::spawn(async move {
                for c in keys.chunks(batch) {
                    let hs = c
                        .iter()
                        .map(|k| handoff(MessageId::generate(), vec![k.clone()], vec![target("esme1")]))
                        .collect();
                    s.hand_off(hs).await.unwrap();
                    tx.send(c.to_vec()).unwrap();
                }
            })
        };
        let receiving = {
            let s = s.clone();
            tokio::spawn(async move {
                while let Some(c) = rx.recv().await {
                    s.record_receipts(c.iter().map(|k| delivered(k)).collect())
                        .await
                        .unwrap();
                }
            })
        };
        let mut done = 0;
        while done < MESSAGES {
            let got = s
                .claim_due(Timestamp::now(), LEASE, batch, ClaimScope::All)
                .await
                .unwrap();
            if got.is_empty() {
                tokio::time::sleep(Duration::from_millis(2)).await;
                continue;
            }
            done += got.len();
            s.finish(
                got.iter()
                    .map(|d| DeliveryFinish {
                        id: d.id,
                        attempt: d.attempt,
                        result: DeliveryResult::Delivered,
                    })
                    .collect(),
            )
            .await
            .unwrap();
        }
        handing.await.unwrap();
        receiving.await.unwrap();
        println!(
            "end to end (handoff -> receipt -> claim -> finish, stages concurrent), batch {batch}: {:.0} messages/s",
            MESSAGES as f64 / started.elapsed().as_secs_f64()
        );
        s.close().await;
    }
}

// ---------------------------------------------------------------------------------
// Inbound (MO) messages: restarts, several processes, the schema 4 upgrade.
// ---------------------------------------------------------------------------------

use crate::conformance::dlr::{mo_http, mo_key, mo_message, mo_part, routed, routed_group, store_parts};
use crate::dlr::{ClaimCreated, DeliveryContent, DlrWrite};
use crate::inbound::{InboundGroup, InboundPart};

fn in_an_hour() -> Timestamp {
    Timestamp::now().saturating_add(Duration::from_secs(3600))
}

/// Held parts and inbound deliveries (one due, one claimed by its step) are there for a
/// new store on the same database, as they were.
#[tokio::test]
async fn inbound_parts_and_messages_survive_a_new_store() {
    let url = TestCluster::shared().fresh_database();
    let a = PostgresDlrStore::connect(&url, 2, retention()).await.unwrap();
    let (open_key, conflict_key) = (mo_key(1, 3), mo_key(2, 2));
    store_parts(
        &a,
        vec![
            mo_part(&open_key, 1, "one ", in_an_hour()),
            mo_part(&open_key, 3, "three", in_an_hour()),
            mo_part(&conflict_key, 1, "old", in_an_hour()),
        ],
    )
    .await;
    let closed = store_parts(&a, vec![mo_part(&conflict_key, 1, "new", in_an_hour())]).await;
    assert_eq!(closed.len(), 1);
    let due_smpp = routed("esme1", ReplyPath::Smpp, mo_message("due"), None);
    let claimed_http = routed("web", mo_http(), mo_message("claimed"), None);
    let out = a
        .apply(DlrWrite {
            inbound: vec![claimed_http.clone(), due_smpp.clone()],
            claim_created: Some(ClaimCreated { lease: LEASE, limit: 1 }),
            ..DlrWrite::default()
        })
        .await;
    out.inbound.unwrap();
    assert_eq!(out.claimed.len(), 1);
    let stats = a.stats().await.unwrap();
    assert_eq!((stats.inbound_parts, stats.pending_deliveries), (4, 2));
    a.close().await;

    let b = PostgresDlrStore::connect(&url, 2, retention()).await.unwrap();
    let st = b.stats().await.unwrap();
    assert_eq!((st.inbound_parts, st.pending_deliveries), (4, 2));
    let later = Timestamp::now().saturating_add(Duration::from_secs(1));
    assert_eq!(b.due_inbound_groups(later, 10).await.unwrap(), closed);
    let c = b.claim_due(later, LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(c.len(), 1, "the claimed one is still leased: {c:?}");
    assert_eq!(
        (&c[0].target, &c[0].content),
        (
            &due_smpp.target(),
            &DeliveryContent::Inbound(Box::new(due_smpp.message))
        )
    );
    let complete = store_parts(&b, vec![mo_part(&open_key, 2, "two ", in_an_hour())]).await;
    assert_eq!(complete.len(), 1);
    assert_eq!(complete[0].assemble("").unwrap().payload, b"one two three");
}

/// The parts of `groups` messages of `parts` parts each.
fn parts_of(groups: u16, parts: u8) -> Vec<InboundPart> {
    let deadline = in_an_hour();
    (0..groups)
        .flat_map(|g| (1..=parts).map(move |seq| mo_part(&mo_key(g, parts), seq, &format!("{g}/{seq} "), deadline)))
        .collect()
}

/// Two processes receive every part of the same messages (a provider resending to
/// another session), in opposite orders and concurrent steps: each message ends as one
/// complete group, reported complete by exactly one step.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_placing_one_groups_parts_end_with_one_complete_group() {
    const GROUPS: u16 = 60;
    const PARTS: u8 = 4;
    let (_url, a, b) = two_processes().await;
    let forward = parts_of(GROUPS, PARTS);
    let mut backward = forward.clone();
    backward.reverse();
    let run = |s: Arc<PostgresDlrStore>, parts: Vec<InboundPart>| {
        tokio::spawn(async move {
            let mut reported: Vec<InboundGroup> = Vec::new();
            for chunk in parts.chunks(7) {
                reported.extend(store_parts(&*s, chunk.to_vec()).await);
            }
            reported
        })
    };
    let (a, b) = (Arc::new(a), Arc::new(b));
    let ta = run(a.clone(), forward.clone());
    let tb = run(b.clone(), backward);
    let mut reported = ta.await.unwrap();
    reported.extend(tb.await.unwrap());
    assert_eq!(reported.len(), usize::from(GROUPS), "each complete group reported once");
    let keys: HashSet<_> = reported.iter().map(|g| g.key.clone()).collect();
    assert_eq!(keys.len(), usize::from(GROUPS));
    assert!(reported.iter().all(|g| g.is_complete() && !g.closed), "{reported:?}");
    let st = a.stats().await.unwrap();
    assert_eq!(
        st.inbound_parts,
        u64::from(GROUPS) * u64::from(PARTS),
        "no part stored twice"
    );
    let due = b
        .due_inbound_groups(Timestamp::now().saturating_add(Duration::from_secs(1)), 1_000)
        .await
        .unwrap();
    assert_eq!(due.len(), usize::from(GROUPS), "one group per message, none closed");
    for g in &due {
        let text = g.assemble("").unwrap().payload;
        let no = g.key.reference;
        let expected: String = (1..=PARTS).map(|seq| format!("{no}/{seq} ")).collect();
        assert_eq!(text, expected.as_bytes());
    }
}

/// Two processes write the same complete groups (each told by its own step, or by
/// `due_inbound_groups`) at once: one delivery per group, every part gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_writing_the_same_groups_create_one_delivery_each() {
    const GROUPS: u16 = 80;
    let (_url, a, b) = two_processes().await;
    let mut complete = Vec::new();
    for chunk in parts_of(GROUPS, 3).chunks(30) {
        complete.extend(store_parts(&a, chunk.to_vec()).await);
    }
    assert_eq!(complete.len(), usize::from(GROUPS));
    let forward: Vec<_> = complete.iter().map(routed_group).collect();
    let mut backward = forward.clone();
    backward.reverse();
    let run = |s: Arc<PostgresDlrStore>, messages: Vec<crate::inbound::RoutedInbound>| {
        tokio::spawn(async move {
            for chunk in messages.chunks(9) {
                let out = s
                    .apply(DlrWrite {
                        inbound: chunk.to_vec(),
                        ..DlrWrite::default()
                    })
                    .await;
                out.inbound.unwrap();
            }
        })
    };
    let (a, b) = (Arc::new(a), Arc::new(b));
    let ta = run(a.clone(), forward);
    let tb = run(b.clone(), backward);
    ta.await.unwrap();
    tb.await.unwrap();
    let st = a.stats().await.unwrap();
    assert_eq!((st.pending_deliveries, st.inbound_parts), (u64::from(GROUPS), 0));
    let due = b
        .claim_due(
            Timestamp::now().saturating_add(Duration::from_secs(1)),
            LEASE,
            1_000,
            ClaimScope::All,
        )
        .await
        .unwrap();
    let ids: HashSet<_> = due.iter().map(|d| d.target.submit_id).collect();
    assert_eq!(ids.len(), usize::from(GROUPS), "one delivery per message");
}

/// A database of schema version 4 with a receipt delivery pending upgrades at connect,
/// and the delivery is still a receipt.
#[tokio::test]
async fn a_schema_4_database_upgrades_and_its_deliveries_are_receipts() {
    use sqlx::migrate::{Migration, MigrationType, Migrator};
    use sqlx::{Connection, SqlSafeStr};

    let url = TestCluster::shared().fresh_database();
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let up_to_4 = Migrator::with_migrations(
        crate::postgresql::migrate::MIGRATIONS
            .iter()
            .filter(|(version, _, _)| *version <= 4)
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
    );
    up_to_4.run_direct(None, &mut conn, false).await.unwrap();
    let submit_id = MessageId::generate();
    let target = format!(
        r#"{{"v":1,"submit_id":"{submit_id}","account":"esme1","reply":"smpp","source":{{"ton":5,"npi":0,"addr":"Shop"}},"destination":{{"ton":1,"npi":1,"addr":"447700900123"}},"submitted_at":1,"failure_only":false}}"#
    );
    let now = i64::try_from(Timestamp::now().0).unwrap();
    sqlx::query(
        "INSERT INTO dlr_deliveries (unit, branch, account, smpp, target, state, error, done_at, due_at, created_at,
                                     expires_at)
         VALUES ($1, 0, 'esme1', true, $2::jsonb, 2, '000', $3, $3, $3, $3 + 3600000)",
    )
    .bind(MessageId::generate().as_uuid())
    .bind(target)
    .bind(now)
    .execute(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();

    let s = PostgresDlrStore::connect(&url, 1, retention()).await.unwrap();
    let due = s
        .claim_due(
            Timestamp::now().saturating_add(Duration::from_secs(1)),
            LEASE,
            10,
            ClaimScope::All,
        )
        .await
        .unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].target.submit_id, submit_id);
    assert_eq!(outcome_of(&due[0]).state, DlrState::Delivered);
    assert_eq!(
        sql_count(&url, "SELECT count(*) FROM _sqlx_migrations").await,
        crate::postgresql::migrate::MIGRATIONS.len() as i64
    );
    // And it stores inbound messages from now on.
    store_parts(&s, vec![mo_part(&mo_key(1, 2), 1, "a", in_an_hour())]).await;
    assert_eq!(s.stats().await.unwrap().inbound_parts, 1);
}

// ---------------------------------------------------------------------------------
// The outbound stages shared by several processes: partitions and their ownership.
// ---------------------------------------------------------------------------------

use crate::conformance::ops::{PendingOps as _, RouterQueueOps as _};
use crate::ids::ReadySeq;
use crate::postgresql::{Ownership, StageAccess};
use crate::router_queue::StagedUnit;

async fn stages_on(url: &str, access: StageAccess, partitions: u16) -> Result<PgStages, crate::BackendFailure> {
    let options = PgStageOptions {
        access,
        partitions,
        ..PgStageOptions::new(4, PendingLimits::default())
    };
    PgStages::connect(url, options).await
}

/// The partitions newly releasing or held, waited for (polling) until there are some.
async fn releasing(o: &Ownership, within: Duration, what: &str) -> Vec<u16> {
    let deadline = Instant::now() + within;
    loop {
        let r = o.assignment().releasing;
        if !r.is_empty() {
            return r;
        }
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Wait until `cond` holds, polling.
async fn eventually(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_processes_split_the_partitions_and_take_over_a_dead_ones() {
    let url = TestCluster::shared().fresh_database();
    let a = stages_on(&url, StageAccess::Shared, 8).await.unwrap();
    let oa = a.ownership();
    assert_eq!(
        oa.status().held,
        (0..8).collect::<Vec<u16>>(),
        "alone, it holds every partition"
    );
    let b = stages_on(&url, StageAccess::Shared, 8).await.unwrap();
    let ob = b.ownership();
    assert!(ob.status().held.is_empty(), "a newcomer takes only free partitions");

    // A sees two members and hands back what exceeds its share; nothing moves until
    // its pipeline says the work there is settled.
    let mut surplus = releasing(&oa, Duration::from_secs(5), "A releasing").await;
    surplus.sort_unstable();
    assert_eq!(surplus.len(), 4);
    assert_eq!(oa.assignment().active.len(), 4, "no new work from what it hands back");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(ob.status().held.is_empty(), "B waits for A to settle them");
    oa.released(surplus.clone());
    eventually(Duration::from_secs(5), "B adopts", || ob.assignment().active.len() == 4).await;
    assert_eq!(ob.assignment().active, surplus, "B takes exactly what A handed back");
    eventually(Duration::from_secs(3), "A holds four", || oa.status().held.len() == 4).await;
    let (ha, hb): (HashSet<u16>, HashSet<u16>) = (
        oa.status().held.into_iter().collect(),
        ob.status().held.into_iter().collect(),
    );
    assert!(ha.is_disjoint(&hb));
    assert_eq!(ha.len() + hb.len(), 8);
    let holders = a.partition_holders().await.unwrap();
    assert_eq!(holders.len(), 8, "every partition has one holder: {holders:?}");

    // Each reads the work of its own partitions only, and nothing staged or routed.
    // Every fourth is urgent: each process reads its partitions' urgent units first.
    let records: Vec<_> = (0..64)
        .map(|i| {
            let mut r = super::record("esme1", &format!("4477009{i:05}"), "x");
            r.route_priority = if i % 4 == 3 { 9 } else { 0 };
            r
        })
        .collect();
    a.pending.admit(records.clone()).await.unwrap();
    let ra = a.pending.ready_after(crate::ReadyCursor::START, 1_000).await.unwrap();
    let rb = b.pending.ready_after(crate::ReadyCursor::START, 1_000).await.unwrap();
    assert_eq!(ra.len() + rb.len(), 64, "each unit read by exactly one process");
    for read in [&ra, &rb] {
        let order: Vec<(std::cmp::Reverse<u8>, u64)> = read
            .iter()
            .map(|u| (std::cmp::Reverse(u.seq.lane()), u.seq.counter()))
            .collect();
        assert!(order.is_sorted(), "highest lane first, arrival order within: {order:?}");
        assert!(read.iter().any(|u| u.seq.lane() == 9) && read.iter().any(|u| u.seq.lane() == 0));
    }
    for u in &ra {
        let p = crate::postgresql::partition_of(&u.unit.parts[0].account, &u.unit.parts[0].destination.addr, 8);
        assert!(ha.contains(&p));
    }
    let first = StagedUnit {
        id: ra[0].unit.id,
        seq: ra[0].seq,
    };
    a.router_queue.stage(&[first], first.seq).await.unwrap();
    let again = a.pending.ready_after(crate::ReadyCursor::START, 1_000).await.unwrap();
    assert_eq!(again.len(), ra.len() - 1, "a staged unit is not selected again");
    assert_eq!(a.router_queue.staged_after(ReadySeq(0), 10).await.unwrap(), vec![first]);
    assert!(b.router_queue.staged_after(ReadySeq(0), 10).await.unwrap().is_empty());

    // A dies: its connections close, and B takes its partitions within seconds.
    let started = Instant::now();
    drop(a);
    drop(oa);
    eventually(Duration::from_secs(5), "B takes over", || {
        ob.assignment().active.len() == 8
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(ob.status().held, (0..8).collect::<Vec<u16>>());
    assert_eq!(
        b.pending
            .ready_after(crate::ReadyCursor::START, 1_000)
            .await
            .unwrap()
            .len(),
        63
    );
    assert_eq!(b.router_queue.staged_after(ReadySeq(0), 10).await.unwrap(), vec![first]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sole_process_and_shared_ones_exclude_each_other() {
    let url = TestCluster::shared().fresh_database();
    let sole = stages_on(&url, StageAccess::Sole, 16).await.unwrap();
    let e = stages_on(&url, StageAccess::Shared, 16).await.err().expect("refused");
    assert!(e.to_string().contains("serving this database alone"), "{e}");
    let e = stages_on(&url, StageAccess::Sole, 16).await.err().expect("refused");
    assert!(e.to_string().contains("another Sendium process"), "{e}");
    drop(sole);
    let shared = stages_on(&url, StageAccess::Shared, 16).await.unwrap();
    let e = stages_on(&url, StageAccess::Sole, 16).await.err().expect("refused");
    assert!(e.to_string().contains("another Sendium process"), "{e}");
    // A process that only reads takes no lock.
    stages_on(&url, StageAccess::ReadOnly, 16).await.unwrap();
    drop(shared);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_process_spreads_work_over_the_same_partitions() {
    let url = TestCluster::shared().fresh_database();
    // Empty and alone: the number may change.
    drop(stages_on(&url, StageAccess::Sole, 8).await.unwrap());
    let s = stages_on(&url, StageAccess::Sole, 4).await.unwrap();
    s.pending
        .admit(vec![super::record("esme1", "447700900001", "x")])
        .await
        .unwrap();
    drop(s);
    // Work is spread over 4: another number is refused until it is gone.
    let e = stages_on(&url, StageAccess::Sole, 8).await.err().expect("refused");
    assert!(e.to_string().contains("spread over 4 partitions"), "{e}");
    let shared = stages_on(&url, StageAccess::Shared, 4).await.unwrap();
    let units = shared.pending.ready_after(crate::ReadyCursor::START, 10).await.unwrap();
    shared.pending.complete(&[units[0].unit.id]).await.unwrap();
    // Empty, but another process serves the database: still refused.
    let e = stages_on(&url, StageAccess::Shared, 8).await.err().expect("refused");
    assert!(e.to_string().contains("another process serves it"), "{e}");
    drop(shared);
    stages_on(&url, StageAccess::Sole, 8).await.unwrap();
}

/// The stages share one database, so a change that spans two of them is one transaction:
/// a routed unit leaves the router queue as its routing is recorded, and a completed
/// source's routed work goes with it. No restart can find a unit staged and routed at
/// once, or routed work whose source is gone.
#[tokio::test]
async fn changes_spanning_two_stages_are_one_transaction() {
    use crate::conformance::ops::RoutedWorkOps as _;

    let url = TestCluster::shared().fresh_database();
    let s = stages_on(&url, StageAccess::Sole, 4).await.unwrap();
    s.pending
        .admit(vec![
            super::record("esme1", "447700900001", "one"),
            super::record("esme1", "447700900002", "two"),
        ])
        .await
        .unwrap();
    let ready = s.pending.ready_after(crate::ReadyCursor::START, 10).await.unwrap();
    assert_eq!(ready.len(), 2);
    let staged: Vec<StagedUnit> = ready.iter().map(StagedUnit::from).collect();
    s.router_queue.stage(&staged, ready[1].seq).await.unwrap();
    assert_eq!(s.router_queue.stats().await.unwrap().staged, 2);

    let routed = |id: UnitId| super::fixtures::routed_to(id, "smsc");
    let first = ready[0].unit.id;
    s.routed_work.record(vec![routed(first)]).await.unwrap();
    let left = s.router_queue.staged_after(ReadySeq(0), 10).await.unwrap();
    assert_eq!(
        left.iter().map(|u| u.id).collect::<Vec<_>>(),
        vec![ready[1].unit.id],
        "routing the first unit took it out of the router queue"
    );
    // The Selector's own release afterwards finds nothing left and changes nothing.
    s.router_queue.release(&[first]).await.unwrap();
    assert_eq!(s.router_queue.stats().await.unwrap().staged, 1);

    assert_eq!(s.routed_work.load_after(None, 10).await.unwrap().len(), 1);
    s.pending.complete(&[first]).await.unwrap();
    assert!(
        s.routed_work.load_after(None, 10).await.unwrap().is_empty(),
        "completing the source removed its routed work"
    );
    // The Router's own removal afterwards finds nothing left.
    s.routed_work.remove(&[first]).await.unwrap();
    assert_eq!(s.pending.stats().await.unwrap().ready_units, 1);
}

/// Queue tables are often analysed while nearly empty, and a prepared statement's
/// generic plan made from those statistics is kept as the table grows. Without the
/// connections' planner settings that plan hash-joins a sequential scan of the whole
/// table (the control below); with them it probes an index, whatever the statistics.
#[tokio::test]
async fn a_plan_cached_while_a_table_was_nearly_empty_still_probes_an_index() {
    use sqlx::{ConnectOptions, Connection, Row};
    use std::str::FromStr;

    let url = TestCluster::shared().fresh_database();
    // The store creates the schema.
    drop(PostgresDlrStore::connect(&url, 1, retention()).await.unwrap());

    async fn cached_plan(url: &str, settings: &[(&str, &str)]) -> String {
        let options = sqlx::postgres::PgConnectOptions::from_str(url)
            .unwrap()
            .options(settings.iter().copied());
        let mut conn = options.connect().await.unwrap();
        for sql in [
            "TRUNCATE dlr_correlations",
            "INSERT INTO dlr_correlations (destination, provider_key, unit, branch, part, gen) \
             SELECT 'smsc', 'k' || g, gen_random_uuid(), 0, 1, 0 FROM generate_series(1, 20) g",
            "ANALYZE dlr_correlations",
            "SET plan_cache_mode = force_generic_plan",
            "PREPARE mark(text[], text[], uuid[], int4[]) AS \
             UPDATE dlr_correlations c SET state = 2 \
               FROM UNNEST($1, $2, $3, $4) AS x(d, k, u, b) \
              WHERE c.destination = x.d AND c.provider_key = x.k AND c.unit = x.u AND c.branch = x.b \
                AND c.state IS NULL",
            // The first execution makes the generic plan; the table grows after it.
            "EXECUTE mark('{smsc}', '{k1}', '{00000000-0000-0000-0000-000000000000}', '{0}')",
            "INSERT INTO dlr_correlations (destination, provider_key, unit, branch, part, gen) \
             SELECT 'smsc', 'j' || g, gen_random_uuid(), 0, 1, 0 FROM generate_series(1, 20000) g",
        ] {
            sqlx::query(sql).execute(&mut conn).await.unwrap();
        }
        let rows =
            sqlx::query("EXPLAIN EXECUTE mark('{smsc}', '{k5}', '{00000000-0000-0000-0000-000000000000}', '{0}')")
                .fetch_all(&mut conn)
                .await
                .unwrap();
        conn.close().await.unwrap();
        rows.iter()
            .map(|r| r.get::<String, _>(0))
            .collect::<Vec<_>>()
            .join("\n")
    }

    let control = cached_plan(&url, &[]).await;
    assert!(
        control.contains("Seq Scan on dlr_correlations"),
        "the server's default plan from these statistics scans the table:\n{control}"
    );
    let plan = cached_plan(&url, &crate::postgresql::SESSION_SETTINGS).await;
    assert!(
        !plan.contains("Seq Scan") && !plan.contains("Hash Join") && plan.contains("Index Scan"),
        "with Sendium's settings the cached plan probes an index:\n{plan}"
    );
}
