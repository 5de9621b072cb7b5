//! A new long message whose reference collides with an abandoned multipart group.
//!
//! An ESME sends part 1 of a 3-part message and is cut off (its connection drops, or
//! Sendium is SIGKILLed); the other parts never come. It then sends a new 3-part message
//! to the same number with the same reference, as 8-bit references wrap every 256
//! messages. The SMSC must receive the new message whole, with its own text; the
//! abandoned part must get a failure receipt (where the profile keeps it across the
//! cut), and no acknowledged part may be lost. For UDH with 8- and 16-bit references and
//! for SAR, on the memory profile and on file/file/file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashSet;
use std::time::Duration;

use sendium_integration_tests::{
    Alphabet, BindKind, Concat, DlrParts, GatewayProcess, ReceiptState, SubmitSpec, TestEsme,
};
use support::*;

const TO: &str = "46711111111";
/// Texts of 400 GSM characters: three parts with any of the three ways of marking them.
fn old_text() -> String {
    pad("The old message, cut off after its first part: parts two and three never came. ")
}

fn new_text() -> String {
    pad("A new message that reuses the reference of the abandoned one; it must arrive whole. ")
}

fn pad(sentence: &str) -> String {
    sentence.chars().cycle().take(400).collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// The ESME's connection drops.
    Disconnect,
    /// Sendium is SIGKILLed and restarted on the same data.
    Sigkill,
}

fn parts(text: &str, concat: Concat) -> Vec<SubmitSpec> {
    let parts = SubmitSpec::multipart("Shop", TO, Alphabet::Gsm7, text, concat, DlrParts::Every);
    assert_eq!(parts.len(), 3, "the texts are three parts long");
    parts
}

async fn bind(gw: &GatewayProcess) -> TestEsme {
    TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap()
}

/// The scenario on one profile (`durable`: file/file/file with the file DLR store, else
/// memory), with one way of marking parts and one way of cutting the old message off.
async fn new_message_after_an_abandoned_group(durable: bool, concat: Concat, cut: Cut) {
    let what = format!(
        "{} {concat:?} {cut:?}",
        if durable { "file/file/file" } else { "memory" }
    );
    let smsc = smsc().await;
    let config = if durable {
        durable_config(DLR_FILE)
    } else {
        memory_config()
    };
    let mut gw = gateway(&config, &smsc).await;

    let old = parts(&old_text(), concat);
    let esme = bind(&gw).await;
    let old_id = esme.submit(&old[0]).await.unwrap();
    assert!(old_id.is_ok(), "{what}: part 1 of the old message is acknowledged");
    let old_id = old_id.message_id;
    let esme = match cut {
        Cut::Disconnect => {
            esme.close().await;
            bind(&gw).await
        }
        Cut::Sigkill => kill_and_rebind(&mut gw, esme, BindKind::Transceiver).await,
    };

    let new = parts(&new_text(), concat);
    let new_ids: Vec<String> = esme
        .submit_all(&new)
        .await
        .unwrap()
        .into_iter()
        .map(|r| {
            assert!(r.is_ok(), "{what}: a part of the new message was refused");
            r.message_id
        })
        .collect();
    assert_eq!(new_ids.iter().collect::<HashSet<_>>().len(), 3, "{what}: three ids");
    assert!(
        !new_ids.contains(&old_id),
        "{what}: the new part 1 has an id of its own"
    );

    assert!(
        eventually(WAIT, || !smsc.messages_to(TO).is_empty()).await,
        "{what}: the new message reached the SMSC"
    );
    // The old part kept across the cut expires at once; only a memory profile's restart
    // loses it (as that profile documents), with its receipt.
    let old_kept = durable || cut == Cut::Disconnect;
    let mut expected: HashSet<String> = new_ids.iter().cloned().collect();
    if old_kept {
        expected.insert(old_id.clone());
    }
    let receipts = esme.wait_receipts(expected.len(), WAIT).await;
    // Anything late would be a second message or a receipt too many.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let messages = smsc.messages_to(TO);
    assert_eq!(messages.len(), 1, "{what}: one message reached the SMSC: {messages:?}");
    assert_eq!(messages[0].text, new_text(), "{what}: the new message, whole and alone");
    let receipts = if esme.receipts().len() > receipts.len() {
        esme.receipts()
    } else {
        receipts
    };
    let by_id = one_receipt_per_id(&receipts, &expected);
    for id in &new_ids {
        assert_eq!(
            by_id[id].state(),
            Some(ReceiptState::Delivered),
            "{what}: new part {id}"
        );
    }
    if old_kept {
        assert_eq!(
            by_id[&old_id].state(),
            Some(ReceiptState::Expired),
            "{what}: the abandoned part failed"
        );
        assert!(
            wait_metric(&gw, "sendium_multipart_groups_superseded_total", "", |v| v == 1.0).await,
            "{what}: the superseded group is counted"
        );
    }
    assert!(
        wait_metric(&gw, "sendium_stage_records", "stage=\"pending\"", |v| v == 0.0).await,
        "{what}: nothing left pending"
    );
}

#[tokio::test]
async fn udh8_on_memory() {
    for cut in [Cut::Disconnect, Cut::Sigkill] {
        new_message_after_an_abandoned_group(false, Concat::Udh8(9), cut).await;
    }
}

#[tokio::test]
async fn udh16_on_memory() {
    for cut in [Cut::Disconnect, Cut::Sigkill] {
        new_message_after_an_abandoned_group(false, Concat::Udh16(0x0909), cut).await;
    }
}

#[tokio::test]
async fn sar_on_memory() {
    for cut in [Cut::Disconnect, Cut::Sigkill] {
        new_message_after_an_abandoned_group(false, Concat::Sar(9), cut).await;
    }
}

#[tokio::test]
async fn udh8_on_file_file_file() {
    for cut in [Cut::Disconnect, Cut::Sigkill] {
        new_message_after_an_abandoned_group(true, Concat::Udh8(9), cut).await;
    }
}

#[tokio::test]
async fn udh16_on_file_file_file() {
    for cut in [Cut::Disconnect, Cut::Sigkill] {
        new_message_after_an_abandoned_group(true, Concat::Udh16(0x0909), cut).await;
    }
}

#[tokio::test]
async fn sar_on_file_file_file() {
    for cut in [Cut::Disconnect, Cut::Sigkill] {
        new_message_after_an_abandoned_group(true, Concat::Sar(9), cut).await;
    }
}

/// A part sent again — its answer was lost — is answered with the id it got, before
/// and after its message completed, and the next message with the reference still
/// arrives whole.
#[tokio::test]
async fn retransmitted_parts_get_their_first_ids_and_mix_into_nothing() {
    for durable in [false, true] {
        let smsc = smsc().await;
        let config = if durable {
            durable_config(DLR_FILE)
        } else {
            memory_config()
        };
        let gw = gateway(&config, &smsc).await;
        let esme = bind(&gw).await;
        let first = parts(&old_text(), Concat::Udh8(200));
        let mut ids = Vec::new();
        for (i, part) in first.iter().enumerate() {
            let id = esme.submit(part).await.unwrap().message_id;
            // Each part twice; the last one's repeat comes after the message completed.
            let again = esme.submit(part).await.unwrap();
            assert!(again.is_ok());
            assert_eq!(again.message_id, id, "part {} sent again", i + 1);
            ids.push(id);
        }
        let next: Vec<String> = esme
            .submit_all(&parts(&new_text(), Concat::Udh8(200)))
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.message_id)
            .collect();
        assert!(eventually(WAIT, || smsc.messages_to(TO).len() == 2).await);
        let expected: HashSet<String> = ids.iter().chain(&next).cloned().collect();
        let receipts = esme.wait_receipts(expected.len(), WAIT).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let texts: Vec<String> = smsc.messages_to(TO).into_iter().map(|m| m.text).collect();
        assert_eq!(texts, vec![old_text(), new_text()]);
        for r in one_receipt_per_id(&receipts, &expected).values() {
            assert_eq!(r.state(), Some(ReceiptState::Delivered));
        }
        assert!(wait_metric(&gw, "sendium_multipart_groups_superseded_total", "", |v| v == 0.0).await);
    }
}
