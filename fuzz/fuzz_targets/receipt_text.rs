//! Receipt-text parsing, receipt dates and provider-id normalisation
//! (`sendium_protocols::receipt`: `mod.rs`, `id.rs`, `date.rs`).
//!
//! Input: a flags byte, eight bytes of a number, then the text (read as
//! `String::from_utf8_lossy`, as the destination worker reads a receipt's octets).
//!
//! Checked: nothing panics; the reader of Appendix B's own layout and the reader of any
//! layout give the same result; a parsed receipt formats to text that parses back to the
//! same receipt; a parsed date formats back to its first ten digits, and every date of
//! 2000-2099 survives format-then-parse to the minute; the same number written as a
//! `submit_sm_resp` id in one base and as a receipt id in the other (padded with zeros,
//! NULs, blanks, in either letter case) gives matching keys under `Hex`, `Dec` and `Auto`;
//! the TLV id is keyed like a resp id.
#![no_main]
#![forbid(unsafe_code)]

use libfuzzer_sys::fuzz_target;
use sendium_fuzz::Input;
use sendium_protocols::receipt::{
    IdFormat, ReceiptFields, ReceiptState, ReceiptText, format_date, parse_date, receipt_keys, resp_key, text_excerpt,
};

/// 2000-01-01 and 2100-01-01 00:00 UTC: the years receipt dates can name.
const YEAR_2000: i64 = 946_684_800;
const YEAR_2100: i64 = 4_102_444_800;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let flags = input.byte();
    let number = input.u64();
    let text = String::from_utf8_lossy(input.rest());

    receipt(&text);
    dates(&text, number);
    ids(&text, number, flags);
    let _ = ReceiptState::from_stat_text(&text);
    assert!(text_excerpt(&text).chars().count() <= 20);
});

fn receipt(text: &str) {
    assert_eq!(
        ReceiptFields::parse(text),
        ReceiptFields::parse_any_layout(text),
        "the two readers differ on {text:?}"
    );
    let Ok(parsed) = ReceiptText::parse(text) else {
        return;
    };
    assert!(!parsed.id.is_empty());
    assert_ne!(parsed.submit_date.as_deref(), Some(""));
    assert_ne!(parsed.done_date.as_deref(), Some(""));
    let formatted = parsed.format();
    assert_eq!(
        ReceiptText::parse(&formatted).as_ref(),
        Ok(&parsed),
        "a parsed receipt does not survive format-then-parse: {formatted:?}"
    );
    for date in [&parsed.submit_date, &parsed.done_date].into_iter().flatten() {
        let _ = parse_date(date);
    }
}

fn dates(text: &str, number: u64) {
    if let Some(secs) = parse_date(text) {
        let trimmed = text.trim();
        assert_eq!(format_date(secs), trimmed[..10], "{trimmed:?}");
        assert!((YEAR_2000..YEAR_2100).contains(&secs));
    }
    let secs = i64::from_be_bytes(number.to_be_bytes());
    let formatted = format_date(secs);
    assert_eq!(formatted.len(), 10);
    assert!(formatted.bytes().all(|b| b.is_ascii_digit()), "{formatted:?}");
    let in_range = YEAR_2000 + secs.rem_euclid(YEAR_2100 - YEAR_2000);
    assert_eq!(parse_date(&format_date(in_range)), Some(in_range - in_range % 60));
}

fn ids(text: &str, number: u64, flags: u8) {
    // Arbitrary ids never panic, and a TLV id is keyed like a resp id.
    for fmt in [IdFormat::Auto, IdFormat::Hex, IdFormat::Dec, IdFormat::Exact] {
        let keys = receipt_keys(fmt, text, false);
        assert!(!keys.is_empty());
        assert_eq!(receipt_keys(fmt, text, true), vec![resp_key(fmt, text)]);
    }
    assert_eq!(resp_key(IdFormat::Exact, text), text);

    // One number, hex on one side and decimal on the other, dressed up by `flags`.
    let value = u128::from(number) * u128::from(flags >> 4);
    let dress = |s: String| {
        let mut s = if flags & 0x01 != 0 { format!("000{s}") } else { s };
        if flags & 0x02 != 0 {
            s.push_str("\0\0");
        }
        if flags & 0x04 != 0 {
            s = format!(" {s} ");
        }
        s
    };
    let hex = dress(if flags & 0x08 != 0 {
        format!("{value:X}")
    } else {
        format!("{value:x}")
    });
    let dec = dress(value.to_string());
    for (fmt, resp, receipt) in [
        (IdFormat::Hex, &hex, &dec),
        (IdFormat::Dec, &dec, &hex),
        (IdFormat::Auto, &hex, &dec),
        (IdFormat::Auto, &dec, &hex),
    ] {
        let key = resp_key(fmt, resp);
        let keys = receipt_keys(fmt, receipt, false);
        assert!(
            keys.contains(&key),
            "{fmt:?}: resp {resp:?} -> {key:?} not in {keys:?} for receipt {receipt:?}"
        );
    }
}
