//! Kannel's `/cgi-bin/sendsms` parameters: `sendium_protocols::kannel::Params::parse`
//! (the query string of a GET or a form body, percent-decoded) and
//! `kannel::sendsms::parse` (the checks Kannel's smsbox makes, the `charset` and
//! `coding` conversions, the `udh` parameter).
//!
//! Input: the raw query string.
//!
//! Checked: nothing panics; the pairs survive being percent-encoded and read again; a
//! refused request is a 400 with one of Kannel's texts; an accepted one satisfies every
//! rule `parse` documents (receivers are numbers, each once; a sender; a payload within
//! the text limit in the alphabet its data_coding names; the dlr-mask and dlr-url
//! limits); and the same bytes give the same answer.
#![no_main]
#![forbid(unsafe_code)]

use libfuzzer_sys::fuzz_target;
use sendium_protocols::http::{MAX_TEXT_CHARS, MAX_URL};
use sendium_protocols::kannel::{Params, sendsms};

/// The pairs of `params` written again, every byte percent-encoded.
fn encoded(pairs: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, (name, value)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push(b'&');
        }
        for b in name {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
        out.push(b'=');
        for b in value {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let params = Params::parse(data);
    let pairs = params.pairs();
    assert_eq!(
        Params::parse(&encoded(pairs)).pairs(),
        pairs,
        "percent-encoding round trip"
    );

    let answer = sendsms::parse(&params);
    assert_eq!(answer, sendsms::parse(&Params::parse(data)), "same bytes, same answer");
    let s = match answer {
        Ok(s) => s,
        Err(refused) => {
            assert_eq!(refused.status, 400, "{refused:?}");
            assert!(
                refused.text.ends_with("rejected") || refused.text.ends_with("lists."),
                "{refused:?}"
            );
            return;
        }
    };

    assert!(!s.to.is_empty());
    for (i, r) in s.to.iter().enumerate() {
        let digits = r.strip_prefix('+').unwrap_or(r);
        assert!(
            !digits.is_empty() && digits.len() <= 20 && digits.bytes().all(|b| b.is_ascii_digit()),
            "receiver {r:?}"
        );
        assert!(!s.to[..i].contains(r), "receiver {r:?} twice");
    }
    assert!(!s.from.is_empty() && s.from.trim() == s.from, "from {:?}", s.from);
    assert!(!s.payload.is_empty());
    assert!(s.dlr_mask <= 63);
    if let Some(url) = &s.dlr_url {
        let lower = url.to_ascii_lowercase();
        assert!(
            lower.starts_with("http://") || lower.starts_with("https://"),
            "dlr-url {url:?}"
        );
        assert!(url.len() <= MAX_URL);
    }
    assert!(s.smsc.as_ref().is_none_or(|d| !d.is_empty()));

    // The data_coding: an alphabet (GSM 7-bit 0x00, 8-bit 0x04, UCS2 0x08) or, with a
    // message class, the general data coding group 0x10-0x1B.
    let ucs2 = match s.data_coding {
        0x00 | 0x04 => false,
        0x08 => true,
        dc @ 0x10..=0x1B => dc & 0x0C == 0x08,
        dc => panic!("data_coding {dc:#04x}"),
    };
    let chars = if ucs2 {
        assert_eq!(s.payload.len() % 2, 0, "UCS2 payload of odd length");
        s.payload.len() / 2
    } else {
        s.payload.len()
    };
    assert!(chars <= MAX_TEXT_CHARS, "{chars} characters");
    if let Some(c) = s.concat {
        assert!(c.seq >= 1 && c.seq <= c.total, "{c:?}");
    }
});
