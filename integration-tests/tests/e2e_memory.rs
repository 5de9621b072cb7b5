//! The gateway end to end on the memory profile: SMPP in, routed SMPP out, receipts back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sendium_integration_tests::{
    Alphabet, BindKind, Concat, DlrParts, IdStyle, ReceiptRule, ReceiptState, SmscConfig, SubmitSpec, TestEsme,
    TestSmsc,
};
use support::*;

/// 10,000 messages mixing GSM, UCS2 and 3-part multipart reach the SMSC with exact text,
/// and every receipt-requesting submission gets exactly one receipt with its own id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_mixed_messages_arrive_exactly_and_every_receipt_comes_back() {
    let smsc = smsc().await;
    let gw = gateway(&memory_config(), &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();

    const N: usize = 10_000;
    let mut specs = Vec::new();
    // destination → expected text
    let mut expected_text: HashMap<String, String> = HashMap::new();
    // Which submits asked for a receipt (index into specs).
    for i in 0..N {
        let dest = format!("4477{:08}", i);
        match i % 10 {
            0..=6 => {
                let text = format!("Message {i}: hello [world] {{€}} ~");
                specs.push(SubmitSpec::gsm("Shop", &dest, &text).dlr());
                expected_text.insert(dest, text);
            }
            7 | 8 => {
                let text = format!("Сообщение {i} ✓ 你好 😀");
                specs.push(SubmitSpec::ucs2("Shop", &dest, &text).dlr());
                expected_text.insert(dest, text);
            }
            _ => {
                // Three parts; every other one Kannel-style (only part 1 asks).
                let text: String = format!("Long message {i} ") + &"abcdefghij".repeat(36);
                let dlr = if i % 20 == 9 { DlrParts::First } else { DlrParts::Every };
                let concat = match i % 30 {
                    9 => Concat::Udh8((i % 256) as u8),
                    19 => Concat::Udh16(i as u16),
                    _ => Concat::Sar(i as u16),
                };
                let parts = SubmitSpec::multipart("Shop", &dest, Alphabet::Gsm7, &text, concat, dlr);
                assert_eq!(parts.len(), 3);
                specs.extend(parts);
                expected_text.insert(dest, text);
            }
        }
    }
    let outcomes = esme.submit_pipelined(&specs, 256).await;
    let mut want_receipt = HashSet::new();
    for (spec, o) in specs.iter().zip(&outcomes) {
        assert!(o.is_ok(), "a submit was not acknowledged: {:?}", o.status);
        if spec.registered_delivery & 1 == 1 {
            want_receipt.insert(o.message_id.clone());
        }
    }
    let all_ids: HashSet<&String> = outcomes.iter().map(|o| &o.message_id).collect();
    assert_eq!(all_ids.len(), specs.len(), "every submit_sm gets its own id");

    assert!(
        smsc.wait_messages(N as u64, WAIT).await,
        "SMSC has {} of {N} messages",
        smsc.messages().len()
    );
    for m in smsc.messages() {
        let want = expected_text
            .get(&m.destination)
            .expect("a message to an unknown destination");
        assert_eq!(&m.text, want, "text to {} changed on the way", m.destination);
    }
    assert!(
        smsc.duplicates().is_empty(),
        "no duplicates without faults: {:?}",
        &smsc.duplicates()[..1]
    );

    let receipts = esme.wait_receipts(want_receipt.len(), WAIT).await;
    let by_id = one_receipt_per_id(&receipts, &want_receipt);
    for r in by_id.values() {
        assert_eq!(r.state(), Some(ReceiptState::Delivered));
        assert_eq!(r.esm_class & 0x3C, 0x04, "receipts are deliver_sm with esm_class 0x04");
    }
    // Nothing left behind.
    assert!(
        wait_metric(&gw, "sendium_stage_records", "stage=\"pending\"", |v| v == 0.0).await,
        "pending records remain after every receipt came back"
    );
}

/// A multipart message whose provider parts end differently reports the whole
/// message's state: the first failure, on the receipt of each part that asked.
#[tokio::test]
async fn multipart_receipt_reports_the_whole_message_state() {
    let smsc = TestSmsc::start(SmscConfig {
        // Every submit to a destination ending in 999 is undeliverable.
        receipt_rules: vec![ReceiptRule::dest_suffix("999", ReceiptState::Undeliverable, "001")],
        ..SmscConfig::default()
    })
    .await;
    let gw = gateway(&memory_config(), &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let text = "x".repeat(400);
    let good = SubmitSpec::multipart(
        "Shop",
        "447700900001",
        Alphabet::Gsm7,
        &text,
        Concat::Udh8(1),
        DlrParts::Every,
    );
    let bad = SubmitSpec::multipart(
        "Shop",
        "447700900999",
        Alphabet::Gsm7,
        &text,
        Concat::Udh8(2),
        DlrParts::Every,
    );
    let good_ids: Vec<String> = esme
        .submit_all(&good)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.message_id)
        .collect();
    let bad_ids: Vec<String> = esme
        .submit_all(&bad)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.message_id)
        .collect();
    let receipts = esme.wait_receipts(6, WAIT).await;
    let expected: HashSet<String> = good_ids.iter().chain(&bad_ids).cloned().collect();
    let by_id = one_receipt_per_id(&receipts, &expected);
    for id in &good_ids {
        assert_eq!(by_id[id].state(), Some(ReceiptState::Delivered));
    }
    for id in &bad_ids {
        assert_eq!(by_id[id].state(), Some(ReceiptState::Undeliverable));
        assert_eq!(by_id[id].err.as_deref(), Some("001"));
    }
    // Each message went to the provider as 3 parts with 3 provider ids.
    let m = smsc.messages_to("447700900001");
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].message_ids.len(), 3);
}

/// Kannel sends long messages with a receipt requested on part 1 only: it gets exactly
/// one receipt, for part 1's id.
#[tokio::test]
async fn kannel_style_multipart_gets_one_receipt_for_part_one() {
    let smsc = smsc().await;
    let gw = gateway(&memory_config(), &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let text = "Kannel ".repeat(60);
    let parts: Vec<SubmitSpec> = SubmitSpec::multipart(
        "1234",
        "447700900123",
        Alphabet::Gsm7,
        &text,
        Concat::Udh8(77),
        DlrParts::First,
    )
    .into_iter()
    .map(SubmitSpec::kannel_style)
    .collect();
    let resps = esme.submit_all(&parts).await.unwrap();
    assert!(resps.iter().all(|r| r.is_ok()));
    let receipts = esme.wait_receipts(1, WAIT).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let receipts = if esme.receipts().len() > receipts.len() {
        esme.receipts()
    } else {
        receipts
    };
    assert_eq!(receipts.len(), 1, "exactly one receipt");
    assert_eq!(receipts[0].message_id(), Some(resps[0].message_id.as_str()));
    assert_eq!(smsc.messages_to("447700900123")[0].text, text);
}

/// Providers that return hexadecimal ids in submit_sm_resp and write them in decimal in
/// the receipt text still get their receipts matched (id-format = "hex", and "auto").
#[tokio::test]
async fn hex_resp_ids_match_decimal_receipt_ids() {
    for format in ["hex", "auto"] {
        let smsc = TestSmsc::start(SmscConfig {
            id_style: IdStyle::Hex,
            receipt_id_style: Some(IdStyle::Decimal),
            receipt_tlvs: false,
            ..SmscConfig::default()
        })
        .await;
        let config = memory_config().replace("window = 200\n", &format!("window = 200\nid-format = \"{format}\"\n"));
        let gw = gateway(&config, &smsc).await;
        let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
            .await
            .unwrap();
        let specs: Vec<SubmitSpec> = (0..20)
            .map(|i| SubmitSpec::gsm("1", &format!("4470{i}"), "hi").dlr())
            .collect();
        let ids: HashSet<String> = esme
            .submit_all(&specs)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.message_id)
            .collect();
        let receipts = esme.wait_receipts(20, WAIT).await;
        one_receipt_per_id(&receipts, &ids);
        assert!(
            receipts.iter().all(|r| r.state() == Some(ReceiptState::Delivered)),
            "{format}"
        );
    }
}

/// A message no route matches is completed as failed, with a failure receipt.
#[tokio::test]
async fn unroutable_message_fails_with_a_receipt() {
    let smsc = smsc().await;
    let config = [
        SMPP,
        HTTP,
        ADMIN,
        UPSTREAM,
        "[[routes]]\nname = \"uk-only\"\ndestination-prefix = \"44\"\nto = [\"upstream\"]\n",
    ]
    .concat();
    let gw = gateway(&config, &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let resp = esme
        .submit(&SubmitSpec::gsm("1", "15550001111", "nowhere").dlr())
        .await
        .unwrap();
    assert!(resp.is_ok(), "accepted first: routing happens after admission");
    let receipts = esme.wait_receipts(1, WAIT).await;
    assert_eq!(receipts[0].message_id(), Some(resp.message_id.as_str()));
    assert_eq!(receipts[0].state(), Some(ReceiptState::Undeliverable));
    assert_eq!(smsc.stats().submits, 0);
}

/// `copy-to` adds a branch delivered and tracked on its own; the client still gets one
/// receipt (the primary route's).
#[tokio::test]
async fn copy_to_delivers_each_branch() {
    let primary = smsc().await;
    let copy = smsc().await;
    let routes = "[[routes]]\nname = \"default\"\nto = [\"upstream\"]\ncopy-to = [\"archive\"]\n";
    let gw = with_second_upstream("archive", &copy, routes, &primary).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let resp = esme
        .submit(&SubmitSpec::gsm("1", "447700900555", "copied").dlr())
        .await
        .unwrap();
    assert!(primary.wait_messages(1, WAIT).await);
    assert!(copy.wait_messages(1, WAIT).await, "the copy branch is delivered too");
    assert_eq!(copy.messages()[0].text, "copied");
    let receipts = esme.wait_receipts(1, WAIT).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(esme.receipts().len(), 1);
    assert_eq!(receipts[0].message_id(), Some(resp.message_id.as_str()));
}

/// `to = [a, b]`: when `a` is unreachable, messages go to `b`.
#[tokio::test]
async fn failover_to_the_next_reachable_destination() {
    let backup = smsc().await;
    let dead = sendium_integration_tests::ClosedPort::new().unwrap();
    let config = [
        SMPP,
        HTTP,
        ADMIN,
        &UPSTREAM.replace("{smsc_port}", "{dead_port}"),
        &UPSTREAM.replace("\"upstream\"", "\"backup\""),
        "[[routes]]\nname = \"default\"\nto = [\"upstream\", \"backup\"]\n",
    ]
    .concat();
    let gw = sendium_integration_tests::GatewayProcess::builder(&config)
        .smsc_port(backup.port())
        .var("dead_port", &dead.port().unwrap().to_string())
        .start()
        .await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let specs: Vec<SubmitSpec> = (0..10)
        .map(|i| SubmitSpec::gsm("1", &format!("4471{i}"), "via backup").dlr())
        .collect();
    let ids: HashSet<String> = esme
        .submit_all(&specs)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.message_id)
        .collect();
    assert!(
        backup.wait_messages(10, WAIT).await,
        "backup got {}",
        backup.messages().len()
    );
    let receipts = esme.wait_receipts(10, WAIT).await;
    one_receipt_per_id(&receipts, &ids);
}

/// Messages that waited for an unreachable destination go out in the order they were
/// accepted once it is reachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_waiting_out_an_outage_keep_their_order() {
    let port = sendium_integration_tests::free_port();
    let config = [SMPP, HTTP, ADMIN, UPSTREAM, DEFAULT_ROUTE].concat();
    let gw = sendium_integration_tests::GatewayProcess::builder(&config)
        .smsc_port(port)
        .start()
        .await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let numbers: Vec<String> = (0..200).map(|i| format!("4477009{i:05}")).collect();
    for n in &numbers {
        assert!(
            esme.submit(&SubmitSpec::gsm("Shop", n, "in order"))
                .await
                .unwrap()
                .is_ok()
        );
    }
    let smsc = TestSmsc::start(SmscConfig {
        port,
        ..SmscConfig::default()
    })
    .await;
    assert!(smsc.wait_messages(200, WAIT).await, "got {}", smsc.messages().len());
    let sent: Vec<String> = smsc.messages().into_iter().map(|m| m.destination).collect();
    assert_eq!(sent, numbers);
}

/// An ESME that binds only after its receipts arrived still gets them.
#[tokio::test]
async fn receipts_wait_for_the_account_to_bind() {
    let smsc = smsc().await;
    let gw = gateway(&memory_config(), &smsc).await;
    let tx = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transmitter)
        .await
        .unwrap();
    let specs: Vec<SubmitSpec> = (0..5)
        .map(|i| SubmitSpec::gsm("1", &format!("4472{i}"), "later").dlr())
        .collect();
    let ids: HashSet<String> = tx
        .submit_all(&specs)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.message_id)
        .collect();
    assert!(
        smsc.wait_receipts_acked(5, WAIT).await,
        "the provider's receipts reached the gateway"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rx = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Receiver)
        .await
        .unwrap();
    let receipts = rx.wait_receipts(5, WAIT).await;
    one_receipt_per_id(&receipts, &ids);
    // Another account's receiver gets none of them.
    assert!(tx.receipts().is_empty());
}

/// A long text in one submit_sm as `message_payload` is split for the provider, and a
/// destination bound as transmitter + receiver (two sessions) carries submits on one and
/// receipts on the other.
#[tokio::test]
async fn message_payload_over_a_transmitter_receiver_destination() {
    let smsc = smsc().await;
    let config = memory_config().replace("window = 200\n", "window = 200\nbind = \"transmitter+receiver\"\n");
    let gw = gateway(&config, &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let text = "Payload ".repeat(50); // 400 GSM characters: 3 provider parts
    let resp = esme
        .submit(&SubmitSpec::payload("1", "447700900888", Alphabet::Gsm7, &text).dlr())
        .await
        .unwrap();
    assert!(resp.is_ok());
    assert!(smsc.wait_messages(1, WAIT).await);
    let m = &smsc.messages_to("447700900888")[0];
    assert_eq!(m.text, text);
    assert_eq!(m.parts, 3);
    assert!(smsc.wait_bound(2, WAIT).await, "two sessions: transmitter and receiver");
    let receipts = esme.wait_receipts(1, WAIT).await;
    assert_eq!(receipts[0].message_id(), Some(resp.message_id.as_str()));
    assert_eq!(receipts[0].state(), Some(ReceiptState::Delivered));
}

/// `[[routes]]` on the text and the sender: one-time codes (a `text-regex`) and a bank's
/// sender (`source-prefix`) go to their own provider, everything else to the default.
#[tokio::test]
async fn routes_match_the_text_and_the_sender() {
    let default = smsc().await;
    let otp = smsc().await;
    let routes = [
        "[[routes]]\nname = \"codes\"\ntext-regex = \"(?i)\\\\bcode\\\\b\"\nto = [\"otp\"]\n",
        "[[routes]]\nname = \"bank\"\nsource-prefix = \"BANK\"\nto = [\"otp\"]\n",
        "[[routes]]\nname = \"default\"\nto = [\"upstream\"]\n",
    ]
    .concat();
    let gw = with_second_upstream("otp", &otp, &routes, &default).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    for spec in [
        SubmitSpec::gsm("Shop", "447700900601", "Your code is 1234"),
        SubmitSpec::gsm("BANKUK", "447700900602", "balance"),
        SubmitSpec::gsm("Shop", "447700900603", "hello"),
    ] {
        assert!(esme.submit(&spec).await.unwrap().is_ok());
    }
    assert!(otp.wait_messages(2, WAIT).await);
    assert!(default.wait_messages(1, WAIT).await);
    let mut to_otp: Vec<String> = otp.messages().into_iter().map(|m| m.destination).collect();
    to_otp.sort();
    assert_eq!(to_otp, vec!["447700900601", "447700900602"]);
    assert_eq!(default.messages()[0].destination, "447700900603");
}

/// `bulk` messages queued on a bulk route to a destination limited to 1,000 submissions a
/// second, then a one-time password on a `priority = 9` route, over `config(base)`. Returns
/// how many bulk messages the SMSC had when the password was admitted, and the
/// password's position among everything the SMSC received.
async fn bulk_then_a_one_time_password(config: impl FnOnce(&str) -> String, bulk: usize) -> (usize, usize) {
    let smsc = smsc().await;
    let routes = "[[routes]]\nname = \"otp\"\nsource-prefix = \"OTP\"\npriority = 9\nto = [\"upstream\"]\n\
                  [[routes]]\nname = \"bulk\"\nto = [\"upstream\"]\n";
    let upstream = UPSTREAM.replace("window = 200", "window = 200\nmax-tps = 1000");
    let config = config(&[SMPP, HTTP, ADMIN, &upstream, routes].concat());
    let gw = gateway(&config, &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    for chunk in 0..bulk / 500 {
        let specs: Vec<SubmitSpec> = (0..500)
            .map(|i| SubmitSpec::gsm("Shop", &format!("4477009{:05}", chunk * 500 + i), "campaign"))
            .collect();
        assert!(esme.submit_pipelined(&specs, 100).await.iter().all(|o| o.is_ok()));
    }
    let before_otp = smsc.messages().len();
    assert!(
        before_otp < bulk / 2,
        "the bulk went out before the test could queue it: {before_otp}"
    );
    let otp = SubmitSpec::gsm("OTPBANK", "447700955555", "Your code is 4242");
    assert!(esme.submit(&otp).await.unwrap().is_ok());
    assert!(
        eventually(WAIT, || smsc.messages_to("447700955555").len() == 1).await,
        "the one-time password never reached the SMSC"
    );
    let position = smsc
        .messages()
        .iter()
        .position(|m| m.destination == "447700955555")
        .unwrap();
    (before_otp, position)
}

/// A route's `priority`: a one-time password admitted after 10,000 bulk messages queued
/// for a destination limited to 1,000 submissions a second overtakes most of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_urgent_route_overtakes_queued_bulk() {
    const BULK: usize = 10_000;
    let (before_otp, position) = bulk_then_a_one_time_password(str::to_owned, BULK).await;
    assert!(
        position < BULK / 2,
        "the urgent message went out after {position} of {BULK} bulk messages (bulk sent before it was \
         admitted: {before_otp})"
    );
}

/// A route's `priority` beyond what the Router holds: with `[sms.routed-work]
/// max-in-flight = 300`, most of 5,000 bulk messages for a destination limited to 1,000
/// submissions a second wait in the pending stage; a one-time password admitted after
/// them on a `priority = 9` route is selected from there before them and reaches the
/// SMSC before most of the bulk.
async fn an_urgent_route_overtakes_bulk_waiting_in_the_pending_stage(profile: fn(&str) -> String) {
    const BULK: usize = 5_000;
    let (before_otp, position) = bulk_then_a_one_time_password(profile, BULK).await;
    assert!(
        position < before_otp + 1_000,
        "the urgent message went out after {position} of {BULK} bulk messages (bulk sent before it was \
         admitted: {before_otp})"
    );
}

/// The Router holds at most 300 messages (memory stores).
fn memory_with_small_router(base: &str) -> String {
    format!("[sms.routed-work]\nmax-in-flight = 300\n{base}")
}

/// The Router holds at most 300 messages (file stores).
fn file_with_small_router(base: &str) -> String {
    durable_config_with(DLR_MEMORY, base).replacen(
        "[sms.routed-work]\nbackend = \"file\"\n",
        "[sms.routed-work]\nbackend = \"file\"\nmax-in-flight = 300\n",
        1,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_urgent_route_overtakes_bulk_in_the_memory_pending_stage() {
    an_urgent_route_overtakes_bulk_waiting_in_the_pending_stage(memory_with_small_router).await;
}

/// The Router holds at most 300 messages (postgresql stages, in a fresh database).
fn postgresql_with_small_router(base: &str) -> String {
    let url = sendium_storage::postgresql::test_cluster::TestCluster::shared().fresh_database();
    format!(
        "[sms.pending]\nbackend = \"postgresql\"\n[sms.router-queue]\nbackend = \"postgresql\"\n\
         [sms.routed-work]\nbackend = \"postgresql\"\nmax-in-flight = 300\n\
         [storage.postgresql]\nurl = \"{url}\"\n{base}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_urgent_route_overtakes_bulk_in_the_file_pending_stage() {
    an_urgent_route_overtakes_bulk_waiting_in_the_pending_stage(file_with_small_router).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_urgent_route_overtakes_bulk_in_the_postgresql_pending_stage() {
    an_urgent_route_overtakes_bulk_waiting_in_the_pending_stage(postgresql_with_small_router).await;
}

/// The memory gateway with `upstream` at `first` and a second SMPP destination `name`
/// at `second`, routed by `routes`.
async fn with_second_upstream(
    name: &str,
    second: &sendium_integration_tests::TestSmsc,
    routes: &str,
    first: &sendium_integration_tests::TestSmsc,
) -> sendium_integration_tests::GatewayProcess {
    let config = [
        SMPP,
        HTTP,
        ADMIN,
        UPSTREAM,
        &UPSTREAM
            .replace("\"upstream\"", &format!("\"{name}\""))
            .replace("{smsc_port}", "{second_port}"),
        routes,
    ]
    .concat();
    sendium_integration_tests::GatewayProcess::builder(&config)
        .smsc_port(first.port())
        .var("second_port", &second.port().to_string())
        .start()
        .await
}
