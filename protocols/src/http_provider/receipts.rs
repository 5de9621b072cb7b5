//! Receipts an HTTP provider posts back: proving they come from the provider (a shared
//! token, or an HMAC-SHA256 signature of the raw body), and reading each receipt's
//! message id and status word with the destination's JSON pointers.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Header carrying the shared secret itself (`receipt-signature = "token"`).
pub const TOKEN_HEADER: &str = "x-sendium-receipt-token";
/// Header carrying `sha256=<hex>` (`receipt-signature = "hmac-sha256"`).
pub const SIGNATURE_HEADER: &str = "x-sendium-signature";

/// How a destination authenticates its receipts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signature {
    Token,
    HmacSha256,
}

/// Whether a posted receipt carries proof of the secret: `header` is the value of
/// [`TOKEN_HEADER`] or [`SIGNATURE_HEADER`] as `scheme` says. Compared in constant time;
/// an empty secret accepts nothing.
pub fn authentic(scheme: Signature, secret: &[u8], header: Option<&[u8]>, body: &[u8]) -> bool {
    let Some(header) = header else { return false };
    if secret.is_empty() {
        return false;
    }
    match scheme {
        Signature::Token => bool::from(header.ct_eq(secret)),
        Signature::HmacSha256 => {
            let Some(hex) = header.strip_prefix(b"sha256=") else {
                return false;
            };
            let expected = to_hex(&hmac_sha256(secret, body));
            bool::from(hex.to_ascii_lowercase().as_slice().ct_eq(expected.as_bytes()))
        }
    }
}

/// HMAC-SHA256 (RFC 2104).
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(message);
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One receipt read from a posted body: the provider's message id and its status word.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PostedReceipt {
    pub id: String,
    pub status: String,
}

/// Why a posted body was refused (answered 400).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptBodyError {
    #[error("the body is not JSON")]
    NotJson,
    #[error("receipt {index} has no message id at receipt-id-pointer")]
    NoId { index: usize },
    #[error("receipt {index} has no status word at receipt-status-pointer")]
    NoStatus { index: usize },
}

/// The receipts of a posted body: one JSON object, or an array of them.
pub fn parse_receipts(
    body: &[u8],
    id_pointer: &str,
    status_pointer: &str,
) -> Result<Vec<PostedReceipt>, ReceiptBodyError> {
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|_| ReceiptBodyError::NotJson)?;
    let items = match v {
        serde_json::Value::Array(items) => items,
        one => vec![one],
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let id = scalar(item.pointer(id_pointer)).ok_or(ReceiptBodyError::NoId { index })?;
            let status = scalar(item.pointer(status_pointer)).ok_or(ReceiptBodyError::NoStatus { index })?;
            Ok(PostedReceipt { id, status })
        })
        .collect()
}

fn scalar(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The state a status word stands for under the destination's `receipt-status` table
/// (compared ignoring ASCII case). `None`: a word the table does not list — the
/// endpoint answers 400 naming it rather than recording a guess.
pub fn map_status<S: Copy>(table: &[(String, S)], word: &str) -> Option<S> {
    table
        .iter()
        .find(|(w, _)| w.eq_ignore_ascii_case(word))
        .map(|(_, s)| *s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2.
        assert_eq!(
            to_hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block.
        assert_eq!(
            hmac_sha256(&[0xaa; 131], b"Test Using Larger Than Block-Size Key - Hash Key First").to_vec(),
            hex("60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54")
        );
    }

    #[test]
    fn signatures_and_tokens_are_checked() {
        let body = br#"{"id":"p1","status":"delivered"}"#;
        let good = format!("sha256={}", to_hex(&hmac_sha256(b"s3cret", body)));
        assert!(authentic(Signature::HmacSha256, b"s3cret", Some(good.as_bytes()), body));
        assert!(authentic(
            Signature::HmacSha256,
            b"s3cret",
            Some(good.to_uppercase().replace("SHA256=", "sha256=").as_bytes()),
            body
        ));
        assert!(!authentic(
            Signature::HmacSha256,
            b"s3cret",
            Some(good.as_bytes()),
            b"{}"
        ));
        assert!(!authentic(Signature::HmacSha256, b"other", Some(good.as_bytes()), body));
        assert!(!authentic(Signature::HmacSha256, b"s3cret", None, body));
        assert!(authentic(Signature::Token, b"s3cret", Some(b"s3cret"), body));
        assert!(!authentic(Signature::Token, b"s3cret", Some(b"s3cre"), body));
        assert!(!authentic(Signature::Token, b"", Some(b""), body));
    }

    #[test]
    fn receipt_bodies_are_read_with_pointers() {
        let one = parse_receipts(br#"{"msg":{"id":12},"state":"delivered"}"#, "/msg/id", "/state").unwrap();
        assert_eq!(
            one,
            vec![PostedReceipt {
                id: "12".into(),
                status: "delivered".into()
            }]
        );
        let many = parse_receipts(br#"[{"id":"a","s":"x"},{"id":"b","s":"y"}]"#, "/id", "/s").unwrap();
        assert_eq!(many.len(), 2);
        assert_eq!(parse_receipts(b"nope", "/id", "/s"), Err(ReceiptBodyError::NotJson));
        assert_eq!(
            parse_receipts(br#"[{"id":"a","s":"x"},{"s":"y"}]"#, "/id", "/s"),
            Err(ReceiptBodyError::NoId { index: 1 })
        );
        assert_eq!(
            parse_receipts(br#"{"id":"a"}"#, "/id", "/s"),
            Err(ReceiptBodyError::NoStatus { index: 0 })
        );
    }

    #[test]
    fn status_words_map_ignoring_case() {
        let table = vec![("delivered".to_owned(), 1u8), ("failed".to_owned(), 2u8)];
        assert_eq!(map_status(&table, "DELIVERED"), Some(1));
        assert_eq!(map_status(&table, "failed"), Some(2));
        assert_eq!(map_status(&table, "queued"), None);
    }
}
