//! HTTP ingress end to end: 202 with an id after admission, receipts POSTed to the
//! callback with retries, idempotency, and the error answers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashSet;
use std::time::Duration;

use sendium_integration_tests::CallbackServer;
use serde_json::Value;
use support::*;

fn body(to: &str, text: &str, callback: Option<&str>, key: Option<&str>) -> String {
    let mut v = serde_json::json!({"from": "Shop", "to": to, "text": text});
    if let Some(c) = callback {
        v["callback_url"] = Value::String(c.to_string());
    }
    if let Some(k) = key {
        v["idempotency_key"] = Value::String(k.to_string());
    }
    v.to_string()
}

#[tokio::test]
async fn http_submissions_reach_the_provider_and_receipts_reach_the_callback() {
    let smsc = smsc().await;
    let gw = gateway(&memory_config(), &smsc).await;
    let cb = CallbackServer::start().await;
    let mut ids = HashSet::new();
    for i in 0..50 {
        let text = if i % 2 == 0 {
            format!("http {i}")
        } else {
            format!("привет {i}")
        };
        let r = gw
            .post_message(
                "key-1",
                &body(&format!("4473{i:04}"), &text, Some(&cb.url("/dlr")), None),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 202, "{}", r.text());
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        ids.insert(v["id"].as_str().unwrap().to_string());
    }
    assert_eq!(ids.len(), 50);
    assert!(smsc.wait_messages(50, WAIT).await);
    assert_eq!(smsc.messages_to("44730001")[0].text, "привет 1");
    assert!(cb.wait_accepted(50, WAIT).await, "callbacks: {}", cb.accepted().len());
    let got: HashSet<String> = cb.receipts().into_iter().map(|r| r.id).collect();
    assert_eq!(got, ids, "one callback per message, carrying its id");
    assert!(
        cb.receipts()
            .iter()
            .all(|r| r.status == "DELIVRD" && r.error_code == "000")
    );
}

/// A callback endpoint that fails, then recovers, still gets every receipt.
#[tokio::test]
async fn callbacks_are_retried_until_the_endpoint_recovers() {
    let smsc = smsc().await;
    let gw = gateway(&memory_config(), &smsc).await;
    let cb = CallbackServer::start().await;
    cb.set_status(Some(500));
    let mut ids = HashSet::new();
    for i in 0..5 {
        let r = gw
            .post_message(
                "key-1",
                &body(&format!("4474{i}"), "retry me", Some(&cb.url("/dlr")), None),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 202);
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        ids.insert(v["id"].as_str().unwrap().to_string());
    }
    assert!(cb.wait_requests(5, WAIT).await, "attempts were made while failing");
    assert!(cb.accepted().is_empty());
    cb.heal();
    assert!(
        cb.wait_accepted(5, WAIT).await,
        "accepted after recovery: {}",
        cb.accepted().len()
    );
    let got: HashSet<String> = cb.receipts().into_iter().map(|r| r.id).collect();
    assert_eq!(got, ids);
}

#[tokio::test]
async fn idempotency_key_deduplicates_per_account() {
    let smsc = smsc().await;
    let gw = gateway(&memory_config(), &smsc).await;
    let first = gw
        .post_message("key-1", &body("447500", "once", None, Some("order-42")))
        .await
        .unwrap();
    let again = gw
        .post_message("key-1", &body("447500", "once", None, Some("order-42")))
        .await
        .unwrap();
    assert_eq!(first.status, 202);
    assert_eq!(again.status, 202);
    let a: Value = serde_json::from_slice(&first.body).unwrap();
    let b: Value = serde_json::from_slice(&again.body).unwrap();
    assert_eq!(a["id"], b["id"], "the repeat is answered with the first id");
    assert_eq!(b["duplicate"], true);
    let (status, metrics) = gw.admin_get("/metrics").await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("sendium_http_requests_total{status=\"202\"} 2"),
        "both answers counted: {metrics}"
    );
    assert!(smsc.wait_messages(1, WAIT).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(smsc.messages().len(), 1, "stored and sent once");
}

#[tokio::test]
async fn bad_requests_name_the_field_and_bad_keys_get_401() {
    let smsc = smsc().await;
    let gw = gateway(&memory_config(), &smsc).await;
    let r = gw
        .post_message("wrong", &body("447500", "x", None, None))
        .await
        .unwrap();
    assert_eq!(r.status, 401);
    let r = gw.post_message("key-1", r#"{"from":"Shop","text":"x"}"#).await.unwrap();
    assert_eq!(r.status, 400);
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["field"], "to");
    let r = gw
        .post_message("key-1", &body("447500", "x", Some("not-a-url"), None))
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["field"], "callback_url");
    let r = gw.post_message("key-1", "{not json").await.unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(smsc.stats().submits, 0);
}

/// Backpressure: a full pending stage answers 503 (and SMPP ESME_RMSGQFUL), never 202.
#[tokio::test]
async fn full_pending_stage_answers_503() {
    let smsc = smsc().await;
    // The provider stops answering, so nothing completes and pending fills.
    smsc.faults().stop_answering(true);
    let config = format!("[sms.pending]\nmax-messages = 5\n{}", memory_config());
    let gw = gateway(&config, &smsc).await;
    let mut statuses = Vec::new();
    for i in 0..8 {
        let r = gw
            .post_message("key-1", &body(&format!("4476{i}"), "fill", None, None))
            .await
            .unwrap();
        statuses.push(r.status);
    }
    assert_eq!(statuses.iter().filter(|s| **s == 202).count(), 5, "{statuses:?}");
    assert!(statuses[5..].iter().all(|s| *s == 503), "{statuses:?}");
}
