//! `kind = "http"` destinations, black box: the gateway sends through a fake HTTP provider
//! (in the test kit, on 127.0.0.1). A 2xx with a message id accepts the message and the
//! provider gets the API key header (never logged); a 429 is retried and the message sent
//! once; a provider answering 500 loses its work to the next destination of the route
//! after `failover-after`; a 400 ends the message with a REJECTD receipt; `parts =
//! "whole"` sends a long message in one request, `"split"` one request per SMS part; a
//! `copy-to` HTTP destination gets its copy beside the SMPP branch; an `https://` provider
//! behind a private CA is reached through `tls-ca` and refused without it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use sendium_integration_tests::http_provider::{Answer, FakeProvider, Proof, post_receipt};
use sendium_integration_tests::{Alphabet, BindKind, GatewayProcess, ReceiptState, SubmitSpec, TestEsme, TlsFront};
use support::*;

const API_KEY: &str = "k-7f3a9c1e55d2";

fn http_destination(name: &str, port_var: &str, extra: &str) -> String {
    format!(
        "\n[[destinations]]\nname = \"{name}\"\nkind = \"http\"\nurl = \"http://127.0.0.1:{{{port_var}}}/send\"\n\
         headers = {{ Authorization = \"Bearer ${{SENDIUM_TEST_PROVIDER_KEY}}\" }}\n\
         fields = {{ to = \"{{to}}\", msg = \"{{text}}\", ref = \"{{id}}\", enc = \"{{coding}}\" }}\n\
         id-pointer = \"/message_id\"\nwindow = 10\nresponse-timeout = \"2s\"\nreconnect-min = \"50ms\"\n\
         reconnect-max = \"500ms\"\nfailover-after = \"1s\"\n{extra}"
    )
}

/// The gateway's configuration: listeners, these destinations and these routes.
fn config(destinations: &[String], routes: &str) -> String {
    [SMPP, HTTP, ADMIN, &destinations.concat(), routes].concat()
}

/// One HTTP destination `h` behind the default route.
fn one_destination(extra: &str) -> String {
    config(
        &[http_destination("h", "h_port", extra)],
        "\n[[routes]]\nname = \"default\"\nto = [\"h\"]\n",
    )
}

/// Starts the gateway with each `(port variable, provider)` filled in (the fields'
/// placeholders kept as they are through the test kit's own templating), and binds an
/// ESME.
async fn start(config: &str, providers: &[(&str, &FakeProvider)]) -> (GatewayProcess, TestEsme) {
    let mut b = GatewayProcess::builder(config).env("SENDIUM_TEST_PROVIDER_KEY", API_KEY);
    for p in ["to", "text", "id", "coding", "deliver_at", "SENDIUM_TEST_PROVIDER_KEY"] {
        b = b.var(p, &format!("{{{p}}}"));
    }
    for (var, provider) in providers {
        b = b.var(var, &provider.addr().port().to_string());
    }
    let gw = b.start().await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    (gw, esme)
}

/// Destination `name`'s requests by status class, from `/admin/destinations`.
async fn admin_results(gw: &GatewayProcess, name: &str) -> serde_json::Value {
    let (status, body) = gw.admin_get("/admin/destinations").await;
    assert_eq!(status, 200, "{body}");
    let all: serde_json::Value = serde_json::from_str(&body).unwrap();
    let entry = all
        .as_array()
        .and_then(|a| a.iter().find(|d| d["name"] == name))
        .cloned()
        .unwrap_or_else(|| panic!("{name} not in {body}"));
    entry["http_requests"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_with_the_api_key_which_is_never_logged() {
    let provider = FakeProvider::start().await;
    let (gw, esme) = start(&one_destination(""), &[("h_port", &provider)]).await;
    let resp = esme
        .submit(&SubmitSpec::gsm("Shop", "447700900123", "hello there").dlr())
        .await
        .unwrap();
    assert!(resp.is_ok());
    assert!(provider.wait_requests(1, WAIT).await, "the provider got no request");
    let r = &provider.requests()[0];
    assert_eq!(r.method, "POST");
    assert_eq!(r.target, "/send");
    assert_eq!(r.header("authorization"), Some(format!("Bearer {API_KEY}").as_str()));
    assert_eq!(r.header("content-type"), Some("application/json"));
    let body = r.json();
    assert_eq!(body["to"], "447700900123");
    assert_eq!(body["msg"], "hello there");
    assert_eq!(body["enc"], "gsm7");
    assert!(body["ref"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(
        wait_metric(&gw, "sendium_http_destination_requests_total", "class=\"2xx\"", |v| v
            >= 1.0)
        .await,
        "no 2xx counted"
    );
    assert_eq!(admin_results(&gw, "h").await["2xx"], 1);
    assert!(!gw.log().contains(API_KEY), "the API key reached the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_then_accepted_is_sent_once() {
    let provider = FakeProvider::start().await;
    provider.queue(&[Answer::Status(429), Answer::Status(503)]);
    let (gw, esme) = start(&one_destination(""), &[("h_port", &provider)]).await;
    assert!(
        esme.submit(&SubmitSpec::gsm("Shop", "447700900124", "retry me").dlr())
            .await
            .unwrap()
            .is_ok()
    );
    assert!(
        provider.wait_requests(3, WAIT).await,
        "not retried: {:?}",
        provider.requests()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let statuses: Vec<u16> = provider.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, vec![429, 503, 200]);
    let results = admin_results(&gw, "h").await;
    assert_eq!(
        [&results["429"], &results["5xx"], &results["2xx"]].map(serde_json::Value::as_u64),
        [Some(1), Some(1), Some(1)],
        "{results}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_error_ends_with_a_rejectd_receipt() {
    let provider = FakeProvider::start().await;
    provider.queue(&[Answer::Status(400)]);
    let (gw, esme) = start(&one_destination(""), &[("h_port", &provider)]).await;
    let resp = esme
        .submit(&SubmitSpec::gsm("Shop", "447700900125", "refused").dlr())
        .await
        .unwrap();
    assert!(resp.is_ok());
    let receipts = esme.wait_receipts(1, WAIT).await;
    assert_eq!(receipts.len(), 1, "{receipts:?}");
    assert_eq!(receipts[0].message_id(), Some(resp.message_id.as_str()));
    assert_eq!(receipts[0].stat, Some(ReceiptState::Rejected));
    assert_eq!(receipts[0].err.as_deref(), Some("400"), "err carries the HTTP status");
    assert_eq!(provider.requests().len(), 1, "a 400 is not retried");
    let results = admin_results(&gw, "h").await;
    assert_eq!(
        (results["4xx"].as_u64(), results["2xx"].as_u64()),
        (Some(1), Some(0)),
        "{results}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_provider_fails_over_to_the_next_destination() {
    let failing = FakeProvider::start().await;
    failing.set_default(Answer::Status(500));
    let backup = FakeProvider::start().await;
    let config = config(
        &[
            http_destination("h", "h_port", ""),
            http_destination("h2", "h2_port", ""),
        ],
        "\n[[routes]]\nname = \"default\"\nto = [\"h\", \"h2\"]\n",
    );
    let (_gw, esme) = start(&config, &[("h_port", &failing), ("h2_port", &backup)]).await;
    assert!(
        esme.submit(&SubmitSpec::gsm("Shop", "447700900126", "move on").dlr())
            .await
            .unwrap()
            .is_ok()
    );
    assert!(backup.wait_requests(1, WAIT).await, "never failed over");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(backup.accepted().len(), 1);
    assert!(
        failing.requests().len() >= 2,
        "the failing provider was retried before failover"
    );
    assert!(failing.accepted().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_sends_one_request_and_split_one_per_part() {
    let whole = FakeProvider::start().await;
    let split = FakeProvider::start().await;
    let config = config(
        &[
            http_destination("whole", "w_port", "parts = \"whole\"\nbody = \"form\"\n"),
            http_destination("split", "s_port", "parts = \"split\"\nmethod = \"GET\"\n"),
        ],
        "\n[[routes]]\nname = \"w\"\ndestination-prefix = \"441\"\nto = [\"whole\"]\n\
         \n[[routes]]\nname = \"s\"\ndestination-prefix = \"442\"\nto = [\"split\"]\n",
    );
    let (_gw, esme) = start(&config, &[("w_port", &whole), ("s_port", &split)]).await;
    let text: String = "0123456789".repeat(40);
    assert!(
        esme.submit(&SubmitSpec::payload("Shop", "4411111", Alphabet::Gsm7, &text))
            .await
            .unwrap()
            .is_ok()
    );
    assert!(
        esme.submit(&SubmitSpec::payload("Shop", "4422222", Alphabet::Gsm7, &text))
            .await
            .unwrap()
            .is_ok()
    );
    assert!(whole.wait_requests(1, WAIT).await);
    assert!(split.wait_requests(3, WAIT).await, "{:?}", split.requests());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let w = whole.requests();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].header("content-type"), Some("application/x-www-form-urlencoded"));
    let field = |f: &[(String, String)], k: &str| f.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(field(&w[0].form(), "msg").as_deref(), Some(text.as_str()));
    let s = split.requests();
    assert_eq!(s.len(), 3);
    assert!(s.iter().all(|r| r.method == "GET"));
    let mut parts: Vec<(String, String)> = s
        .iter()
        .filter_map(|r| Some((field(&r.form(), "ref")?, field(&r.form(), "msg")?)))
        .collect();
    parts.sort();
    let joined: String = parts.iter().map(|(_, m)| m.as_str()).collect();
    assert_eq!(joined, text);
    let refs: std::collections::HashSet<String> = s.iter().filter_map(|r| field(&r.form(), "ref")).collect();
    assert_eq!(refs.len(), 3, "each part has its own id");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posted_receipts_are_authenticated_and_matched() {
    let provider = FakeProvider::start().await;
    let receipts = "receipt-secret = \"rs-1\"\nreceipt-signature = \"hmac-sha256\"\n\
                    receipt-status = { failed = \"UNDELIV\", queued = \"ENROUTE\" }\n\
                    receipt-id-pointer = \"/message_id\"\nreceipt-status-pointer = \"/status\"\n\
                    receipt-error-pointer = \"/code\"\n";
    let (gw, esme) = start(&one_destination(receipts), &[("h_port", &provider)]).await;
    let resp = esme
        .submit(&SubmitSpec::gsm("Shop", "447700900127", "receipt please").dlr())
        .await
        .unwrap();
    assert!(resp.is_ok());
    assert!(provider.wait_requests(1, WAIT).await);
    let id = provider.requests()[0].message_id.clone().unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let body = format!("{{\"message_id\":\"{id}\",\"status\":\"failed\",\"code\":21}}");
    assert_eq!(
        post_receipt(gw.http_addr(), "h", &body, Proof::Hmac("wrong")).await,
        401
    );
    assert_eq!(post_receipt(gw.http_addr(), "h", &body, Proof::None).await, 401);
    assert_eq!(
        post_receipt(gw.http_addr(), "h", &body, Proof::Token("rs-1")).await,
        401
    );
    assert_eq!(
        post_receipt(gw.http_addr(), "nope", &body, Proof::Hmac("rs-1")).await,
        404
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(esme.receipts().is_empty(), "a refused receipt was recorded");
    let queued = format!("[{{\"message_id\":\"{id}\",\"status\":\"queued\"}}]");
    assert_eq!(
        post_receipt(gw.http_addr(), "h", &queued, Proof::Hmac("rs-1")).await,
        200
    );
    let odd = format!("{{\"message_id\":\"{id}\",\"status\":\"weird\"}}");
    assert_eq!(post_receipt(gw.http_addr(), "h", &odd, Proof::Hmac("rs-1")).await, 400);
    assert_eq!(post_receipt(gw.http_addr(), "h", &body, Proof::Hmac("rs-1")).await, 200);
    let got = esme.wait_receipts(1, WAIT).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].message_id(), Some(resp.message_id.as_str()));
    assert_eq!(got[0].stat, Some(ReceiptState::Undeliverable));
    assert_eq!(got[0].err.as_deref(), Some("021"), "err is the provider's code");
    assert!(!gw.log().contains("rs-1"), "the receipt secret reached the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_goes_to_an_http_destination_beside_the_smpp_branch() {
    let smsc = smsc().await;
    let provider = FakeProvider::start().await;
    let config = config(
        &[
            UPSTREAM.replace("{smsc_port}", &smsc.port().to_string()),
            http_destination("h", "h_port", ""),
        ],
        "\n[[routes]]\nname = \"default\"\nto = [\"upstream\"]\ncopy-to = [\"h\"]\n",
    );
    let (_gw, esme) = start(&config, &[("h_port", &provider)]).await;
    let resp = esme
        .submit(&SubmitSpec::gsm("Shop", "447700900128", "one for each").dlr())
        .await
        .unwrap();
    assert!(resp.is_ok());
    assert!(smsc.wait_submits(1, WAIT).await, "the SMPP branch was not sent");
    assert!(provider.wait_requests(1, WAIT).await, "the copy was not sent");
    let receipts = esme.wait_receipts(1, WAIT).await;
    assert_eq!(receipts.len(), 1, "the SMPP branch's receipt: {receipts:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(provider.requests().len(), 1);
    assert_eq!(provider.requests()[0].json()["msg"], "one for each");
    assert_eq!(smsc.submits().len(), 1);
    assert_eq!(esme.receipts().len(), 1, "the copy owes the ESME no receipt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destination_up_follows_whether_the_provider_can_be_reached() {
    let provider = FakeProvider::start().await;
    // A port nothing listens on.
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = config(
        &[
            http_destination("h", "h_port", ""),
            http_destination("gone", "gone_port", ""),
        ],
        "\n[[routes]]\nname = \"default\"\nto = [\"h\"]\n",
    );
    let mut b = GatewayProcess::builder(&config)
        .env("SENDIUM_TEST_PROVIDER_KEY", API_KEY)
        .var("h_port", &provider.addr().port().to_string())
        .var("gone_port", &closed_port.to_string());
    for p in ["to", "text", "id", "coding", "SENDIUM_TEST_PROVIDER_KEY"] {
        b = b.var(p, &format!("{{{p}}}"));
    }
    let gw = b.start().await;
    assert!(wait_metric(&gw, "sendium_destination_up", "destination=\"h\"", |v| v == 1.0).await);
    let (_, text) = gw.admin_get("/metrics").await;
    assert!(
        text.lines()
            .any(|l| l == "sendium_destination_up{destination=\"gone\"} 0"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_provider_behind_a_private_ca_is_trusted_through_tls_ca_only() {
    let provider = FakeProvider::start().await;
    // The provider's certificate, self-signed: no webpki root vouches for it.
    let dir = tempfile::tempdir().unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let (cert, key) = (dir.path().join("provider.pem"), dir.path().join("provider.key"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    let front = TlsFront::start(&cert, &key, provider.addr()).await;
    let https = |name: &str, extra: &str| {
        http_destination(name, "front_port", extra).replace("url = \"http://", "url = \"https://")
    };
    let config = config(
        &[
            https("private", &format!("tls-ca = \"{}\"\n", cert.display())),
            https("public", ""),
        ],
        "\n[[routes]]\nname = \"default\"\nto = [\"private\"]\n",
    );
    let config = config.replace("{front_port}", &front.addr().port().to_string());
    let (gw, esme) = start(&config, &[]).await;
    let resp = esme
        .submit(&SubmitSpec::gsm("Shop", "447700900123", "over https").dlr())
        .await
        .unwrap();
    assert!(resp.is_ok());
    assert!(
        provider.wait_requests(1, WAIT).await,
        "the provider got nothing through TLS"
    );
    assert_eq!(provider.requests()[0].json()["msg"], "over https");
    assert!(wait_metric(&gw, "sendium_destination_up", "destination=\"private\"", |v| v == 1.0).await);
    // The same provider without tls-ca: the webpki roots do not vouch for it, so it stays
    // down, and the log says why.
    let (_, text) = gw.admin_get("/metrics").await;
    assert!(
        text.lines()
            .any(|l| l == "sendium_destination_up{destination=\"public\"} 0"),
        "{text}"
    );
    let log = gw.log();
    assert!(
        log.lines().any(|l| l.contains("HTTP destination cannot be reached")
            && l.contains("public")
            && l.contains("UnknownIssuer")),
        "{log}"
    );
    assert_eq!(
        provider.requests().len(),
        1,
        "nothing was sent through the untrusted destination"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_message_carries_its_time_where_the_fields_say_and_fails_where_they_cannot() {
    let carrying = FakeProvider::start().await;
    let plain = FakeProvider::start().await;
    let scheduling = http_destination("h", "h_port", "")
        .replace("enc = \"{coding}\" }", "enc = \"{coding}\", when = \"{deliver_at}\" }");
    let config = config(
        &[scheduling, http_destination("plain", "plain_port", "")],
        "\n[[routes]]\nname = \"plain\"\ndestination-prefix = \"4478\"\nto = [\"plain\"]\n\
         [[routes]]\nname = \"default\"\nto = [\"h\"]\n",
    );
    let (_gw, esme) = start(&config, &[("h_port", &carrying), ("plain_port", &plain)]).await;
    let before = std::time::SystemTime::now();
    let later = esme
        .submit(
            &SubmitSpec::gsm("Shop", "447700900126", "later")
                .dlr()
                .with_schedule("000000010000000R"),
        )
        .await
        .unwrap();
    assert!(later.is_ok());
    let now = esme
        .submit(&SubmitSpec::gsm("Shop", "447700900127", "now"))
        .await
        .unwrap();
    assert!(now.is_ok());
    assert!(carrying.wait_requests(2, WAIT).await);
    let when = |text: &str| {
        carrying
            .requests()
            .iter()
            .find(|r| r.json()["msg"] == text)
            .map(|r| r.json()["when"].as_str().unwrap_or("?").to_owned())
            .unwrap()
    };
    assert_eq!(when("now"), "", "no schedule: an empty field");
    let at = humantime::parse_rfc3339(&when("later")).unwrap();
    let ahead = at.duration_since(before).unwrap();
    assert!(
        ahead > Duration::from_secs(3540) && ahead < Duration::from_secs(3660),
        "{}",
        when("later")
    );

    // A destination whose fields cannot carry the time: the branch fails rather than the
    // message going out at once.
    let refused = esme
        .submit(
            &SubmitSpec::gsm("Shop", "447800900128", "cannot wait")
                .dlr()
                .with_schedule("000000010000000R"),
        )
        .await
        .unwrap();
    assert!(refused.is_ok());
    let receipts = esme.wait_receipts(1, WAIT).await;
    let receipt = receipts
        .iter()
        .find(|r| r.message_id() == Some(refused.message_id.as_str()))
        .unwrap_or_else(|| panic!("{receipts:?}"));
    assert_eq!(receipt.stat, Some(ReceiptState::Rejected));
    assert_eq!(receipt.err.as_deref(), Some("097"), "ESME_RINVSCHED");
    assert!(plain.requests().is_empty(), "nothing was sent to be delivered at once");
}
