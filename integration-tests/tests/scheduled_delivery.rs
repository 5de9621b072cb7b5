//! Scheduled delivery, black box: a time given with the message — SMPP
//! `schedule_delivery_time` (relative or absolute), Kannel's `deferred` minutes, the API's
//! `deliver_at` — reaches the provider as an absolute UTC `schedule_delivery_time`, which
//! the provider holds the message until; a message without one goes without. A message
//! asking for a receipt scheduled further ahead than `[dlr] retention` less an hour is
//! refused (`ESME_RINVSCHED`, 400 naming `deliver_at`, Kannel's `Deferred field
//! misformed`): its receipt would find no correlation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sendium_integration_tests::http::{HttpResponse, post_json, request};
use sendium_integration_tests::{BindKind, CommandStatus, GatewayProcess, SubmitSpec, TestEsme};
use support::*;

fn now_ms() -> u64 {
    u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

/// The absolute time of an SMPP time field (UTC offset applied), in ms.
fn smpp_time_ms(field: &str) -> u64 {
    sendium_protocols::smpp::time::parse(field, 0).unwrap().unwrap()
}

/// The SMSC's submit whose text is `text`.
fn schedule_of(smsc: &sendium_integration_tests::TestSmsc, text: &str) -> String {
    smsc.submits()
        .into_iter()
        .find(|s| s.text().is_ok_and(|t| t == text))
        .unwrap_or_else(|| panic!("no submit with text {text:?}"))
        .schedule_delivery_time
}

async fn sendsms(gw: &GatewayProcess, path_and_query: &str) -> HttpResponse {
    request(gw.http_addr(), "GET", path_and_query, &[], None).await.unwrap()
}

async fn post_message(gw: &GatewayProcess, json: &str) -> HttpResponse {
    post_json(
        gw.http_addr(),
        "/v1/messages",
        &[("Authorization", "Bearer key-1")],
        json,
    )
    .await
    .unwrap()
}

fn near(actual: u64, expected: u64) -> bool {
    actual.abs_diff(expected) < 60_000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_time_reaches_the_provider_from_every_ingress() {
    let smsc = smsc().await;
    let gw = gateway(&[memory_config().as_str(), SENDSMS_USERS].concat(), &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();

    let before = now_ms();
    let in_an_hour = esme
        .submit(
            &SubmitSpec::gsm("Shop", "447700900001", "in an hour")
                .dlr()
                .with_schedule("000000010000000R"),
        )
        .await
        .unwrap();
    assert!(in_an_hour.is_ok(), "{in_an_hour:?}");
    // Absolute, in local time two hours ahead of UTC: 2099-01-01 12:00 there.
    let absolute = esme
        .submit(&SubmitSpec::gsm("Shop", "447700900002", "absolute").with_schedule("990101120000008+"))
        .await
        .unwrap();
    assert!(absolute.is_ok(), "{absolute:?}");
    let now = esme
        .submit(&SubmitSpec::gsm("Shop", "447700900003", "right away").dlr())
        .await
        .unwrap();
    assert!(now.is_ok(), "{now:?}");

    let deferred = sendsms(
        &gw,
        "/cgi-bin/sendsms?username=tester&password=foobar&from=Shop&to=447700900004&text=deferred&deferred=5",
    )
    .await;
    assert_eq!(deferred.status, 202, "{}", deferred.text());
    let api = post_message(
        &gw,
        r#"{"from":"Shop","to":"447700900005","text":"from the api","deliver_at":"2099-06-01T08:30:00Z"}"#,
    )
    .await;
    assert_eq!(api.status, 202, "{}", api.text());
    let bad = post_message(
        &gw,
        r#"{"from":"Shop","to":"447700900006","text":"x","deliver_at":"tomorrow"}"#,
    )
    .await;
    assert_eq!(bad.status, 400);
    assert!(bad.text().contains("deliver_at"), "{}", bad.text());

    assert!(
        smsc.wait_submits(5, WAIT).await,
        "the provider got {:?}",
        smsc.submits().len()
    );
    let sent = schedule_of(&smsc, "in an hour");
    assert!(sent.ends_with("00+"), "absolute UTC: {sent}");
    assert!(near(smpp_time_ms(&sent), before + 3_600_000), "{sent}");
    assert_eq!(
        smpp_time_ms(&schedule_of(&smsc, "absolute")),
        smpp_time_ms("990101100000000+"),
        "the same instant, in UTC"
    );
    assert_eq!(schedule_of(&smsc, "right away"), "");
    assert!(near(smpp_time_ms(&schedule_of(&smsc, "deferred")), before + 300_000));
    assert_eq!(schedule_of(&smsc, "from the api"), "990601083000000+");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_beyond_what_receipts_are_kept_for_is_refused() {
    let smsc = smsc().await;
    // Receipts kept 3 hours: a message asking for one may be scheduled 2 hours ahead.
    let config = [
        memory_config().as_str(),
        SENDSMS_USERS,
        "[dlr]\nbackend = \"memory\"\nretention = \"3h\"\n",
    ]
    .concat();
    let gw = gateway(&config, &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let too_far = esme
        .submit(
            &SubmitSpec::gsm("Shop", "447700900011", "too far")
                .dlr()
                .with_schedule("000000030000000R"),
        )
        .await
        .unwrap();
    assert_eq!(too_far.status, CommandStatus::EsmeRinvsched);
    let within = esme
        .submit(
            &SubmitSpec::gsm("Shop", "447700900012", "within")
                .dlr()
                .with_schedule("000000013000000R"),
        )
        .await
        .unwrap();
    assert!(within.is_ok(), "{within:?}");
    // Without a receipt nothing is kept for it: any time goes.
    let no_receipt = esme
        .submit(&SubmitSpec::gsm("Shop", "447700900013", "no receipt").with_schedule("000010000000000R"))
        .await
        .unwrap();
    assert!(no_receipt.is_ok(), "{no_receipt:?}");
    // After 2099 no SMPP time can carry it: refused, receipt or not, whatever the ingress.
    let beyond = esme
        .submit(&SubmitSpec::gsm("Shop", "447700900017", "beyond").with_schedule("990000000000000R"))
        .await
        .unwrap();
    assert_eq!(beyond.status, CommandStatus::EsmeRinvsched);
    let huge = sendsms(
        &gw,
        "/cgi-bin/sendsms?username=tester&password=foobar&from=Shop&to=447700900018&text=x&deferred=4294967295",
    )
    .await;
    assert_eq!(
        (huge.status, huge.text().as_str()),
        (400, "Deferred field misformed, rejected")
    );
    let far = post_message(
        &gw,
        r#"{"from":"Shop","to":"447700900019","text":"x","deliver_at":"2100-01-01T00:00:00Z"}"#,
    )
    .await;
    assert_eq!(far.status, 400);
    assert!(far.text().contains("2099"), "{}", far.text());
    let malformed = esme
        .submit(&SubmitSpec::gsm("Shop", "447700900014", "bad").with_schedule("991301000000000+"))
        .await
        .unwrap();
    assert_eq!(malformed.status, CommandStatus::EsmeRinvsched);

    let deferred = sendsms(
        &gw,
        "/cgi-bin/sendsms?username=tester&password=foobar&from=Shop&to=447700900015&text=x&deferred=600\
         &dlr-mask=1&dlr-url=http%3A%2F%2F127.0.0.1%3A9%2Fdlr",
    )
    .await;
    assert_eq!(
        (deferred.status, deferred.text().as_str()),
        (400, "Deferred field misformed, rejected")
    );
    let api = post_message(&gw, r#"{"from":"Shop","to":"447700900016","text":"x","callback_url":"http://127.0.0.1:9/cb","deliver_at":"2099-01-01T00:00:00Z"}"#).await;
    assert_eq!(api.status, 400);
    assert!(api.text().contains("deliver_at"), "{}", api.text());

    assert!(smsc.wait_submits(2, WAIT).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let texts: Vec<String> = smsc.submits().iter().filter_map(|s| s.text().ok()).collect();
    assert_eq!(texts.len(), 2, "only the admitted ones went: {texts:?}");
    assert!(texts.contains(&"within".to_string()) && texts.contains(&"no receipt".to_string()));
}
