//! Failover of work already routed: a provider dies with submissions in flight.
//!
//! Two SMPP destinations, a route `to = ["up", "backup"]`, `copy-to = ["audit"]`, an ESME
//! submitting about 1,000 messages a second. After about 1,100 messages the provider
//! behind `up` stops answering and dies (its port refuses connections from then on).
//! Every acknowledged message must reach `up` or `backup` within `failover-after` plus a
//! few seconds, `audit` must get every copy, and every receipt must reach the ESME
//! except those the dead provider took with it (accepted, receipt never sent): the test
//! counts them. On file/file/file Sendium is also SIGKILLed while `up` is down and the
//! failed-over submissions are still unanswered at `backup`; `up` is back when Sendium
//! restarts, and the recorded failovers must keep those messages away from it. And a
//! message whose only destination stays down ends with an EXPIRED receipt at its
//! validity.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sendium_integration_tests::{
    BindKind, GatewayProcess, Receipt, ReceiptState, SmscConfig, SubmitSpec, TestEsme, TestSmsc,
};
use support::*;

const FAILOVER_AFTER: Duration = Duration::from_secs(2);

fn destination(name: &str, port_var: &str) -> String {
    destination_with(name, port_var, 50, "2s")
}

fn destination_with(name: &str, port_var: &str, window: u32, response_timeout: &str) -> String {
    format!(
        "\n[[destinations]]\nname = \"{name}\"\nkind = \"smpp\"\nhost = \"127.0.0.1\"\nport = {{{port_var}}}\n\
         system-id = \"sendium\"\npassword = \"pw\"\nwindow = {window}\nreconnect-min = \"50ms\"\n\
         reconnect-max = \"500ms\"\nresponse-timeout = \"{response_timeout}\"\n\
         enquire-link-interval = \"5s\"\nfailover-after = \"2s\"\n"
    )
}

fn failover_config(durable: bool) -> String {
    let base = [
        SMPP,
        HTTP,
        ADMIN,
        &destination("up", "up_port"),
        // Wide and patient: on file/file/file its answers are held back for a while.
        &destination_with("backup", "backup_port", 2_000, "10s"),
        &destination("audit", "audit_port"),
        "\n[[routes]]\nname = \"default\"\nto = [\"up\", \"backup\"]\ncopy-to = [\"audit\"]\n",
    ]
    .concat();
    if durable {
        durable_config_with(DLR_FILE, &base)
    } else {
        base
    }
}

async fn provider() -> TestSmsc {
    TestSmsc::start(SmscConfig {
        receipt_delay: Duration::from_millis(100),
        ..SmscConfig::default()
    })
    .await
}

const N: usize = 2_000;

fn number(i: usize) -> String {
    format!("4670{i:07}")
}

/// Submit `N` receipt-requesting messages at about 1,000 a second; their ids in order.
async fn submit_at_a_thousand_a_second(esme: Arc<TestEsme>) -> Vec<String> {
    let mut ids = Vec::with_capacity(N);
    let start = Instant::now();
    for chunk in (0..N).collect::<Vec<_>>().chunks(50) {
        let specs: Vec<SubmitSpec> = chunk
            .iter()
            .map(|i| SubmitSpec::gsm("Shop", &number(*i), &format!("message {i}")).dlr())
            .collect();
        for o in esme.submit_pipelined(&specs, 50).await {
            assert!(o.is_ok(), "a submit was not acknowledged: {:?}", o.status);
            ids.push(o.message_id);
        }
        let due = start + Duration::from_millis(ids.len() as u64);
        tokio::time::sleep_until(due.into()).await;
    }
    ids
}

/// Destinations a provider accepted (answered ESME_ROK).
fn accepted(smsc: &TestSmsc) -> HashSet<String> {
    smsc.submits()
        .into_iter()
        .filter(|s| s.is_accepted())
        .map(|s| s.destination)
        .collect()
}

fn destinations(smsc: &TestSmsc) -> HashSet<String> {
    smsc.messages().into_iter().map(|m| m.destination).collect()
}

async fn stranded_work_fails_over(durable: bool) {
    let what = if durable { "file/file/file" } else { "memory" };
    let (up, backup, audit) = (provider().await, provider().await, provider().await);
    let mut gw = GatewayProcess::builder(&failover_config(durable))
        .var("up_port", &up.port().to_string())
        .var("backup_port", &backup.port().to_string())
        .var("audit_port", &audit.port().to_string())
        .start()
        .await;
    let esme = Arc::new(
        TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
            .await
            .unwrap(),
    );
    let submitter = tokio::spawn(submit_at_a_thousand_a_second(esme.clone()));

    // The provider dies with submissions in flight: it stops answering, then its process
    // ends and its port refuses connections.
    assert!(
        up.wait_for(WAIT, |s| s.stats().accepted >= 1_100).await,
        "{what}: up took 1,100"
    );
    if durable {
        // What fails over stays unanswered at backup until after the SIGKILL.
        backup.faults().delay_responses(Duration::from_secs(3));
    }
    let up_port = up.port();
    up.faults().stop_answering(true);
    assert!(
        up.wait_for(WAIT, |s| s.stats().unanswered >= 5).await,
        "{what}: submissions in flight at up"
    );
    let up_accepted = accepted(&up);
    let up_received: HashSet<String> = up.submits().into_iter().map(|s| s.destination).collect();
    let up_stats = up.stats();
    up.shutdown().await;
    let died = Instant::now();
    let stranded: HashSet<&String> = up_received.difference(&up_accepted).collect();
    assert!(!stranded.is_empty(), "{what}: submissions were in flight when up died");

    let ids = submitter.await.unwrap();
    assert_eq!(ids.len(), N);
    let all: HashSet<String> = (0..N).map(number).collect();

    let mut receipts: Vec<Receipt> = Vec::new();
    let mut revived = None;
    let esme = if durable {
        // SIGKILL while up is down and the failed-over submissions are unanswered at
        // backup; up is back by the restart. The recorded failovers must send those
        // messages to backup again, not back to up.
        assert!(
            backup
                .wait_for(WAIT, |b| stranded
                    .iter()
                    .all(|d| b.submits().iter().any(|s| &s.destination == *d)))
                .await,
            "{what}: the stranded submissions failed over to backup"
        );
        receipts.extend(esme.receipts());
        gw.kill();
        backup.faults().delay_responses(Duration::ZERO);
        revived = Some(
            TestSmsc::start(SmscConfig {
                port: up_port,
                receipt_delay: Duration::from_millis(100),
                ..SmscConfig::default()
            })
            .await,
        );
        gw.restart().await;
        let esme = Arc::try_unwrap(esme).unwrap_or_else(|_| panic!("the submitter still holds the ESME"));
        drop(esme);
        Arc::new(
            TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
                .await
                .unwrap(),
        )
    } else {
        esme
    };
    let revived_got = |revived: &Option<TestSmsc>| revived.as_ref().map(destinations).unwrap_or_default();
    let reached = |backup: &TestSmsc| {
        let got = destinations(backup);
        let again = revived_got(&revived);
        all.iter()
            .all(|d| up_accepted.contains(d) || got.contains(d) || again.contains(d))
    };
    let limit = if durable {
        // The restart, and the unanswered submissions resent.
        FAILOVER_AFTER * 2 + Duration::from_secs(10)
    } else {
        FAILOVER_AFTER + Duration::from_secs(5)
    };
    assert!(
        backup.wait_for(limit, |b| reached(b)).await,
        "{what}: {} acknowledged messages reached neither up nor backup {limit:?} after up died",
        all.iter()
            .filter(|d| !up_accepted.contains(*d) && !destinations(&backup).contains(*d))
            .count()
    );
    eprintln!(
        "{what}: every message reached a provider {:?} after up died",
        died.elapsed()
    );
    for d in &stranded {
        assert!(
            destinations(&backup).contains(*d),
            "{what}: stranded {d} went to backup"
        );
    }
    if let Some(revived) = &revived {
        let again = destinations(revived);
        let back: Vec<&&String> = stranded.iter().filter(|d| again.contains(**d)).collect();
        if let Some(d) = back.first() {
            gw.dump_log();
            for (who, smsc) in [("backup", &backup), ("revived up", revived)] {
                for sub in smsc.submits().iter().filter(|s| &s.destination == **d) {
                    eprintln!(
                        "{who}: {d} session {} status {:?} {:?} ago",
                        sub.session,
                        sub.status,
                        sub.arrived_at.elapsed()
                    );
                }
            }
        }
        assert!(
            back.is_empty(),
            "{what}: {} failed-over messages went back to up after the restart, e.g. {:?}",
            back.len(),
            back.first()
        );
        eprintln!(
            "{what}: after the restart up took {} messages, none it had failed over from",
            again.len()
        );
    }
    assert!(
        audit.wait_for(WAIT, |a| destinations(a).is_superset(&all)).await,
        "{what}: audit got {} of {N} copies",
        destinations(&audit).len()
    );

    // Receipts: one per id, except for messages up accepted and took its receipts with it.
    // Every message a live provider accepted must get one: wait for those.
    let taken_at_most = up_stats.accepted - up_stats.receipts_acked;
    let number_of: HashMap<&str, String> = ids.iter().enumerate().map(|(i, id)| (id.as_str(), number(i))).collect();
    let owed = |receipts: &[Receipt]| {
        let live: HashSet<String> = accepted(&backup)
            .into_iter()
            .chain(revived.as_ref().map(accepted).unwrap_or_default())
            .collect();
        let got: HashSet<&str> = receipts.iter().filter_map(|r| r.message_id()).collect();
        ids.iter()
            .filter(|id| live.contains(&number_of[id.as_str()]) && !got.contains(id.as_str()))
            .count()
    };
    let deadline = Instant::now() + WAIT;
    loop {
        let all_receipts: Vec<Receipt> = receipts.iter().cloned().chain(esme.receipts()).collect();
        let left = owed(&all_receipts);
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {left} receipts from live providers never came"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Anything late would be a receipt too many.
    tokio::time::sleep(Duration::from_millis(500)).await;
    receipts.extend(esme.receipts());
    let mut seen = HashSet::new();
    for r in &receipts {
        let id = r.message_id().expect("a receipt without an id");
        assert!(
            number_of.contains_key(id),
            "{what}: a receipt for an id nobody was given: {id}"
        );
        assert!(seen.insert(id.to_string()), "{what}: two receipts for {id}");
        assert_eq!(r.state(), Some(ReceiptState::Delivered), "{what}: {id}");
    }
    let missing: Vec<&String> = ids.iter().filter(|id| !seen.contains(*id)).collect();
    for id in &missing {
        let n = &number_of[id.as_str()];
        assert!(
            up_accepted.contains(n) && !destinations(&backup).contains(n) && !revived_got(&revived).contains(n),
            "{what}: the receipt of {n} is missing, but up did not take it"
        );
    }
    assert!(
        missing.len() as u64 <= taken_at_most,
        "{what}: {} receipts missing, up took at most {taken_at_most}",
        missing.len()
    );
    eprintln!(
        "{what}: {} submissions stranded at up failed over; {} receipts taken by the dead provider \
         (it accepted {} and had {} of their receipts acknowledged)",
        stranded.len(),
        missing.len(),
        up_stats.accepted,
        up_stats.receipts_acked
    );

    let (_, metrics) = gw.admin_get("/metrics").await;
    if !durable {
        assert!(
            metric(
                &metrics,
                "sendium_branches_failed_over_total",
                "from=\"up\",to=\"backup\""
            ) >= stranded.len() as f64,
            "{what}: failovers counted"
        );
        assert!(
            metric(
                &metrics,
                "sendium_destination_submits_total",
                "destination=\"up\",result=\"disconnected\""
            ) > 0.0,
            "{what}: the unanswered submissions count as disconnected"
        );
    }
    let (status, body) = gw.admin_get("/admin/destinations").await;
    assert_eq!(status, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let up_view = list.as_array().unwrap().iter().find(|d| d["name"] == "up").unwrap();
    let up_state = if durable { "bound" } else { "reconnecting" };
    assert_eq!(up_view["state"], up_state, "{body}");
    assert!(up_view["since"].is_string(), "{body}");
    let backup_view = list.as_array().unwrap().iter().find(|d| d["name"] == "backup").unwrap();
    assert_eq!(backup_view["state"], "bound", "{body}");
    assert!(
        wait_metric(&gw, "sendium_stage_records", "stage=\"pending\"", |v| v == 0.0).await,
        "{what}: every source completed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stranded_work_fails_over_on_memory() {
    stranded_work_fails_over(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stranded_work_fails_over_across_a_sigkill_on_file_file_file() {
    stranded_work_fails_over(true).await;
}

/// A route whose only destination stays down: its message waits, then ends with an
/// EXPIRED receipt at its validity — the ESME's `validity_period`, else `[sms] max-age`.
/// A copy whose one target stays down waits the same way without holding up the
/// message's receipt.
#[tokio::test]
async fn a_message_nobody_can_take_expires_at_its_validity() {
    let live = smsc().await;
    let dead = sendium_integration_tests::ClosedPort::new().unwrap();
    let config = [
        "[sms]\nmax-age = \"5s\"\n",
        SMPP,
        HTTP,
        ADMIN,
        &destination("dead", "dead_port"),
        &destination("live", "live_port"),
        "\n[[routes]]\nname = \"copied\"\ndestination-prefix = \"4479\"\nto = [\"live\"]\ncopy-to = [\"dead\"]\n",
        "\n[[routes]]\nname = \"default\"\nto = [\"dead\"]\n",
    ]
    .concat();
    let gw = GatewayProcess::builder(&config)
        .var("dead_port", &dead.port().unwrap().to_string())
        .var("live_port", &live.port().to_string())
        .start()
        .await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let start = Instant::now();
    let three_seconds = esme
        .submit(
            &SubmitSpec::gsm("1", "447000000001", "valid for 3 s")
                .dlr()
                .with_validity("000000000003000R"),
        )
        .await
        .unwrap()
        .message_id;
    let max_age = esme
        .submit(&SubmitSpec::gsm("1", "447000000002", "max-age").dlr())
        .await
        .unwrap()
        .message_id;
    let copied = esme
        .submit(&SubmitSpec::gsm("1", "447900000003", "copy waits").dlr())
        .await
        .unwrap()
        .message_id;

    // Waiting, and shown as such.
    assert!(
        wait_metric(&gw, "sendium_branches_waiting", "destination=\"dead\"", |v| v == 3.0).await,
        "two messages and a copy wait for dead"
    );
    let (_, body) = gw.admin_get("/admin/destinations").await;
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let dead = list.as_array().unwrap().iter().find(|d| d["name"] == "dead").unwrap();
    assert_eq!(dead["state"], "reconnecting", "{body}");
    assert_eq!(dead["waiting"], 3, "{body}");

    let first = esme.wait_receipts(1, WAIT).await;
    assert_eq!(
        first[0].message_id(),
        Some(copied.as_str()),
        "the copied message's own receipt"
    );
    assert_eq!(first[0].state(), Some(ReceiptState::Delivered));
    let receipts = esme.wait_receipts(3, WAIT).await;
    let at = start.elapsed();
    let by_id: HashMap<&str, &Receipt> = receipts.iter().map(|r| (r.message_id().unwrap(), r)).collect();
    assert_eq!(by_id[three_seconds.as_str()].state(), Some(ReceiptState::Expired));
    assert_eq!(by_id[max_age.as_str()].state(), Some(ReceiptState::Expired));
    assert!(
        at >= Duration::from_secs(5),
        "max-age ends the second one after 5 s, not {at:?}"
    );
    assert!(at < Duration::from_secs(12), "and not much later: {at:?}");
    // The 3 s one came first.
    let order: Vec<&str> = receipts.iter().filter_map(|r| r.message_id()).collect();
    let pos = |id: &str| order.iter().position(|o| *o == id).unwrap();
    assert!(pos(&three_seconds) < pos(&max_age), "{order:?}");
    assert!(
        wait_metric(&gw, "sendium_stage_records", "stage=\"pending\"", |v| v == 0.0).await,
        "every source completed, the copied one's after its copy expired"
    );
    assert!(wait_metric(&gw, "sendium_branches_expired_total", "", |v| v == 3.0).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(esme.receipts().len(), 3, "one receipt each");
    assert_eq!(live.messages().len(), 1);
}

/// Kannel's `smsc` parameter picks a destination among the route's: the named one comes
/// first in the failover order. A name the route does not list is ignored, so a client
/// cannot send where the operator's routes do not allow.
#[tokio::test]
async fn a_kannel_smsc_parameter_chooses_among_the_routes_destinations() {
    let first = provider().await;
    let second = provider().await;
    let other = provider().await;
    let config = [
        SMPP,
        HTTP,
        ADMIN,
        &destination("first", "first_port"),
        &destination("second", "second_port"),
        &destination("other", "other_port"),
        "\n[[routes]]\nname = \"default\"\nto = [\"first\", \"second\"]\n",
        "\n[[http.sendsms-users]]\nusername = \"tester\"\npassword = \"foobar\"\naccount = \"esme1\"\n",
    ]
    .concat();
    let gw = GatewayProcess::builder(&config)
        .var("first_port", &first.port().to_string())
        .var("second_port", &second.port().to_string())
        .var("other_port", &other.port().to_string())
        .start()
        .await;
    for (to, smsc) in [
        ("4670000001", Some("second")),
        ("4670000002", None),
        ("4670000003", Some("other")),
        ("4670000004", Some("first")),
    ] {
        let hint = smsc.map(|s| format!("&smsc={s}")).unwrap_or_default();
        let path = format!("/cgi-bin/sendsms?username=tester&password=foobar&from=1234&to={to}&text=hi{hint}");
        let r = sendium_integration_tests::http::request(gw.http_addr(), "GET", &path, &[], None)
            .await
            .unwrap();
        assert_eq!(r.status, 202, "{}", r.text());
    }
    assert!(first.wait_messages(3, WAIT).await);
    assert!(second.wait_messages(1, WAIT).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let to = |smsc: &TestSmsc| {
        let mut v: Vec<String> = smsc.messages().iter().map(|m| m.destination.clone()).collect();
        v.sort();
        v
    };
    assert_eq!(to(&second), ["4670000001"]);
    assert_eq!(to(&first), ["4670000002", "4670000003", "4670000004"]);
    assert!(other.messages().is_empty(), "not on the route: the hint is ignored");
}
