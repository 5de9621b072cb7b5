//! What an HTTP provider sends back: the receipts it posts to
//! `/v1/providers/<destination>/receipts` (`http_provider::receipts::parse_receipts`
//! with the destination's JSON pointers, `map_status` with its `receipt-status` table,
//! `authentic` with its secret) and the message id in its answer to a submission
//! (`http_provider::outcome::message_id`).
//!
//! Input: a byte choosing the id, status and error pointers (from pointers operators
//! configure: top-level fields, nested objects, array indexes, `~` escapes), a
//! secret (a length byte and its bytes), then the body.
//!
//! Checked: nothing panics; a body read as receipts gives one per element of a JSON
//! array (one for any other JSON value), each with a non-empty id and status word and
//! an error code that the receipt text ESMEs parse can carry (1 to 16 letters, digits,
//! `-` or `_`, a number of fewer than 3 digits padded to 3); a refused body names a receipt that exists; the body's own
//! HMAC-SHA256 signature is accepted, in either case of hex, and the same signature
//! with one character changed, a token that is not the secret, or an empty secret are
//! not.
#![no_main]
#![forbid(unsafe_code)]

use libfuzzer_sys::fuzz_target;
use sendium_fuzz::Input;
use sendium_protocols::http_provider::outcome::message_id;
use sendium_protocols::http_provider::receipts::{
    MAX_ERROR_CODE, ReceiptBodyError, ReceiptPointers, Signature, authentic, hmac_sha256, map_status, parse_receipts,
};

const ID_POINTERS: [&str; 6] = ["/id", "/message_id", "/data/id", "/results/0/id", "", "/a~1b"];
const STATUS_POINTERS: [&str; 4] = ["/status", "/data/status", "/state/0", "/s~0t"];
const ERROR_POINTERS: [Option<&str>; 4] = [None, Some("/error"), Some("/data/error_code"), Some("/err/0")];

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let pick = input.byte();
    let at = ReceiptPointers {
        id: ID_POINTERS[usize::from(pick) % ID_POINTERS.len()],
        status: STATUS_POINTERS[usize::from(pick >> 3) % STATUS_POINTERS.len()],
        error: ERROR_POINTERS[usize::from(pick >> 5) % ERROR_POINTERS.len()],
    };
    let secret = input.short_bytes();
    let body = input.rest();

    let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let elements = match &json {
        Some(serde_json::Value::Array(items)) => items.len(),
        Some(_) => 1,
        None => 0,
    };
    match parse_receipts(body, at) {
        Ok(receipts) => {
            assert!(json.is_some());
            assert_eq!(receipts.len(), elements);
            for r in &receipts {
                assert!(!r.id.is_empty() && !r.status.is_empty(), "{r:?}");
                if let Some(e) = &r.error {
                    assert!((1..=MAX_ERROR_CODE).contains(&e.len()), "error {e:?}");
                    assert!(
                        e.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b)),
                        "error {e:?}"
                    );
                    assert!(e.len() >= 3 || !e.bytes().all(|b| b.is_ascii_digit()), "unpadded {e:?}");
                }
                let listed = [(r.status.to_ascii_uppercase(), 7u8)];
                assert_eq!(map_status(&listed, &r.status), Some(7));
                let unlisted = [(format!("x{}", r.status), 9u8)];
                assert_eq!(map_status(&unlisted, &r.status), None);
            }
        }
        Err(ReceiptBodyError::NotJson) => assert!(json.is_none()),
        Err(ReceiptBodyError::NoId { index } | ReceiptBodyError::NoStatus { index }) => {
            assert!(index < elements, "receipt {index} of {elements}");
        }
    }
    if let Some(id) = message_id(body, at.id) {
        assert!(!id.is_empty());
    }

    let signature = format!("sha256={}", hex(&hmac_sha256(secret, body)));
    let accepted = authentic(Signature::HmacSha256, secret, Some(signature.as_bytes()), body);
    assert_eq!(accepted, !secret.is_empty(), "own signature");
    let upper = format!("sha256={}", hex(&hmac_sha256(secret, body)).to_ascii_uppercase());
    assert_eq!(
        authentic(Signature::HmacSha256, secret, Some(upper.as_bytes()), body),
        accepted
    );
    let mut changed = signature.into_bytes();
    let i = 7 + usize::from(pick) % 64;
    changed[i] = if changed[i] == b'0' { b'1' } else { b'0' };
    assert!(
        !authentic(Signature::HmacSha256, secret, Some(&changed), body),
        "changed signature"
    );
    assert!(!authentic(Signature::HmacSha256, secret, None, body));
    assert_eq!(
        authentic(Signature::Token, secret, Some(secret), body),
        !secret.is_empty()
    );
    assert!(!authentic(Signature::Token, secret, Some(body), body) || body == secret);
});
