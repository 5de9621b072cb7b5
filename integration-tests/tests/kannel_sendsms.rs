//! Kannel's `/cgi-bin/sendsms` end to end: requests written exactly as Kannel's user
//! guide writes them reach the test SMSC as the right messages, are answered with
//! Kannel's texts, and their `dlr-url` is called with Kannel's escape codes filled in,
//! for the report types the `dlr-mask` asks for.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use sendium_integration_tests::http::{HttpResponse, request};
use sendium_integration_tests::http_provider::{FakeProvider, Proof, post_receipt};
use sendium_integration_tests::{
    CallbackRequest, CallbackServer, CommandStatus, DestMatch, GatewayProcess, ReceiptOutcome, ReceiptRule,
    ReceiptState, SmscConfig, TestSmsc,
};
use support::*;

async fn start() -> (TestSmsc, GatewayProcess) {
    let smsc = smsc().await;
    let gw = gateway(&[memory_config().as_str(), SENDSMS_USERS].concat(), &smsc).await;
    wait_bound(&gw).await;
    (smsc, gw)
}

/// Until `upstream` is bound: before, a sendsms is answered `3: Queued for later
/// delivery` (ready does not wait for destinations).
async fn wait_bound(gw: &GatewayProcess) {
    for _ in 0..200 {
        if destination_state(gw, "upstream").await == "bound" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("upstream never bound");
}

async fn get(gw: &GatewayProcess, query: &str) -> HttpResponse {
    request(gw.http_addr(), "GET", &format!("/cgi-bin/sendsms?{query}"), &[], None)
        .await
        .unwrap()
}

/// URL-encode a parameter value (what an application does to a dlr-url).
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The query parameters of a callback request, decoded.
fn query(r: &CallbackRequest) -> Vec<(String, String)> {
    let q = r.path.split_once('?').map(|(_, q)| q).unwrap_or_default();
    url::form_urlencoded::parse(q.as_bytes()).into_owned().collect()
}

fn param<'a>(q: &'a [(String, String)], name: &str) -> &'a str {
    q.iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {name} in {q:?}"))
}

#[tokio::test]
async fn the_user_guide_request_is_sent_and_answered_as_kannel_does() {
    let (smsc, gw) = start().await;
    let r = get(
        &gw,
        "username=tester&password=foobar&to=0123456&text=Hello+world&from=1234",
    )
    .await;
    assert_eq!((r.status, r.text().as_str()), (202, "0: Accepted for delivery"));
    assert!(smsc.wait_messages(1, WAIT).await);
    let m = &smsc.messages()[0];
    assert_eq!((m.destination.as_str(), m.source.as_str()), ("0123456", "1234"));
    assert_eq!((m.text.as_str(), m.data_coding), ("Hello world", 0));

    // `user`/`pass` are Kannel's other spellings; POST takes the same parameters as a form.
    let form = b"user=tester&pass=foobar&from=1234&to=0123457&text=Posted+form";
    let r = request(
        gw.http_addr(),
        "POST",
        "/cgi-bin/sendsms",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        Some(form),
    )
    .await
    .unwrap();
    assert_eq!((r.status, r.text().as_str()), (202, "0: Accepted for delivery"));
    assert!(smsc.wait_messages(2, WAIT).await);
    assert_eq!(smsc.messages_to("0123457")[0].text, "Posted form");
}

#[tokio::test]
async fn ucs2_long_and_several_receivers() {
    let (smsc, gw) = start().await;
    // UTF-8 text sent as UCS2.
    let r = get(
        &gw,
        &format!(
            "username=tester&password=foobar&from=Shop&to=4471&coding=2&charset=UTF-8&text={}",
            enc("привет, мир")
        ),
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.text());
    assert!(smsc.wait_messages(1, WAIT).await);
    let m = &smsc.messages_to("4471")[0];
    assert_eq!((m.text.as_str(), m.data_coding), ("привет, мир", 8));

    // 400 GSM characters: split as every ingress splits, into 3 concatenated parts.
    let long: String = (0..400).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
    let r = get(
        &gw,
        &format!("username=tester&password=foobar&from=Shop&to=4472&text={long}"),
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.text());
    assert!(smsc.wait_messages(2, WAIT).await);
    let m = &smsc.messages_to("4472")[0];
    assert_eq!(m.text, long);
    let parts: Vec<_> = smsc.submits().into_iter().filter(|s| s.destination == "4472").collect();
    assert_eq!(parts.len(), 3, "one submit_sm per part");
    assert!(parts.iter().all(|p| p.part.is_some()));

    // Several receivers, separated by spaces (`+` in a query): one message each.
    let r = get(
        &gw,
        "username=tester&password=foobar&from=Shop&to=4473+4474%204475&text=each",
    )
    .await;
    assert_eq!((r.status, r.text().as_str()), (202, "0: Accepted for delivery"));
    assert!(smsc.wait_messages(5, WAIT).await);
    for to in ["4473", "4474", "4475"] {
        let m = smsc.messages_to(to);
        assert_eq!(m.len(), 1, "{to}");
        assert_eq!(m[0].text, "each");
    }
}

#[tokio::test]
async fn refusals_use_kannels_status_and_text() {
    let (smsc, gw) = start().await;
    for query in [
        "username=tester&password=guess-17&to=4480&text=x&from=1",
        "username=nobody&password=foobar&to=4480&text=x&from=1",
        "to=4480&text=x&from=1",
    ] {
        let r = get(&gw, query).await;
        assert_eq!(
            (r.status, r.text().as_str()),
            (403, "Authorization failed for sendsms"),
            "{query}"
        );
    }
    let cases = [
        ("text=x&from=1", "Missing receiver number, rejected"),
        ("to=&text=x&from=1", "Empty receiver number not allowed, rejected"),
        ("to=4480&text=x", "Sender missing and no global set, rejected"),
        (
            "to=4480&text=x&from=1&dlr-mask=99",
            "DLR-Mask field misformed, rejected",
        ),
        ("to=4480&text=x&from=1&coding=7", "Coding field misformed, rejected"),
        // A dlr-url callbacks may not reach is refused like a misformed one.
        (
            "to=4480&text=x&from=1&dlr-mask=1&dlr-url=http%3A%2F%2F169.254.169.254%2F",
            "DLR-URL field misformed, rejected",
        ),
    ];
    for (query, text) in cases {
        let r = get(&gw, &format!("username=tester&password=foobar&{query}")).await;
        assert_eq!((r.status, r.text().as_str()), (400, text), "{query}");
        assert_eq!(r.header("content-type"), Some("text/html"));
    }
    let r = request(
        gw.http_addr(),
        "POST",
        "/cgi-bin/sendsms?username=tester&password=foobar&to=4480&from=1",
        &[("Content-Type", "text/plain")],
        Some(b"x"),
    )
    .await
    .unwrap();
    assert_eq!(
        (r.status, r.text().as_str()),
        (415, "Unsupported content-type, rejected")
    );
    // Unknown and unused Kannel parameters are ignored.
    let r = get(
        &gw,
        "username=tester&password=foobar&to=4481&text=ok&from=1&meta-data=%3Fsmpp%3Fa%3Db&account=x&binfo=y&foo=bar&smsc=any",
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.text());
    assert!(smsc.wait_messages(1, WAIT).await);
    assert_eq!(smsc.messages().len(), 1, "only the accepted one reached the provider");
    let log = gw.log();
    assert!(
        !log.contains("foobar") && !log.contains("guess-17"),
        "no password in the log"
    );
}

#[tokio::test]
async fn the_dlr_url_gets_the_accepted_and_the_delivered_report() {
    let (smsc, gw) = start().await;
    // The receipt comes a while after the provider's answer, as from a real handset.
    smsc.set_receipt_delay(Duration::from_millis(300));
    let cb = CallbackServer::start().await;
    let dlr_url = cb.url("/dlr?type=%d&to=%p&from=%P&q=%q&id=%I&text=%A&ts=%T&smsc=%i&fid=%F&kw=%k&unknown=%Z");
    let r = get(
        &gw,
        &format!(
            "username=tester&password=foobar&from=Shop&to=004490&text=Track+me&dlr-mask=31&dlr-url={}",
            enc(&dlr_url)
        ),
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.text());
    assert!(cb.wait_requests(2, WAIT).await, "{:?}", cb.requests());
    assert!(smsc.wait_messages(1, WAIT).await);
    let submit = &smsc.submits()[0];
    assert_eq!(
        submit.registered_delivery, 0x11,
        "a receipt is asked of the provider, and intermediate notifications for mask 4"
    );
    let reqs = cb.requests();
    assert!(reqs.iter().all(|r| r.method == "GET" && r.body.is_empty()));
    let (accepted, delivered) = (query(&reqs[0]), query(&reqs[1]));
    assert_eq!(param(&accepted, "type"), "8", "first the provider's acceptance");
    assert_eq!(param(&delivered, "type"), "1", "then the delivery");
    for q in [&accepted, &delivered] {
        assert_eq!(param(q, "to"), "004490");
        assert_eq!(param(q, "q"), "+4490", "%q writes a leading 00 as +");
        assert_eq!(param(q, "from"), "Shop");
        assert!(param(q, "ts").parse::<u64>().unwrap() > 1_600_000_000);
        assert_eq!(param(q, "unknown"), "%Z", "an unknown code stays as written");
    }
    let id = param(&accepted, "id");
    assert!(id.len() == 36 && id.matches('-').count() == 4, "a message id: {id}");
    assert_eq!(param(&delivered, "id"), id, "both reports carry the message's id");
    assert_eq!(param(&accepted, "text"), "ACK/");
    assert_eq!(param(&accepted, "smsc"), "upstream");
    let provider_id = submit.message_id.clone().unwrap();
    assert!(
        param(&accepted, "fid").eq_ignore_ascii_case(provider_id.trim_start_matches('0')),
        "{} vs {provider_id}",
        param(&accepted, "fid")
    );
    let text = param(&delivered, "text");
    assert!(
        text.contains("stat:DELIVRD") && text.contains(&format!("id:{id}")),
        "{text}"
    );
    assert_eq!(param(&delivered, "kw"), format!("id:{id}"));
    // Exactly these two: nothing else was asked or happened.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(cb.requests().len(), 2);
}

#[tokio::test]
async fn a_refused_message_reports_16_and_the_mask_filters_reports() {
    let (smsc, gw) = start().await;
    smsc.faults().reject_prefix("4495", CommandStatus::EsmeRinvdstadr);
    let cb = CallbackServer::start().await;
    let url = |tag: &str| enc(&cb.url(&format!("/{tag}?type=%d&text=%A")));
    // Refused by the provider: type 16 only (no 8, no final 2), for a mask of 31, and
    // for a mask of 2 (undelivered), as Kannel reports a refusal then too. Delivered, with
    // a mask that asks for failures only (18): nothing is called.
    for (to, mask, tag) in [("44951", 31, "all"), ("44952", 2, "failed"), ("44960", 18, "quiet")] {
        let r = get(
            &gw,
            &format!(
                "username=tester&password=foobar&from=1&to={to}&text=t&dlr-mask={mask}&dlr-url={}",
                url(tag)
            ),
        )
        .await;
        assert_eq!(r.status, 202, "{}", r.text());
    }
    assert!(cb.wait_requests(2, WAIT).await, "{:?}", cb.requests());
    assert!(smsc.wait_for(WAIT, |s| s.stats().receipts_sent >= 1).await);
    for tag in ["all", "failed"] {
        let reqs: Vec<_> = cb
            .requests()
            .into_iter()
            .filter(|r| r.path.starts_with(&format!("/{tag}?")))
            .collect();
        assert_eq!(reqs.len(), 1, "{tag}: {reqs:?}");
        let q = query(&reqs[0]);
        assert_eq!(param(&q, "type"), "16", "{tag}");
        assert!(param(&q, "text").starts_with("NACK/"), "{tag}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        cb.requests().iter().all(|r| !r.path.starts_with("/quiet")),
        "a delivered message is not reported to a failures-only mask"
    );
}

/// A provider that accepts the message and then sends a final REJECTD receipt: Kannel's
/// SMPP module reports that as undelivered (2), not as a refusal (16), and sends nothing
/// to a mask that asks for refusals only.
#[tokio::test]
async fn a_rejectd_receipt_reports_2() {
    let (smsc, gw) = start().await;
    smsc.set_receipt_rules(vec![ReceiptRule::dest_prefix("4498", ReceiptState::Rejected, "008")]);
    let cb = CallbackServer::start().await;
    let url = |tag: &str| enc(&cb.url(&format!("/{tag}?type=%d&text=%A")));
    for (to, mask, tag) in [("44981", 31, "all"), ("44982", 16, "refusals")] {
        let r = get(
            &gw,
            &format!(
                "username=tester&password=foobar&from=1&to={to}&text=t&dlr-mask={mask}&dlr-url={}",
                url(tag)
            ),
        )
        .await;
        assert_eq!(r.status, 202, "{}", r.text());
    }
    // 8 then 2 for the mask of 31.
    assert!(cb.wait_requests(2, WAIT).await, "{:?}", cb.requests());
    assert!(smsc.wait_for(WAIT, |s| s.stats().receipts_sent >= 2).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reqs = cb.requests();
    let types: Vec<String> = reqs
        .iter()
        .filter(|r| r.path.starts_with("/all?"))
        .map(|r| param(&query(r), "type").to_string())
        .collect();
    assert_eq!(types, ["8", "2"], "{reqs:?}");
    let last = reqs.iter().rfind(|r| r.path.starts_with("/all?")).unwrap();
    assert!(param(&query(last), "text").contains("stat:REJECTD"), "{last:?}");
    assert!(
        reqs.iter().all(|r| !r.path.starts_with("/refusals")),
        "a REJECTD receipt is no refusal: {reqs:?}"
    );
}

/// A dlr-url survives a SIGKILL and restart as a `callback_url` does: with the file
/// profiles, reports the URL refused before the kill are delivered after the restart,
/// still as Kannel GETs with their codes filled in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undelivered_reports_survive_a_restart() {
    let smsc = smsc().await;
    let mut gw = gateway(&[durable_config(DLR_FILE).as_str(), SENDSMS_USERS].concat(), &smsc).await;
    wait_bound(&gw).await;
    let cb = CallbackServer::start().await;
    cb.set_status(Some(503));
    let dlr_url = enc(&cb.url("/dlr?type=%d&to=%p&id=%I"));
    for i in 0..5 {
        let r = get(
            &gw,
            &format!("username=tester&password=foobar&from=Shop&to=44970{i}&text=durable&dlr-mask=3&dlr-url={dlr_url}"),
        )
        .await;
        assert_eq!((r.status, r.text().as_str()), (202, "0: Accepted for delivery"));
    }
    assert!(cb.wait_requests(5, WAIT).await, "first attempts refused");
    gw.kill();
    cb.heal();
    gw.restart().await;
    assert!(
        cb.wait_accepted(5, Duration::from_secs(60)).await,
        "accepted {}",
        cb.accepted().len()
    );
    let mut to: Vec<String> = cb
        .accepted()
        .iter()
        .map(|r| {
            let q = query(r);
            assert_eq!(param(&q, "type"), "1");
            param(&q, "to").to_string()
        })
        .collect();
    to.sort();
    to.dedup();
    assert_eq!(to, (0..5).map(|i| format!("44970{i}")).collect::<Vec<_>>());
}

/// An intermediate receipt (ENROUTE) before the final one: a mask with 4 gets 8, then
/// 4 with the provider's receipt text, then 1 (the message still awaited its final
/// receipt after the 4); a mask without 4 gets 8 and 1 only, a mask of 4 alone the 4.
#[tokio::test]
async fn an_intermediate_receipt_reports_4_and_the_final_one_follows() {
    let (smsc, gw) = start().await;
    smsc.set_receipt_delay(Duration::from_millis(300));
    smsc.set_receipt_rules(vec![ReceiptRule {
        dest: DestMatch::Prefix("4499".into()),
        outcome: ReceiptOutcome::Spaced {
            receipts: vec![
                (ReceiptState::Enroute, "000".into()),
                (ReceiptState::Delivered, "000".into()),
            ],
            gap: Duration::from_millis(600),
        },
    }]);
    let cb = CallbackServer::start().await;
    let url = |tag: &str| enc(&cb.url(&format!("/{tag}?type=%d&text=%A&fid=%F&smsc=%i&id=%I")));
    for (to, mask, tag) in [("44991", 31, "all"), ("44992", 27, "no4"), ("44993", 4, "only4")] {
        let r = get(
            &gw,
            &format!(
                "username=tester&password=foobar&from=1&to={to}&text=t&dlr-mask={mask}&dlr-url={}",
                url(tag)
            ),
        )
        .await;
        assert_eq!((r.status, r.text().as_str()), (202, "0: Accepted for delivery"));
    }
    assert!(cb.wait_requests(6, WAIT).await, "{:?}", cb.requests());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reqs = cb.requests();
    let of = |tag: &str| -> Vec<Vec<(String, String)>> {
        reqs.iter()
            .filter(|r| r.path.starts_with(&format!("/{tag}?")))
            .map(query)
            .collect()
    };
    let all = of("all");
    let types: Vec<&str> = all.iter().map(|q| param(q, "type")).collect();
    assert_eq!(types, ["8", "4", "1"], "{reqs:?}");
    let buffered = &all[1];
    assert!(param(buffered, "text").contains("stat:ENROUTE"), "{buffered:?}");
    assert_eq!(param(buffered, "smsc"), "upstream");
    assert_eq!(param(buffered, "id"), param(&all[0], "id"));
    assert!(!param(buffered, "fid").is_empty());
    assert!(param(&all[2], "text").contains("stat:DELIVRD"));
    let types: Vec<String> = of("no4").iter().map(|q| param(q, "type").to_string()).collect();
    assert_eq!(types, ["8", "1"], "{reqs:?}");
    let types: Vec<String> = of("only4").iter().map(|q| param(q, "type").to_string()).collect();
    assert_eq!(types, ["4"], "a mask of 4 alone: {reqs:?}");
}

/// A type 8 report is stored with the provider's id: killed after the provider accepted
/// the messages and while the dlr-url refuses the report, the restarted process still
/// delivers it (file profile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_reports_survive_a_restart() {
    let smsc = smsc().await;
    let mut gw = gateway(&[durable_config(DLR_FILE).as_str(), SENDSMS_USERS].concat(), &smsc).await;
    wait_bound(&gw).await;
    let cb = CallbackServer::start().await;
    cb.set_status(Some(503));
    let dlr_url = enc(&cb.url("/dlr?type=%d&to=%p&id=%I&fid=%F"));
    for i in 0..3 {
        let r = get(
            &gw,
            &format!("username=tester&password=foobar&from=Shop&to=44975{i}&text=durable&dlr-mask=8&dlr-url={dlr_url}"),
        )
        .await;
        assert_eq!((r.status, r.text().as_str()), (202, "0: Accepted for delivery"));
    }
    assert!(smsc.wait_accepted(3, WAIT).await);
    assert!(cb.wait_requests(3, WAIT).await, "first attempts refused");
    gw.kill();
    cb.heal();
    gw.restart().await;
    assert!(
        cb.wait_accepted(3, Duration::from_secs(60)).await,
        "accepted {}",
        cb.accepted().len()
    );
    let mut to: Vec<String> = cb
        .accepted()
        .iter()
        .map(|r| {
            let q = query(r);
            assert_eq!(param(&q, "type"), "8");
            assert!(!param(&q, "fid").is_empty());
            param(&q, "to").to_string()
        })
        .collect();
    to.sort();
    to.dedup();
    assert_eq!(to, (0..3).map(|i| format!("44975{i}")).collect::<Vec<_>>());
}

/// The state of destination `name` in `/admin/destinations`.
async fn destination_state(gw: &GatewayProcess, name: &str) -> String {
    let (status, body) = gw.admin_get("/admin/destinations").await;
    assert_eq!(status, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .map(|d| d["state"].as_str().unwrap_or_default().to_string())
        .unwrap_or_default()
}

/// Kannel's `3: Queued for later delivery`: the message is stored as always, and the
/// answer says no destination of its route can take it now; it goes once the SMSC is
/// back. With the SMSC up the answer is `0: Accepted for delivery`.
#[tokio::test]
async fn a_message_whose_destinations_are_down_is_queued_for_later_delivery() {
    let smsc = smsc().await;
    let port = smsc.port();
    let gw = gateway(&[memory_config().as_str(), SENDSMS_USERS].concat(), &smsc).await;
    wait_bound(&gw).await;
    async fn send(gw: &GatewayProcess, to: &str) -> HttpResponse {
        get(gw, &format!("username=tester&password=foobar&from=1&to={to}&text=q")).await
    }
    let r = send(&gw, "44961").await;
    assert_eq!((r.status, r.text().as_str()), (202, "0: Accepted for delivery"));
    assert!(smsc.wait_messages(1, WAIT).await);
    smsc.shutdown().await;
    let mut state = String::new();
    for _ in 0..100 {
        state = destination_state(&gw, "upstream").await;
        if state != "bound" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_ne!(state, "bound", "the link went down");
    let r = send(&gw, "44962").await;
    assert_eq!((r.status, r.text().as_str()), (202, "3: Queued for later delivery"));
    // The SMSC comes back on its port: the queued message goes, and answers are `0:` again.
    let smsc = TestSmsc::start(SmscConfig {
        port,
        ..SmscConfig::default()
    })
    .await;
    assert!(smsc.wait_messages(1, WAIT).await, "the queued message is delivered");
    assert_eq!(smsc.messages_to("44962").len(), 1);
    wait_bound(&gw).await;
    let r = send(&gw, "44963").await;
    assert_eq!((r.status, r.text().as_str()), (202, "0: Accepted for delivery"));
    assert!(smsc.wait_messages(2, WAIT).await);
}

/// An HTTP provider's receipts report like an SMSC's: its acceptance is 8, a posted
/// intermediate status 4, a posted failure 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_providers_receipts_are_reported_like_an_smscs() {
    let provider = FakeProvider::start().await;
    let destination = "\n[[destinations]]\nname = \"h\"\nkind = \"http\"\n\
        url = \"http://127.0.0.1:{h_port}/send\"\nfields = { to = \"{to}\", msg = \"{text}\" }\n\
        id-pointer = \"/message_id\"\nresponse-timeout = \"2s\"\n\
        receipt-secret = \"rs-1\"\nreceipt-signature = \"hmac-sha256\"\n\
        receipt-status = { failed = \"UNDELIV\", queued = \"ENROUTE\" }\n\
        receipt-id-pointer = \"/message_id\"\nreceipt-status-pointer = \"/status\"\n\
        \n[[routes]]\nname = \"default\"\nto = [\"h\"]\n";
    let config = [SMPP, HTTP, ADMIN, destination, SENDSMS_USERS].concat();
    let mut b = GatewayProcess::builder(&config).var("h_port", &provider.addr().port().to_string());
    for p in ["to", "text"] {
        b = b.var(p, &format!("{{{p}}}"));
    }
    let gw = b.start().await;
    for _ in 0..200 {
        if destination_state(&gw, "h").await == "bound" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let cb = CallbackServer::start().await;
    let url = enc(&cb.url("/dlr?type=%d&text=%A&smsc=%i"));
    let r = get(
        &gw,
        &format!("username=tester&password=foobar&from=1&to=44994&text=t&dlr-mask=31&dlr-url={url}"),
    )
    .await;
    assert_eq!((r.status, r.text().as_str()), (202, "0: Accepted for delivery"));
    assert!(provider.wait_requests(1, WAIT).await);
    let id = provider.requests()[0].message_id.clone().unwrap();
    assert!(cb.wait_requests(1, WAIT).await, "the acceptance");
    let queued = format!("{{\"message_id\":\"{id}\",\"status\":\"queued\"}}");
    assert_eq!(
        post_receipt(gw.http_addr(), "h", &queued, Proof::Hmac("rs-1")).await,
        200
    );
    assert!(cb.wait_requests(2, WAIT).await, "the intermediate report");
    let failed = format!("{{\"message_id\":\"{id}\",\"status\":\"failed\"}}");
    assert_eq!(
        post_receipt(gw.http_addr(), "h", &failed, Proof::Hmac("rs-1")).await,
        200
    );
    assert!(cb.wait_requests(3, WAIT).await, "{:?}", cb.requests());
    let qs: Vec<_> = cb.requests().iter().map(query).collect();
    let types: Vec<&str> = qs.iter().map(|q| param(q, "type")).collect();
    assert_eq!(types, ["8", "4", "2"], "{qs:?}");
    assert_eq!(param(&qs[1], "text"), "stat:queued");
    assert_eq!(param(&qs[1], "smsc"), "h");
    assert!(param(&qs[2], "text").contains("stat:UNDELIV"));
}

/// An intermediate receipt sent right after the provider's answer, before the message's
/// handoff can have been stored, is still reported: it is tried again until its
/// correlation is there.
#[tokio::test]
async fn an_intermediate_receipt_ahead_of_the_handoff_is_reported() {
    let (smsc, gw) = start().await;
    smsc.set_receipt_delay(Duration::ZERO);
    smsc.set_receipt_rules(vec![ReceiptRule {
        dest: DestMatch::Prefix("4490".into()),
        outcome: ReceiptOutcome::Spaced {
            receipts: vec![
                (ReceiptState::Accepted, "000".into()),
                (ReceiptState::Delivered, "000".into()),
            ],
            gap: Duration::from_millis(2500),
        },
    }]);
    let cb = CallbackServer::start().await;
    let url = enc(&cb.url("/dlr?type=%d&text=%A"));
    for to in ["44901", "44902", "44903"] {
        let r = get(
            &gw,
            &format!("username=tester&password=foobar&from=1&to={to}&text=t&dlr-mask=31&dlr-url={url}"),
        )
        .await;
        assert_eq!(r.status, 202, "{}", r.text());
    }
    assert!(cb.wait_requests(9, WAIT).await, "{:?}", cb.requests());
    let mut types: Vec<String> = cb
        .requests()
        .iter()
        .map(|r| param(&query(r), "type").to_string())
        .collect();
    types.sort();
    assert_eq!(types, ["1", "1", "1", "4", "4", "4", "8", "8", "8"]);
    assert!(
        cb.requests()
            .iter()
            .filter(|r| param(&query(r), "type") == "4")
            .all(|r| param(&query(r), "text").contains("stat:ACCEPTD"))
    );
}
