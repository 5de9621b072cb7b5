//! Inbound (mobile-originated) messages, black box: the test SMSC sends `deliver_sm`
//! that are not receipts to the gateway's provider session; `[[mo-routes]]` send each to
//! an ESME (as one `deliver_sm`, held until it binds) or to an HTTP URL (JSON), exactly
//! once; multipart messages (UDH and SAR, parts out of order) arrive whole; unmatched
//! ones are answered per `[mo] unrouted`; with the file DLR store a SIGKILL between the
//! provider's `deliver_sm` and the delivery downstream loses nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashMap;
use std::time::Duration;

use sendium_integration_tests::{
    Alphabet, BindKind, CallbackServer, GatewayProcess, MoSpec, SmscConfig, TestEsme, TestSmsc,
};
use sendium_protocols::text;
use support::*;

/// The gateway's system-id at the test SMSC (see `UPSTREAM`).
const PROVIDER_ACCOUNT: &str = "sendium";

/// Routes: a keyword to an HTTP URL, short code 81234 to esme1, long numbers 4470… to
/// esme2; everything else is refused.
fn mo_routes(url: &str) -> String {
    format!(
        r#"
[mo]
unrouted = "reject"
multipart-expiry = "3s"

[[mo-routes]]
name = "info"
keyword = "INFO"
to-url = "{url}"

[[mo-routes]]
name = "shortcode"
destination-prefix = "81234"
from-destination = "upstream"
to-account = "esme1"

[[mo-routes]]
name = "longnumber"
destination-regex = "^4470[0-9]+$"
to-account = "esme2"
"#
    )
}

fn ucs2(tag: &str, to: &str, s: &str) -> MoSpec {
    MoSpec {
        data_coding: 8,
        short_message: text::encode(Alphabet::Ucs2, s).unwrap(),
        ..MoSpec::gsm(tag, "447700900001", to, "")
    }
}

/// `s` in GSM 7-bit, cut in `n` parts, marked by UDH (8-bit reference) or SAR, sent in
/// the order `order` (1-based part numbers).
fn parts(tag: &str, to: &str, s: &str, n: usize, reference: u8, sar: bool, order: &[u8]) -> Vec<MoSpec> {
    let data = text::encode(Alphabet::Gsm7, s).unwrap();
    let size = data.len().div_ceil(n);
    let chunks: Vec<&[u8]> = data.chunks(size).collect();
    order
        .iter()
        .map(|&seq| {
            let chunk = chunks[usize::from(seq) - 1];
            let total = chunks.len() as u8;
            let mut spec = MoSpec::gsm(&format!("{tag}-{seq}"), "447700900002", to, "");
            if sar {
                spec.short_message = chunk.to_vec();
                spec.sar = Some((u16::from(reference) + 1000, total, seq));
            } else {
                spec.esm_class = 0x40;
                spec.short_message = [&[0x05, 0x00, 0x03, reference, total, seq][..], chunk].concat();
            }
            spec
        })
        .collect()
}

fn by_text(esme: &TestEsme) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for m in esme.mo_messages() {
        *seen.entry(m.text).or_insert(0) += 1;
    }
    seen
}

async fn answers_for(smsc: &TestSmsc, n: usize) -> HashMap<String, u32> {
    assert!(
        smsc.wait_for(WAIT, |s| s.mo_answers().len() >= n).await,
        "the gateway answered {} of {n} inbound messages",
        smsc.mo_answers().len()
    );
    smsc.mo_answers().into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_messages_reach_their_esme_or_url_exactly_once_and_whole() {
    let smsc = TestSmsc::start(SmscConfig::default()).await;
    let cb = CallbackServer::start().await;
    let config = format!("{}{}", memory_config(), mo_routes(&cb.url("/mo")));
    let gw = gateway(&config, &smsc).await;
    assert!(smsc.wait_bound(1, WAIT).await);

    // esme1 binds only after its messages arrived: they are held for it.
    let long = "This inbound message is longer than one SMS can carry, so the handset cut it in three parts and the provider sent them one by one.";
    let mut mo = vec![
        MoSpec::gsm("single", "447700900001", "81234", "hello shortcode"),
        ucs2("ucs2", "81234", "Привет, мир"),
        MoSpec::gsm("long-number", "447700900003", "447000111222", "to the long number"),
        MoSpec::gsm("info", "447700900004", "99999", "info please"),
        MoSpec::gsm("nowhere", "447700900005", "55555", "nobody takes this"),
    ];
    mo.extend(parts("udh", "81234", long, 3, 42, false, &[2, 3, 1]));
    mo.extend(parts(
        "sar",
        "81234",
        &long.replace("three", "3"),
        3,
        7,
        true,
        &[3, 1, 2],
    ));
    smsc.send_mo(PROVIDER_ACCOUNT, mo);

    let answers = answers_for(&smsc, 11).await;
    assert_eq!(
        answers["nowhere"], 0x65,
        "unrouted with unrouted = reject: ESME_RX_R_APPN"
    );
    for (tag, status) in &answers {
        if tag != "nowhere" {
            assert_eq!(*status, 0, "{tag} stored and acknowledged");
        }
    }

    assert!(
        cb.wait_accepted(1, WAIT).await,
        "the keyword route's URL got its message"
    );
    let req = &cb.accepted()[0];
    let json = req.json.as_ref().unwrap();
    assert_eq!(json["text"], "info please");
    assert_eq!(
        (json["from"].as_str(), json["to"].as_str()),
        (Some("447700900004"), Some("99999"))
    );
    assert_eq!(
        (json["coding"].as_str(), json["destination"].as_str()),
        (Some("gsm7"), Some("upstream"))
    );
    assert_eq!(json["route"], "info");
    assert!(json["id"].as_str().is_some_and(|id| id.len() == 36));
    assert!(json["received_at"].as_str().is_some());

    let esme1 = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Receiver)
        .await
        .unwrap();
    let esme2 = TestEsme::bind(gw.smpp_addr(), "esme2", "secret2", BindKind::Transceiver)
        .await
        .unwrap();
    assert!(
        eventually(WAIT, || esme1.mo_messages().len() >= 4
            && !esme2.mo_messages().is_empty())
        .await
    );
    // Nothing more comes: each exactly once.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let got = by_text(&esme1);
    assert_eq!(got.get("hello shortcode"), Some(&1), "{got:?}");
    assert_eq!(got.get("Привет, мир"), Some(&1), "{got:?}");
    assert_eq!(got.get(long), Some(&1), "UDH parts arrive as one message: {got:?}");
    assert_eq!(
        got.get(&long.replace("three", "3")),
        Some(&1),
        "SAR parts arrive as one message: {got:?}"
    );
    assert_eq!(got.len(), 4, "{got:?}");
    let single = esme1
        .mo_messages()
        .into_iter()
        .find(|m| m.text == "hello shortcode")
        .unwrap();
    assert_eq!(
        (single.source.as_str(), single.destination.as_str()),
        ("447700900001", "81234")
    );
    assert_eq!(single.esm_class & 0x3C, 0, "not a receipt");
    assert_eq!(by_text(&esme2), HashMap::from([("to the long number".to_string(), 1)]));
    assert_eq!(cb.accepted().len(), 1);
    assert!(wait_metric(&gw, "sendium_mo_delivered_total", "route=\"shortcode\"", |v| v == 4.0).await);
    assert!(
        wait_metric(&gw, "sendium_mo_unrouted_total", "destination=\"upstream\"", |v| v
            == 1.0)
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incomplete_multipart_message_goes_out_at_its_deadline_marked_incomplete() {
    let smsc = TestSmsc::start(SmscConfig::default()).await;
    let cb = CallbackServer::start().await;
    let config = format!(
        "{}[mo]\nmultipart-expiry = \"2s\"\n[[mo-routes]]\nname = \"all\"\nto-url = \"{}\"\n",
        memory_config(),
        cb.url("/mo")
    );
    let _gw = gateway(&config, &smsc).await;
    assert!(smsc.wait_bound(1, WAIT).await);
    smsc.send_mo(
        PROVIDER_ACCOUNT,
        parts("p", "81234", "first half and second half", 2, 9, false, &[1]),
    );
    assert_eq!(answers_for(&smsc, 1).await["p-1"], 0);
    assert!(
        cb.wait_accepted(1, Duration::from_secs(15)).await,
        "delivered after its deadline"
    );
    let json = cb.accepted()[0].json.clone().unwrap();
    assert_eq!(json["incomplete"], true);
    assert_eq!(json["text"], "first half an");
}

/// With a durable DLR store, inbound messages and held parts acknowledged to the
/// provider survive a SIGKILL before they were delivered.
async fn inbound_messages_survive_a_sigkill(dlr: &str) {
    let smsc = TestSmsc::start(SmscConfig::default()).await;
    let base = format!("{}{}", memory_config(), mo_routes("http://127.0.0.1:9/unused"));
    let mut gw: GatewayProcess = gateway(&durable_config_with(dlr, &base), &smsc).await;
    assert!(smsc.wait_bound(1, WAIT).await);
    let mut mo: Vec<MoSpec> = (0..20)
        .map(|i| MoSpec::gsm(&format!("m{i}"), "447700900001", "81234", &format!("kept {i}")))
        .collect();
    let whole = "two parts arrive before the crash and one after it";
    let mut multipart = parts("x", "81234", whole, 3, 5, false, &[1, 2, 3]);
    let last = multipart.pop().unwrap();
    mo.extend(multipart);
    smsc.send_mo(PROVIDER_ACCOUNT, mo);
    let answers = answers_for(&smsc, 22).await;
    assert!(answers.values().all(|s| *s == 0), "{answers:?}");

    gw.kill();
    gw.restart().await;
    assert!(smsc.wait_bound(1, WAIT).await);
    smsc.send_mo(PROVIDER_ACCOUNT, vec![last]);
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    assert!(
        eventually(WAIT, || esme.mo_messages().len() >= 21).await,
        "got {}",
        esme.mo_messages().len()
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let got = by_text(&esme);
    for i in 0..20 {
        assert_eq!(got.get(&format!("kept {i}")), Some(&1), "{got:?}");
    }
    assert_eq!(got.get(whole), Some(&1), "{got:?}");
    assert_eq!(got.len(), 21);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_messages_survive_a_sigkill_with_the_file_dlr_store() {
    inbound_messages_survive_a_sigkill(DLR_FILE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_messages_survive_a_sigkill_with_the_postgresql_dlr_store() {
    let url = sendium_storage::postgresql::test_cluster::TestCluster::shared().fresh_database();
    // A restarted process cannot release claims in a database other processes may share:
    // deliveries claimed at the kill go out again after claim-lease, kept short here.
    let dlr = pg_dlr(&url).replace("[storage.postgresql]", "claim-lease = \"10s\"\n[storage.postgresql]");
    inbound_messages_survive_a_sigkill(&dlr).await;
}

/// With the memory DLR store a SIGKILL loses what was stored and not delivered, as
/// documented.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_dlr_store_loses_undelivered_inbound_messages_on_a_sigkill() {
    let smsc = TestSmsc::start(SmscConfig::default()).await;
    let config = format!("{}{}", memory_config(), mo_routes("http://127.0.0.1:9/unused"));
    let mut gw = gateway(&config, &smsc).await;
    assert!(smsc.wait_bound(1, WAIT).await);
    smsc.send_mo(
        PROVIDER_ACCOUNT,
        vec![MoSpec::gsm("m", "447700900001", "81234", "lost")],
    );
    assert_eq!(answers_for(&smsc, 1).await["m"], 0);
    gw.kill();
    gw.restart().await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(esme.mo_messages().is_empty());
}
