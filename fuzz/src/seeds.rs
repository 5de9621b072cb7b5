//! The seed corpus: small valid inputs for each target, built with Sendium's own
//! builders and encoders so they stay valid as the formats do.
//!
//! `cargo test --manifest-path fuzz/Cargo.toml --lib` writes them to
//! `fuzz/corpus/<target>/seed-*` (files found by fuzzing sit beside them under other
//! names and are left alone).

use bytes::BytesMut;
use rusmpp::CommandStatus;
use sendium_protocols::receipt::{ReceiptState, ReceiptText};
use sendium_protocols::smpp::frame::{self, Address, BindCredentials, BindKind, ReceiptTlvs, ShortMessage};
use sendium_protocols::text::{self, Alphabet};
use sendium_storage::envelope::{self, RecordKind};
use sendium_storage::{Branch, BranchKind, Channel, MessageId, PartInfo, PendingRecord, RoutedUnit, Timestamp};

/// One seed: the target, the file name (without the `seed-` prefix), the bytes.
pub type Seed = (&'static str, &'static str, Vec<u8>);

/// A receipt text as SMSCs write them.
pub const RECEIPT: &str =
    "id:1234 sub:001 dlvrd:001 submit date:2612040639 done date:2612040639 stat:DELIVRD err:000 text:hello";

fn encoded(command: &rusmpp::Command) -> Vec<u8> {
    let mut buf = BytesMut::new();
    frame::encode(command, &mut buf);
    buf.to_vec()
}

fn message<'a>(esm_class: u8, short_message: &'a [u8]) -> ShortMessage<'a> {
    ShortMessage {
        source: Address {
            ton: 5,
            npi: 0,
            addr: "Sendium",
        },
        destination: Address {
            ton: 1,
            npi: 1,
            addr: "46700000001",
        },
        esm_class,
        registered_delivery: 1,
        data_coding: 0,
        short_message,
        message_payload: None,
        sar: None,
    }
}

/// A submit_sm written field by field, for what the builder leaves empty
/// (validity_period).
fn raw_submit_sm(seq: u32, validity: &str, short_message: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(b"\0"); // service_type
    body.extend_from_slice(&[1, 1]);
    body.extend_from_slice(b"46700000002\0");
    body.extend_from_slice(&[1, 1]);
    body.extend_from_slice(b"46700000001\0");
    body.extend_from_slice(&[0, 0, 0]); // esm_class, protocol_id, priority_flag
    body.extend_from_slice(b"\0"); // schedule_delivery_time
    body.extend_from_slice(validity.as_bytes());
    body.push(0);
    body.extend_from_slice(&[1, 0, 0, 0]); // registered_delivery, replace, data_coding, default id
    body.push(u8::try_from(short_message.len()).unwrap_or(u8::MAX));
    body.extend_from_slice(short_message);
    let mut pdu = Vec::new();
    let length = u32::try_from(16 + body.len()).unwrap_or(u32::MAX);
    for field in [length, 0x04, 0, seq] {
        pdu.extend_from_slice(&field.to_be_bytes());
    }
    pdu.extend_from_slice(&body);
    pdu
}

fn smpp_server_frames() -> Vec<Seed> {
    let bind = frame::bind(
        BindKind::Transceiver,
        1,
        &BindCredentials {
            system_id: "esme1",
            password: "secret",
            system_type: "",
        },
    )
    .expect("bind");
    let submit = frame::submit_sm(2, &message(0, b"hello")).expect("submit_sm");
    let mut udh = text::concat_udh_8bit(7, 2, 1).to_vec();
    udh.extend_from_slice(b"part one");
    let udh_submit = frame::submit_sm(3, &message(0x40, &udh)).expect("submit_sm");
    let mut sar = message(0, b"part two");
    sar.sar = Some((7, 2, 2));
    let sar_submit = frame::submit_sm(4, &sar).expect("submit_sm");
    let mut payload = message(0, b"");
    let long = vec![b'x'; 300];
    payload.message_payload = Some(&long);
    let payload_submit = frame::submit_sm(5, &payload).expect("submit_sm");

    let with = |config: u8, cuts: &[u8], pdus: &[Vec<u8>]| {
        let mut out = vec![config];
        out.extend_from_slice(cuts);
        for pdu in pdus {
            out.extend_from_slice(pdu);
        }
        out
    };
    let session = [
        encoded(&bind),
        encoded(&frame::enquire_link(6)),
        encoded(&submit),
        encoded(&frame::unbind(7)),
    ];
    vec![
        ("smpp_server_frames", "session", with(0, &[], &session)),
        // Three cuts: 5, 20 and 40 bytes into the stream.
        (
            "smpp_server_frames",
            "session-split",
            with(3 << 2, &[5, 15, 20], &session),
        ),
        (
            "smpp_server_frames",
            "multipart",
            with(0, &[], &[encoded(&udh_submit), encoded(&sar_submit)]),
        ),
        (
            "smpp_server_frames",
            "payload",
            with(0, &[], &[encoded(&payload_submit)]),
        ),
        (
            "smpp_server_frames",
            "validity",
            with(1 << 2, &[30], &[raw_submit_sm(8, "000001000000000R", b"expires")]),
        ),
        // max_command_length 64: the 300-octet payload is refused.
        (
            "smpp_server_frames",
            "too-long",
            with(2, &[], &[encoded(&payload_submit)]),
        ),
    ]
}

fn deliver_body(esm_class: u8, text: &str, receipt: Option<ReceiptTlvs<'_>>) -> Vec<u8> {
    let command = frame::deliver_sm(9, &message(esm_class, text.as_bytes()), receipt.as_ref()).expect("deliver_sm");
    encoded(&command)[16..].to_vec()
}

fn smpp_client_pdus() -> Vec<Seed> {
    let body = |command_index: u8, body: Vec<u8>| {
        let mut out = vec![command_index, 0, 0, 0, 0];
        out.extend_from_slice(&body);
        out
    };
    let tlvs = ReceiptTlvs {
        receipted_message_id: "4d2",
        message_state: ReceiptState::Delivered.message_state(),
    };
    let undeliv = ReceiptText {
        id: "0190c3e2".into(),
        sub: 1,
        dlvrd: 0,
        submit_date: Some("2612040639".into()),
        done_date: Some("261204063959".into()),
        stat: ReceiptState::Undeliverable,
        err: "045".into(),
        text: "hello: with colons".into(),
    }
    .format();
    let resp = frame::submit_sm_resp(3, CommandStatus::EsmeRok, "0AF1").expect("submit_sm_resp");
    let mut stream = vec![0x80];
    stream.extend_from_slice(&encoded(&resp));
    stream.extend_from_slice(&encoded(
        &frame::deliver_sm(4, &message(0x04, RECEIPT.as_bytes()), Some(&tlvs)).expect("deliver_sm"),
    ));
    stream.extend_from_slice(&encoded(&frame::enquire_link(5)));
    vec![
        (
            "smpp_client_pdus",
            "receipt",
            body(0, deliver_body(0x04, RECEIPT, None)),
        ),
        (
            "smpp_client_pdus",
            "receipt-tlvs",
            body(0, deliver_body(0x04, RECEIPT, Some(tlvs))),
        ),
        (
            "smpp_client_pdus",
            "receipt-undeliv",
            body(0, deliver_body(0x04, &undeliv, None)),
        ),
        (
            "smpp_client_pdus",
            "tlv-only",
            body(0, deliver_body(0x04, "", Some(tlvs))),
        ),
        (
            "smpp_client_pdus",
            "mobile-originated",
            body(0, deliver_body(0x00, "hi there", None)),
        ),
        ("smpp_client_pdus", "stream", stream),
    ]
}

fn receipt_text() -> Vec<Seed> {
    let with = |flags: u8, number: u64, text: &str| {
        let mut out = vec![flags];
        out.extend_from_slice(&number.to_be_bytes());
        out.extend_from_slice(text.as_bytes());
        out
    };
    vec![
        ("receipt_text", "appendix-b", with(0x10, 1234, RECEIPT)),
        (
            "receipt_text",
            "lenient",
            with(
                0x37,
                1_715_004,
                "Id:1A2B3C Sub:1 DLVRD:1 submit_date:240229134559 Done_Date:2402291346 Stat:delivered Err:0 Text:a b:c",
            ),
        ),
        ("receipt_text", "tlv-padded", with(0xF3, u64::MAX, "000001a2b3c\0\0")),
        ("receipt_text", "date", with(0x20, 0, "2612040639")),
    ]
}

fn text_decoding() -> Vec<Seed> {
    let case = |selector: u8, head: &[u8], data: &[u8]| {
        let mut out = vec![selector];
        out.extend_from_slice(head);
        out.extend_from_slice(data);
        out
    };
    let gsm = text::encode(Alphabet::Gsm7, "Hello {world} €5 @home").expect("gsm");
    let ucs2 = text::encode(Alphabet::Ucs2, "Привет 👋 мир").expect("ucs2");
    let latin1 = text::encode(Alphabet::Latin1, "café").expect("latin1");
    let long_gsm = text::encode(Alphabet::Gsm7, &"[x]".repeat(60)).expect("gsm");
    let long_ucs2 = text::encode(Alphabet::Ucs2, &"😀a".repeat(50)).expect("ucs2");
    let mut udh = text::concat_udh_16bit(300, 3, 2).to_vec();
    udh.extend_from_slice(b"second part");
    // Reassembly steps: [op, total, seq, text]; op bits 0-1 reference, 2 account,
    // 3 destination, 0x20 with op>>6 of 0 completes a unit and of 1 expires groups.
    let steps: Vec<u8> = vec![
        0x01, 1, 0, b'a', // ref 1, total 2, seq 1
        0x01, 1, 1, b'b', // ref 1, total 2, seq 2: complete
        0x02, 2, 0, b'c', // ref 2, total 3, seq 1
        0x02, 2, 0, b'c', // the same part again: a retransmission
        0x02, 1, 1, b'd', // ref 2 with another total: supersedes
        0x20, // complete the oldest ready unit
        0x60, // expire every open group
    ];
    vec![
        ("text_decoding", "decode-gsm", case(0, &[0x00], &gsm)),
        ("text_decoding", "decode-ucs2", case(0, &[0x08], &ucs2)),
        ("text_decoding", "decode-latin1", case(0, &[0x03], &latin1)),
        ("text_decoding", "split-gsm", case(1, &[0, 160, 153], &long_gsm)),
        ("text_decoding", "split-ucs2", case(1, &[2, 140, 134], &long_ucs2)),
        ("text_decoding", "encode", case(2, &[], "Grüße 👋 {x}".as_bytes())),
        ("text_decoding", "udh", case(3, &[1, 44, 3, 2], &udh)),
        ("text_decoding", "reassembly", case(4, &[], &steps)),
    ]
}

fn http_json_body() -> Vec<Seed> {
    [
        ("minimal", r#"{"from":"Shop","to":"+447700900123","text":"hi"}"#),
        (
            "full",
            r#"{"from":"46700000001","to":"46700000002","text":"Grüße 👋","callback_url":"https://example.com/dlr?x=1","idempotency_key":"k-1"}"#,
        ),
        (
            "nulls",
            r#"{"from":"My Shop","to":"12","text":"x\ny","callback_url":null,"idempotency_key":null}"#,
        ),
        ("unknown-field", r#"{"from":"1","to":"12","text":"x","extra":[1,{"a":null}]}"#),
        ("private-callback", r#"{"from":"1","to":"12","text":"x","callback_url":"http://127.0.0.1:9/cb"}"#),
    ]
    .into_iter()
    .map(|(name, body)| ("http_json_body", name, body.as_bytes().to_vec()))
    .collect()
}

fn kannel_sendsms() -> Vec<Seed> {
    [
        ("minimal", "username=app&password=secret&from=Shop&to=447700900123&text=hello"),
        (
            "receivers-and-dlr",
            "from=%2B46700000001&to=46700000002+%2B46700000003+46700000002&text=Hi+there&dlr-mask=31&dlr-url=https%3A%2F%2Fexample.com%2Fdlr%3Fid%3D%25i%26s%3D%25d",
        ),
        ("latin1", "from=Shop&to=12345&text=Gr%FC%DFe&charset=ISO-8859-1&coding=0&mclass=1"),
        ("ucs2", "from=Shop&to=12345&text=%00h%00i&coding=2&validity=60&deferred=5&priority=1"),
        ("udh-part", "from=Shop&to=12345&udh=%05%00%03%2A%02%01&text=part+one&smsc=up-a"),
        ("binary", "from=Shop&to=12345&text=%01%02%FF&coding=1&pid=65&mwi=-1"),
    ]
    .into_iter()
    .map(|(name, query)| ("kannel_sendsms", name, query.as_bytes().to_vec()))
    .collect()
}

fn http_provider_receipts() -> Vec<Seed> {
    // The first byte picks the pointers (see the target): 0x24 is /id, /status and
    // /error, 0x4A /data/id, /data/status and /data/error_code, 0x00 /id and /status
    // without an error pointer. Then a length byte and the secret, then the body.
    let seed = |pick: u8, secret: &[u8], body: &str| {
        let mut out = vec![pick, secret.len() as u8];
        out.extend_from_slice(secret);
        out.extend_from_slice(body.as_bytes());
        out
    };
    vec![
        (
            "http_provider_receipts",
            "one",
            seed(0x24, b"s3cret", r#"{"id":"abc-1","status":"delivered","error":"0"}"#),
        ),
        (
            "http_provider_receipts",
            "array",
            seed(
                0x24,
                b"s3cret",
                r#"[{"id":"a","status":"DELIVERED"},{"id":17,"status":"failed","error":"E_30003"}]"#,
            ),
        ),
        (
            "http_provider_receipts",
            "nested",
            seed(
                0x4A,
                b"",
                r#"{"data":{"id":"x","status":"expired","error_code":12},"message_id":"m-1"}"#,
            ),
        ),
        (
            "http_provider_receipts",
            "no-status",
            seed(0x00, b"k", r#"[{"id":"a"}]"#),
        ),
        ("http_provider_receipts", "not-json", seed(0x00, b"k", "id=a&status=ok")),
    ]
}

fn cbor_envelope() -> Vec<Seed> {
    let id = MessageId::from_bytes([1; 16]);
    let record = PendingRecord {
        id,
        account: "esme1".into(),
        channel: Channel::Http,
        source: sendium_storage::Address::new(5, 0, "Sendium"),
        destination: sendium_storage::Address::new(1, 1, "447700900123"),
        service_type: "CMT".into(),
        esm_class: 0,
        protocol_id: 0,
        priority: 1,
        data_coding: 8,
        payload: vec![0, b'h', 0, b'i'],
        part: Some(PartInfo {
            reference: 300,
            total: 3,
            seq: 2,
            expires_at: Timestamp(1_780_000_000_000),
        }),
        registered_delivery: 1,
        callback_url: Some("https://example.com/dlr".into()),
        idempotency_key: Some("k-1".into()),
        accepted_at: Timestamp(1_779_999_000_000),
        valid_until: Some(Timestamp(1_780_100_000_000)),
        dlr_mask: None,
        route_priority: 0,
        destination_hint: None,
        deliver_at: None,
    };
    let routed = RoutedUnit {
        id,
        members: vec![id, MessageId::from_bytes([2; 16])],
        route: "default".into(),
        routed_at: Timestamp(1_779_999_000_500),
        branches: vec![Branch {
            no: 0,
            kind: BranchKind::Primary,
            targets: vec!["up-a".into(), "up-b".into()],
            outcome: None,
            failed_over_from: vec!["up-c".into()],
        }],
    };
    let sealed_record = envelope::encode(RecordKind::PendingRecord, &record).expect("encode");
    let sealed_routed = envelope::encode(RecordKind::RoutedUnit, &routed).expect("encode");
    let unsealed = |sealed: &[u8]| sealed[..sealed.len() - 4].to_vec();
    let with = |mode: u8, bytes: Vec<u8>| {
        let mut out = vec![mode];
        out.extend_from_slice(&bytes);
        out
    };
    // mode: bit 0 seal, bits 1-2 type (0 PendingRecord, 1 RoutedUnit, 2 any value), bits
    // 4-7 the record kind (0 PendingRecord, 5 RoutedUnit).
    vec![
        (
            "cbor_envelope",
            "pending-record-sealed",
            with(0x00, sealed_record.clone()),
        ),
        ("cbor_envelope", "pending-record", with(0x01, unsealed(&sealed_record))),
        ("cbor_envelope", "routed-unit", with(0x53, unsealed(&sealed_routed))),
        ("cbor_envelope", "any-value", with(0x05, unsealed(&sealed_record))),
    ]
}

fn data_dir_recovery() -> Vec<Seed> {
    vec![
        ("data_dir_recovery", "crash-image", vec![0]),
        ("data_dir_recovery", "closed-image", vec![1]),
        // File 1 (journal.0), set a byte 40 bytes in to 0xFF.
        ("data_dir_recovery", "journal-byte", vec![0, 1, 0, 0, 0, 0, 40, 0xFF]),
        // File 3 (pending.redb), flip bits at 4096.
        ("data_dir_recovery", "pending-bits", vec![1, 3, 1, 0, 0, 0x10, 0, 0x80]),
    ]
}

/// Every seed of every target.
pub fn all() -> Vec<Seed> {
    [
        smpp_server_frames(),
        smpp_client_pdus(),
        receipt_text(),
        text_decoding(),
        http_json_body(),
        kannel_sendsms(),
        http_provider_receipts(),
        cbor_envelope(),
        data_dir_recovery(),
    ]
    .concat()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    #[test]
    fn write_seed_corpus() {
        let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
        for (target, name, bytes) in super::all() {
            let dir = corpus.join(target);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
        }
    }
}
