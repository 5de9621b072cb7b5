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

/// One receipt read from a posted body: the provider's message id, its status word and,
/// where the provider gives one, its error code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PostedReceipt {
    pub id: String,
    pub status: String,
    pub error: Option<String>,
}

/// Where a posted body holds each receipt's values (RFC 6901 pointers).
#[derive(Clone, Copy, Debug)]
pub struct ReceiptPointers<'a> {
    pub id: &'a str,
    pub status: &'a str,
    pub error: Option<&'a str>,
}

/// Longest provider error code kept; a longer one (or one with other characters than
/// letters, digits, `-` and `_`, which would break the receipt text ESMEs parse) is
/// replaced by the default code.
pub const MAX_ERROR_CODE: usize = 16;

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
pub fn parse_receipts(body: &[u8], at: ReceiptPointers<'_>) -> Result<Vec<PostedReceipt>, ReceiptBodyError> {
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|_| ReceiptBodyError::NotJson)?;
    let items = match v {
        serde_json::Value::Array(items) => items,
        one => vec![one],
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let id = scalar(item.pointer(at.id)).ok_or(ReceiptBodyError::NoId { index })?;
            let status = scalar(item.pointer(at.status)).ok_or(ReceiptBodyError::NoStatus { index })?;
            let error = at.error.and_then(|p| error_code(item.pointer(p)));
            Ok(PostedReceipt { id, status, error })
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

/// A provider's error code as a receipt's `err`: numbers of fewer than three digits are
/// zero-padded (`7` → `007`, as SMPP receipts write it); `None` for a missing, empty or
/// unusable value (see [`MAX_ERROR_CODE`]).
fn error_code(v: Option<&serde_json::Value>) -> Option<String> {
    let code = scalar(v)?;
    let usable = code.len() <= MAX_ERROR_CODE && code.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
    if !usable {
        return None;
    }
    Some(if code.len() < 3 && code.bytes().all(|b| b.is_ascii_digit()) {
        format!("{code:0>3}")
    } else {
        code
    })
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

    const AT: ReceiptPointers<'static> = ReceiptPointers {
        id: "/id",
        status: "/s",
        error: None,
    };

    #[test]
    fn receipt_bodies_are_read_with_pointers() {
        let nested = ReceiptPointers {
            id: "/msg/id",
            status: "/state",
            error: None,
        };
        let one = parse_receipts(br#"{"msg":{"id":12},"state":"delivered"}"#, nested).unwrap();
        assert_eq!(
            one,
            vec![PostedReceipt {
                id: "12".into(),
                status: "delivered".into(),
                error: None,
            }]
        );
        let many = parse_receipts(br#"[{"id":"a","s":"x"},{"id":"b","s":"y"}]"#, AT).unwrap();
        assert_eq!(many.len(), 2);
        assert_eq!(parse_receipts(b"nope", AT), Err(ReceiptBodyError::NotJson));
        assert_eq!(
            parse_receipts(br#"[{"id":"a","s":"x"},{"s":"y"}]"#, AT),
            Err(ReceiptBodyError::NoId { index: 1 })
        );
        assert_eq!(
            parse_receipts(br#"{"id":"a"}"#, AT),
            Err(ReceiptBodyError::NoStatus { index: 0 })
        );
    }

    #[test]
    fn error_codes_are_kept_when_usable() {
        let at = ReceiptPointers {
            error: Some("/e"),
            ..AT
        };
        let errors = |body: &str| -> Vec<Option<String>> {
            parse_receipts(body.as_bytes(), at)
                .unwrap()
                .into_iter()
                .map(|r| r.error)
                .collect()
        };
        assert_eq!(
            errors(r#"[{"id":"a","s":"x","e":7},{"id":"b","s":"x","e":"30003"},{"id":"c","s":"x","e":"E_12"}]"#),
            vec![Some("007".into()), Some("30003".into()), Some("E_12".into())]
        );
        assert_eq!(
            errors(
                r#"[{"id":"a","s":"x"},{"id":"b","s":"x","e":""},{"id":"c","s":"x","e":"no good"},
                   {"id":"d","s":"x","e":"12345678901234567"},{"id":"e","s":"x","e":{"code":1}}]"#
            ),
            vec![None; 5],
            "missing, empty, spaced, overlong or structured codes fall back to the default"
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
