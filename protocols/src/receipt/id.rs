//! Normalising provider message ids so a delivery receipt finds the message it reports on.
//!
//! The id a provider returns in `submit_sm_resp` and the id it writes in the receipt text
//! are often *not* the same string: many SMSCs return the id in hexadecimal and print the
//! same number in decimal in `id:…` (or the reverse), pad with zeros, or change letter
//! case. Unmatched receipts are the most common complaint about SMS gateways, so each
//! destination declares how its ids relate ([`IdFormat`], config key `id-format`), and both
//! sides are reduced to one canonical key:
//!
//! - at submit time, [`resp_key`] turns the `submit_sm_resp` id into the key stored with
//!   the correlation;
//! - at receipt time, [`receipt_keys`] gives the candidate keys to look up, best first.
//!
//! Keys are only comparable within one destination and one `IdFormat`: store them scoped
//! by destination, and expect correlations written under another `id-format` not to match
//! after the setting changes.

use std::borrow::Cow;

/// How a destination's receipt ids relate to its `submit_sm_resp` ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum IdFormat {
    /// Try the same representation first, then decimal-receipt-for-hex-id and
    /// hex-receipt-for-decimal-id. Matches every provider that is consistent in *some*
    /// way, at the price of a (small) chance of a wrong match when one provider's ids
    /// collide across bases; pick an explicit format when it is known.
    #[default]
    Auto,
    /// submit_sm_resp ids are hexadecimal; the receipt text writes the same number in
    /// decimal.
    Hex,
    /// submit_sm_resp ids are decimal; the receipt text writes the same number in
    /// hexadecimal.
    Dec,
    /// Ids are compared byte for byte, with no normalisation at all.
    Exact,
}

/// The id without NUL padding and surrounding whitespace.
fn clean(id: &str) -> Cow<'_, str> {
    if id.contains('\0') {
        Cow::Owned(id.replace('\0', "").trim().to_owned())
    } else {
        Cow::Borrowed(id.trim())
    }
}

// Ids are numbers of up to 64 bits almost always: each number is read and written as a
// u64 when it fits, which takes a fraction of u128's arithmetic, and as a u128 otherwise.

fn parse_dec(id: &str) -> Option<u128> {
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match id.parse::<u64>() {
        Ok(value) => Some(u128::from(value)),
        Err(_) => id.parse().ok(),
    }
}

fn parse_hex(id: &str) -> Option<u128> {
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    match u64::from_str_radix(id, 16) {
        Ok(value) => Some(u128::from(value)),
        Err(_) => u128::from_str_radix(id, 16).ok(),
    }
}

/// `value` in decimal.
fn decimal(value: u128) -> String {
    digits::<10>(value)
}

/// `value` in lower-case hexadecimal.
fn hexadecimal(value: u128) -> String {
    digits::<16>(value)
}

/// `value`'s digits in `RADIX` (10 or 16), lower case, written without the formatting
/// machinery: a receipt under `Auto` needs two such numbers. Digits are taken in u128
/// arithmetic only while the rest exceeds u64, whose division costs a fraction of u128's.
fn digits<const RADIX: u8>(value: u128) -> String {
    // u128::MAX has 39 decimal digits.
    let mut buf = [0u8; 40];
    let mut at = buf.len();
    let mut push = |digit: u8| {
        at -= 1;
        buf[at] = if digit < 10 { b'0' + digit } else { b'a' + digit - 10 };
    };
    let mut wide = value;
    let mut narrow = loop {
        match u64::try_from(wide) {
            Ok(narrow) => break narrow,
            Err(_) => {
                push((wide % u128::from(RADIX)) as u8);
                wide /= u128::from(RADIX);
            }
        }
    };
    loop {
        push((narrow % u64::from(RADIX)) as u8);
        narrow /= u64::from(RADIX);
        if narrow == 0 {
            break;
        }
    }
    // ASCII digits: always UTF-8.
    std::str::from_utf8(&buf[at..]).map(str::to_owned).unwrap_or_default()
}

/// The representation-preserving canonical form used by `Auto`: a string of hex digits is
/// lower-cased and stripped of leading zeros (which changes its value in neither base),
/// anything else is kept as is.
fn canonical(id: &str) -> String {
    canonical_of_clean(&clean(id))
}

/// [`canonical`] of an id already [`clean`].
fn canonical_of_clean(id: &str) -> String {
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return id.to_owned();
    }
    let trimmed = id.trim_start_matches('0');
    if trimmed.is_empty() {
        "0".to_owned()
    } else {
        trimmed.to_ascii_lowercase()
    }
}

/// A numeric id keyed by its value (decimal digits of the value); a non-numeric id, or one
/// beyond u128, keyed by its cleaned text.
fn value_key(id: &str, parse: fn(&str) -> Option<u128>) -> String {
    let id = clean(id);
    match parse(&id) {
        Some(value) => decimal(value),
        None => id.into_owned(),
    }
}

/// The key to store for a `submit_sm_resp` message id.
///
/// - `Exact`: the id unchanged.
/// - `Hex`: the value of the hexadecimal id (so `"001A2B3C"` and `"1a2b3c"` are one key).
/// - `Dec`: the value of the decimal id (leading zeros do not matter).
/// - `Auto`: the id trimmed, NUL-stripped, and — if it is all hex digits — lower-cased
///   without leading zeros.
///
/// Under `Hex`/`Dec` an id that is not a number in the declared base (or exceeds u128)
/// falls back to its trimmed text, matched exactly.
pub fn resp_key(fmt: IdFormat, resp_id: &str) -> String {
    match fmt {
        IdFormat::Exact => resp_id.to_owned(),
        IdFormat::Hex => value_key(resp_id, parse_hex),
        IdFormat::Dec => value_key(resp_id, parse_dec),
        IdFormat::Auto => canonical(resp_id),
    }
}

/// The keys under which the message a receipt reports on may be stored, best first.
///
/// `from_tlv` says the id came from the `receipted_message_id` TLV rather than the `id:`
/// of the receipt text. SMPP defines that TLV as the id *the SMSC returned in
/// submit_sm_resp*, so it is in the resp format and only canonicalised like a resp id;
/// the base conversion applies to the receipt text only.
pub fn receipt_keys(fmt: IdFormat, receipt_id: &str, from_tlv: bool) -> Vec<String> {
    let mut keys = Vec::with_capacity(3);
    add_receipt_keys(fmt, receipt_id, from_tlv, &mut keys);
    keys
}

/// Appends [`receipt_keys`] to `keys`, best first, leaving out those `keys` already has: a
/// receipt with both the TLV and the text id gathers the keys of both in one vector.
pub fn add_receipt_keys(fmt: IdFormat, receipt_id: &str, from_tlv: bool, keys: &mut Vec<String>) {
    let mut add = |key: String| {
        if !keys.contains(&key) {
            keys.push(key);
        }
    };
    if from_tlv {
        return add(resp_key(fmt, receipt_id));
    }
    match fmt {
        IdFormat::Exact => add(receipt_id.to_owned()),
        // Receipt text is decimal (resp was hex); the key is the value either way.
        IdFormat::Hex => add(value_key(receipt_id, parse_dec)),
        // Receipt text is hexadecimal (resp was decimal).
        IdFormat::Dec => add(value_key(receipt_id, parse_hex)),
        IdFormat::Auto => {
            let cleaned = clean(receipt_id);
            add(canonical_of_clean(&cleaned));
            // A decimal receipt for a provider whose resp ids are hex: the resp key is the
            // same number written in lower-case hex.
            if let Some(value) = parse_dec(&cleaned) {
                add(hexadecimal(value));
            }
            // A hex receipt for a provider whose resp ids are decimal.
            if let Some(value) = parse_hex(&cleaned) {
                add(decimal(value));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(fmt: IdFormat, resp: &str, receipt: &str, from_tlv: bool) -> bool {
        receipt_keys(fmt, receipt, from_tlv).contains(&resp_key(fmt, resp))
    }

    #[test]
    fn hex_resp_matched_by_decimal_receipt() {
        assert_eq!(0x1A2B3C, 1_715_004);
        for fmt in [IdFormat::Hex, IdFormat::Auto] {
            assert!(matches(fmt, "1A2B3C", "1715004", false), "{fmt:?}");
            assert!(matches(fmt, "1a2b3c", "1715004", false), "{fmt:?}");
            assert!(matches(fmt, "001A2B3C", "0001715004", false), "{fmt:?}");
            // The TLV carries the resp format: hex, in either case.
            assert!(matches(fmt, "1A2B3C", "1a2b3c", true), "{fmt:?}");
            assert!(matches(fmt, "1A2B3C", "001A2B3C\0", true), "{fmt:?}");
        }
        assert!(!matches(IdFormat::Exact, "1A2B3C", "1715004", false));
        assert!(!matches(IdFormat::Dec, "1A2B3C", "1715004", false));
        // Under Hex the TLV is not base-converted.
        assert!(!matches(IdFormat::Hex, "1A2B3C", "1715004", true));
    }

    #[test]
    fn decimal_resp_matched_by_hex_receipt() {
        for fmt in [IdFormat::Dec, IdFormat::Auto] {
            assert!(matches(fmt, "1715004", "1a2b3c", false), "{fmt:?}");
            assert!(matches(fmt, "1715004", "1A2B3C", false), "{fmt:?}");
            assert!(matches(fmt, "01715004", "001A2B3C", false), "{fmt:?}");
            assert!(matches(fmt, "1715004", "001715004", true), "{fmt:?}");
        }
        assert!(!matches(IdFormat::Hex, "1715004", "1a2b3c", false));
    }

    #[test]
    fn same_representation_matches_first_under_auto() {
        let keys = receipt_keys(IdFormat::Auto, "1715004", false);
        assert_eq!(keys, vec!["1715004", "1a2b3c", "24203268"]);
        assert!(matches(IdFormat::Auto, "1715004", "1715004", false));
        assert!(matches(IdFormat::Auto, "ABCDEF", "abcdef", false));
        assert!(matches(IdFormat::Auto, "000", "0", false));
        // Duplicates are dropped: "0" is 0 in both bases.
        assert_eq!(receipt_keys(IdFormat::Auto, "0", false), vec!["0"]);
    }

    #[test]
    fn exact_is_byte_for_byte() {
        assert!(matches(IdFormat::Exact, "Ab-12", "Ab-12", false));
        assert!(!matches(IdFormat::Exact, "Ab-12", "ab-12", false));
        assert!(!matches(IdFormat::Exact, "0012", "12", false));
        assert!(!matches(IdFormat::Exact, "12", "12 ", true));
        assert_eq!(resp_key(IdFormat::Exact, " x\0"), " x\0");
    }

    #[test]
    fn non_numeric_ids_fall_back_to_exact() {
        let uuid = "0190c3e2-7a4b-7cc0-9d1e-3f2a1b0c9d8e";
        for fmt in [IdFormat::Auto, IdFormat::Hex, IdFormat::Dec] {
            assert_eq!(resp_key(fmt, uuid), uuid, "{fmt:?}");
            assert!(matches(fmt, uuid, uuid, false), "{fmt:?}");
            assert!(matches(fmt, uuid, &format!(" {uuid}\0"), false), "{fmt:?}");
            assert!(matches(fmt, uuid, uuid, true), "{fmt:?}");
            assert!(!matches(fmt, uuid, "0190c3e2", false), "{fmt:?}");
        }
        // Under Hex a decimal-looking resp is still hex; under Dec a hex resp is text.
        assert_eq!(resp_key(IdFormat::Hex, "10"), "16");
        assert_eq!(resp_key(IdFormat::Dec, "1a"), "1a");
        assert_eq!(receipt_keys(IdFormat::Hex, "abc", false), vec!["abc"]);
    }

    #[test]
    fn ids_beyond_64_bits_match_across_bases_as_smaller_ones_do() {
        // 2^80 and u64::MAX + 1, hex in the resp, decimal in the receipt and the reverse.
        for (hex, dec) in [
            ("100000000000000000000", "1208925819614629174706176"),
            ("10000000000000000", "18446744073709551616"),
            ("FFFFFFFFFFFFFFFF", "18446744073709551615"),
        ] {
            for fmt in [IdFormat::Hex, IdFormat::Auto] {
                assert!(matches(fmt, hex, dec, false), "{fmt:?} {hex}");
            }
            for fmt in [IdFormat::Dec, IdFormat::Auto] {
                assert!(matches(fmt, dec, hex, false), "{fmt:?} {dec}");
            }
            assert_eq!(resp_key(IdFormat::Hex, hex), dec);
        }
        // Beyond u128: the text, matched exactly.
        let huge = "1".repeat(40);
        assert_eq!(resp_key(IdFormat::Dec, &huge), huge);
    }

    #[test]
    fn leading_zeros_and_padding() {
        assert_eq!(resp_key(IdFormat::Dec, "  000123\0\0"), "123");
        assert_eq!(resp_key(IdFormat::Hex, "000ff"), "255");
        assert_eq!(resp_key(IdFormat::Auto, "000FF"), "ff");
        assert_eq!(resp_key(IdFormat::Auto, "0000"), "0");
        assert_eq!(resp_key(IdFormat::Auto, ""), "");
    }

    #[test]
    fn digits_are_what_the_formatter_writes() {
        let mut value: u128 = 1;
        let mut values = vec![
            0,
            9,
            10,
            15,
            16,
            u128::from(u64::MAX),
            u128::from(u64::MAX) + 1,
            u128::MAX,
        ];
        while let Some(next) = value.checked_mul(7) {
            values.extend([value - 1, value]);
            value = next;
        }
        for value in values {
            assert_eq!(decimal(value), format!("{value}"));
            assert_eq!(hexadecimal(value), format!("{value:x}"));
        }
    }

    #[test]
    fn added_keys_are_the_receipt_keys_not_yet_gathered() {
        for fmt in [IdFormat::Auto, IdFormat::Hex, IdFormat::Dec, IdFormat::Exact] {
            let mut keys = receipt_keys(fmt, "00FF", true);
            add_receipt_keys(fmt, "255", false, &mut keys);
            let mut expected = receipt_keys(fmt, "00FF", true);
            for key in receipt_keys(fmt, "255", false) {
                if !expected.contains(&key) {
                    expected.push(key);
                }
            }
            assert_eq!(keys, expected, "{fmt:?}");
        }
        // Under Auto: the TLV's key, then the text id's other readings, none twice.
        let mut keys = receipt_keys(IdFormat::Auto, "255", true);
        add_receipt_keys(IdFormat::Auto, "255", false, &mut keys);
        assert_eq!(keys, ["255", "ff", "597"]);
    }

    #[test]
    fn ids_up_to_u128() {
        let max_hex = "ffffffffffffffffffffffffffffffff";
        let max_dec = u128::MAX.to_string();
        assert!(matches(IdFormat::Hex, max_hex, &max_dec, false));
        assert!(matches(IdFormat::Auto, max_hex, &max_dec, false));
        assert!(matches(IdFormat::Dec, &max_dec, max_hex, false));
        // One digit more overflows: fall back to the text, without panicking.
        let too_long = format!("1{max_hex}");
        assert_eq!(resp_key(IdFormat::Hex, &too_long), too_long);
        assert_eq!(receipt_keys(IdFormat::Auto, &format!("9{max_dec}"), false).len(), 1);
    }
}
