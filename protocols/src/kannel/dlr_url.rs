//! A Kannel `dlr-url` filled in for one delivery report: each `%` escape code replaced by
//! its URL-encoded value, as Kannel's `urltrans_fill_escape_codes` does for a report.
//!
//! In a report the handset is the sender, so `%p` is the original message's receiver
//! and `%P` its sender (Kannel keeps them so, and its user guide's "sender"/"receiver"
//! mean the report's). `%q`/`%Q` are `%p`/`%P` with a leading `00` written as `+`.
//! A code this gateway has no value for gives the empty string, as Kannel does for a
//! value it lacks; a code Kannel does not know stays as written.

/// Kannel's report types (`%d`, and the bits of `dlr-mask`).
pub mod kind {
    /// Delivered to the handset.
    pub const DELIVERED: u8 = 1;
    /// Not delivered: a final failure.
    pub const UNDELIVERED: u8 = 2;
    /// Buffered at the SMSC: an intermediate report.
    pub const BUFFERED: u8 = 4;
    /// The SMSC accepted the message (submit_sm_resp OK).
    pub const SMSC_SUCCESS: u8 = 8;
    /// The SMSC refused the message (submit_sm_resp error).
    pub const SMSC_REJECT: u8 = 16;
}

/// What one report says, for the escape codes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report<'a> {
    /// `%d`: one of [`kind`].
    pub kind: u8,
    /// `%A`, `%b` and the word codes `%a %k %s %S %r`: the report's text.
    pub text: &'a str,
    /// `%T` (and `%t`): when the report was made, Unix seconds.
    pub time: u64,
    /// `%P`/`%Q`: the original message's sender.
    pub sender: &'a str,
    /// `%p`/`%q`: the original message's receiver.
    pub receiver: &'a str,
    /// `%i`: the SMSC (destination) the message went to, when known.
    pub smsc_id: &'a str,
    /// `%I`: the message id the application was given.
    pub message_id: &'a str,
    /// `%F`: the provider's message id, when known.
    pub foreign_id: &'a str,
    /// `%n`: the service (Sendium: the account).
    pub service: &'a str,
    /// `%o`: the account.
    pub account: &'a str,
    /// `%R`: the dlr-url itself.
    pub dlr_url: &'a str,
}

/// URL-encoding as Kannel's `octstr_url_encode`: letters, digits and `-_.!~*'()` stay,
/// a space becomes `+`, every other byte `%XX`.
pub fn url_encode(s: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for b in s.bytes() {
        match b {
            b' ' => out.push('+'),
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'!' | b'~' | b'*' | b'\'' | b'(' | b')' => {
                out.push(char::from(b));
            }
            _ => {
                out.push('%');
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 0x0F)]));
            }
        }
    }
}

/// `%q`/`%Q`: a number with a leading `00` as an (encoded) `+`.
fn plus_form(number: &str, out: &mut String) {
    match number.strip_prefix("00") {
        Some(rest) => {
            out.push_str("%2B");
            url_encode(rest, out);
        }
        None => url_encode(number, out),
    }
}

/// `YYYY-MM-DD+HH:MM:SS` (UTC) of Unix seconds, as Kannel's `%t`.
fn kannel_time(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}+{:02}:{:02}:{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The URL to call for `report`: `pattern` with its escape codes filled in.
pub fn fill(pattern: &str, report: &Report<'_>) -> String {
    let words: Vec<&str> = report.text.split_whitespace().collect();
    let mut next_word = 1;
    let mut out = String::with_capacity(pattern.len() + 64);
    let mut rest = pattern;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let Some(code) = after.chars().next() else {
            // A `%` at the very end stays.
            out.push('%');
            rest = after;
            break;
        };
        rest = &after[code.len_utf8()..];
        match code {
            'a' => url_encode(&words.join(" "), &mut out),
            'A' | 'b' => url_encode(report.text, &mut out),
            'c' => out.push('0'),
            'C' => out.push_str("UTF-8"),
            'd' => out.push_str(&report.kind.to_string()),
            'F' => url_encode(report.foreign_id, &mut out),
            'i' => url_encode(report.smsc_id, &mut out),
            'I' => out.push_str(report.message_id),
            'k' => url_encode(words.first().copied().unwrap_or_default(), &mut out),
            // Message class and waiting indicator are undefined in a report.
            'm' | 'M' => out.push_str("-1"),
            'n' => url_encode(report.service, &mut out),
            'o' => url_encode(report.account, &mut out),
            'p' => url_encode(report.receiver, &mut out),
            'P' => url_encode(report.sender, &mut out),
            'q' => plus_form(report.receiver, &mut out),
            'Q' => plus_form(report.sender, &mut out),
            'r' => {
                let tail = words.get(next_word..).unwrap_or_default();
                url_encode(&tail.join(" "), &mut out);
            }
            'R' => url_encode(report.dlr_url, &mut out),
            's' | 'S' => {
                if let Some(w) = words.get(next_word) {
                    if code == 's' {
                        url_encode(w, &mut out);
                    } else {
                        // Kannel's %S: unencoded, `*` as `~`.
                        out.push_str(&w.replace('*', "~"));
                    }
                    next_word += 1;
                }
            }
            't' => out.push_str(&kannel_time(report.time)),
            'T' => out.push_str(&report.time.to_string()),
            // Values Sendium does not keep with a message: billing info, meta-data,
            // SMSC number, UDH, validity, deferral.
            'B' | 'D' | 'f' | 'u' | 'v' | 'V' => {}
            // `%#group#param#`: a meta-data value; none are kept, so nothing.
            '#' => match rest.split_once('#').and_then(|(_, r)| r.split_once('#')) {
                Some((_, after_param)) => rest = after_param,
                None => out.push_str("%#"),
            },
            '%' => out.push('%'),
            other => {
                out.push('%');
                out.push(other);
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report<'static> {
        Report {
            kind: kind::DELIVERED,
            text: "id:0190 sub:001 dlvrd:001 stat:DELIVRD err:000",
            time: 1_700_000_000,
            sender: "Shop & Co",
            receiver: "00447700900123",
            smsc_id: "upstream-a",
            message_id: "0190a1b2-0000-7000-8000-000000000001",
            foreign_id: "abc/1",
            service: "esme1",
            account: "esme1",
            dlr_url: "http://h/d?x=%d",
        }
    }

    #[test]
    fn every_code_kannel_documents_for_a_report() {
        let r = report();
        let cases = [
            ("%d", "1"),
            ("%A", "id%3A0190+sub%3A001+dlvrd%3A001+stat%3ADELIVRD+err%3A000"),
            ("%T", "1700000000"),
            ("%t", "2023-11-14+22:13:20"),
            ("%p", "00447700900123"),
            ("%P", "Shop+%26+Co"),
            ("%q", "%2B447700900123"),
            ("%Q", "Shop+%26+Co"),
            ("%i", "upstream-a"),
            ("%I", "0190a1b2-0000-7000-8000-000000000001"),
            ("%F", "abc%2F1"),
            ("%k", "id%3A0190"),
            ("%s|%s|%S", "sub%3A001|dlvrd%3A001|stat:DELIVRD"),
            ("%r", "sub%3A001+dlvrd%3A001+stat%3ADELIVRD+err%3A000"),
            ("%n/%o", "esme1/esme1"),
            ("%c %m %M", "0 -1 -1"),
            ("%R", "http%3A%2F%2Fh%2Fd%3Fx%3D%25d"),
            ("%B%D%f%u%v%V", ""),
            ("a%#smpp#x#b", "ab"),
            ("100%% %Z %", "100% %Z %"),
        ];
        for (pattern, expected) in cases {
            assert_eq!(fill(pattern, &r), expected, "{pattern}");
        }
    }

    #[test]
    fn a_typical_dlr_url() {
        let mut r = report();
        r.kind = kind::SMSC_REJECT;
        r.text = "NACK/0x00000045/Rejected";
        r.receiver = "+447700900123";
        assert_eq!(
            fill("https://app.example/dlr?type=%d&to=%p&st=%A&ts=%T&id=%I", &r),
            "https://app.example/dlr?type=16&to=%2B447700900123&st=NACK%2F0x00000045%2FRejected\
             &ts=1700000000&id=0190a1b2-0000-7000-8000-000000000001"
        );
    }

    #[test]
    fn dates_before_and_after_leap_days() {
        assert_eq!(kannel_time(0), "1970-01-01+00:00:00");
        assert_eq!(kannel_time(951_782_400), "2000-02-29+00:00:00");
        assert_eq!(kannel_time(4_107_542_399), "2100-02-28+23:59:59");
    }
}
