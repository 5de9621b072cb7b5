//! Delivery receipts: the SMPP 3.4 Appendix B receipt text, the message states, and (in
//! [`id`]) matching a receipt's id to the `submit_sm_resp` id it reports on.
//!
//! Upstream receipts are *parsed* leniently — every SMSC formats the text a little
//! differently — and downstream receipts are *formatted* exactly as Appendix B shows, since
//! ESMEs tend to parse them with fixed patterns.

mod date;
pub mod id;

pub use date::{format_date, parse_date};
pub use id::{IdFormat, add_receipt_keys, receipt_keys, resp_key};

/// The state of a submitted message, as a receipt reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReceiptState {
    Enroute,
    Delivered,
    Expired,
    Deleted,
    Undeliverable,
    Accepted,
    Unknown,
    Rejected,
}

impl ReceiptState {
    const ALL: [ReceiptState; 8] = [
        ReceiptState::Enroute,
        ReceiptState::Delivered,
        ReceiptState::Expired,
        ReceiptState::Deleted,
        ReceiptState::Undeliverable,
        ReceiptState::Accepted,
        ReceiptState::Unknown,
        ReceiptState::Rejected,
    ];

    /// The 7-letter `stat:` value of Appendix B.
    pub fn stat_text(&self) -> &'static str {
        match self {
            ReceiptState::Enroute => "ENROUTE",
            ReceiptState::Delivered => "DELIVRD",
            ReceiptState::Expired => "EXPIRED",
            ReceiptState::Deleted => "DELETED",
            ReceiptState::Undeliverable => "UNDELIV",
            ReceiptState::Accepted => "ACCEPTD",
            ReceiptState::Unknown => "UNKNOWN",
            ReceiptState::Rejected => "REJECTD",
        }
    }

    /// Reads a `stat:` value: the Appendix B words in any case, plus the spelled-out
    /// variants real SMSCs send (`DELIVERED`, `UNDELIVERABLE`, `UNDELIVERED`, `FAILED`,
    /// `ACCEPTED`, `REJECTED`, `EN_ROUTE`, `BUFFRED` …). `None` for anything else: an unrecognised
    /// state is not guessed at (the caller can fall back to the message_state TLV).
    pub fn from_stat_text(s: &str) -> Option<ReceiptState> {
        // Folded into a buffer the length of the longest word, `UNDELIVERABLE`.
        let folded = Folded::<13>::new(s.trim(), u8::to_ascii_uppercase)?;
        Some(match folded.as_bytes() {
            // Kannel's and some SMSCs' word for a message held for a later attempt.
            b"ENROUTE" | b"BUFFRED" | b"BUFFERED" => ReceiptState::Enroute,
            b"DELIVRD" | b"DELIVERED" | b"DELIVRED" => ReceiptState::Delivered,
            b"EXPIRED" => ReceiptState::Expired,
            b"DELETED" => ReceiptState::Deleted,
            b"UNDELIV" | b"UNDELIVERABLE" | b"UNDELIVERED" | b"FAILED" => ReceiptState::Undeliverable,
            b"ACCEPTD" | b"ACCEPTED" => ReceiptState::Accepted,
            b"UNKNOWN" => ReceiptState::Unknown,
            b"REJECTD" | b"REJECTED" => ReceiptState::Rejected,
            _ => return None,
        })
    }

    /// The `message_state` value (SMPP 3.4 §5.2.28) for the message_state TLV.
    pub fn message_state(&self) -> u8 {
        match self {
            ReceiptState::Enroute => 1,
            ReceiptState::Delivered => 2,
            ReceiptState::Expired => 3,
            ReceiptState::Deleted => 4,
            ReceiptState::Undeliverable => 5,
            ReceiptState::Accepted => 6,
            ReceiptState::Unknown => 7,
            ReceiptState::Rejected => 8,
        }
    }

    /// Reads a message_state TLV value. SMPP 5.0's SCHEDULED (0) and SKIPPED (9) and any
    /// other value are `None`.
    pub fn from_message_state(value: u8) -> Option<ReceiptState> {
        Self::ALL.into_iter().find(|s| s.message_state() == value)
    }

    /// Whether this state ends the message's life, i.e. no further receipt will change
    /// it and the correlation can be completed.
    ///
    /// Every state is final except `Enroute` and `Accepted`. SMPP 3.4 lists ACCEPTED as a
    /// final state (read by customer service on the subscriber's behalf), but in practice
    /// SMSCs send ACCEPTD as an intermediate "taken by the network" notification and
    /// follow it with DELIVRD or UNDELIV; treating it as final would report a non-delivery
    /// and then drop the real outcome. `Unknown` is final: it is the SMSC saying it has
    /// no better answer.
    pub fn is_final(&self) -> bool {
        !matches!(self, ReceiptState::Enroute | ReceiptState::Accepted)
    }

    /// Whether the message reached the handset. Only `Delivered`.
    pub fn is_success(&self) -> bool {
        matches!(self, ReceiptState::Delivered)
    }
}

/// How many characters of the original message go in `text:` (Appendix B).
pub const TEXT_EXCERPT_CHARS: usize = 20;

/// The fields of an Appendix B receipt text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptText {
    pub id: String,
    pub sub: u32,
    pub dlvrd: u32,
    /// `YYMMDDhhmm` as written (parsing keeps what the SMSC sent, seconds included);
    /// see [`format_date`] and [`parse_date`].
    pub submit_date: Option<String>,
    pub done_date: Option<String>,
    pub stat: ReceiptState,
    /// Usually 3 digits (network or SMSC specific). Empty when the receipt had none.
    pub err: String,
    /// The first characters of the message (see [`TEXT_EXCERPT_CHARS`]); often empty.
    pub text: String,
}

/// A receipt text without the fields a receipt cannot do without.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptError {
    #[error("receipt text has no id")]
    MissingId,
    #[error("receipt text has no stat")]
    MissingStat,
    /// The `stat:` value is not a state we recognise (the value is not repeated here: it
    /// is provider text).
    #[error("receipt stat is not a known state")]
    UnknownStat,
}

/// The keys receipt text is read by. `Submit`, `Done` and `Date` are only the words of
/// the two-word spellings (`submit date:`), never keys on their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    Id,
    Sub,
    Dlvrd,
    SubmitDate,
    DoneDate,
    Stat,
    Err,
    Text,
    Submit,
    Done,
    Date,
}

/// A word as SMSCs vary it, folded on the stack: `_`, `-` and spaces dropped, ASCII
/// letters mapped by `case`. `None` for a word with a non-ASCII character or longer than
/// `N` bytes: it matches none of the (ASCII, at most `N`-byte) words it is compared with.
struct Folded<const N: usize> {
    bytes: [u8; N],
    len: usize,
}

impl<const N: usize> Folded<N> {
    fn new(word: &str, case: impl Fn(&u8) -> u8) -> Option<Self> {
        let mut folded = Folded { bytes: [0; N], len: 0 };
        for b in word.bytes() {
            if matches!(b, b'_' | b'-' | b' ') {
                continue;
            }
            if !b.is_ascii() || folded.len == N {
                return None;
            }
            folded.bytes[folded.len] = case(&b);
            folded.len += 1;
        }
        Some(folded)
    }

    fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or_default()
    }
}

/// The key `raw` names, compared as SMSCs vary it: ASCII letters in any case, `_`, `-`
/// and spaces ignored (`Submit_Date`, `DONE-DATE`). `None` for any other word.
///
/// Read from a buffer on the stack, the length of the longest key: every receipt goes
/// through here, word by word.
fn key(raw: &str) -> Option<Key> {
    // Appendix B's own spelling first: what almost every SMSC writes, matched as it is.
    if let Some(key) = key_as_written(raw.as_bytes()) {
        return Some(key);
    }
    let folded = Folded::<10>::new(raw, u8::to_ascii_lowercase)?;
    key_as_written(folded.as_bytes())
}

/// The key a lower-case word without `_`, `-` or spaces names.
fn key_as_written(word: &[u8]) -> Option<Key> {
    Some(match word {
        b"id" => Key::Id,
        b"sub" => Key::Sub,
        b"dlvrd" => Key::Dlvrd,
        b"submitdate" => Key::SubmitDate,
        b"donedate" => Key::DoneDate,
        b"stat" => Key::Stat,
        b"err" => Key::Err,
        b"text" => Key::Text,
        b"submit" => Key::Submit,
        b"done" => Key::Done,
        b"date" => Key::Date,
        _ => return None,
    })
}

/// The whitespace-separated tokens of a text, each with its byte offset. Whitespace is
/// Unicode's (`char::is_whitespace`); an ASCII text, which receipts are, is read bytewise.
struct Tokens<'a> {
    text: &'a str,
    at: usize,
    ascii: bool,
}

impl<'a> Tokens<'a> {
    fn new(text: &'a str) -> Self {
        Tokens {
            text,
            at: 0,
            ascii: text.is_ascii(),
        }
    }

    /// Whether the character at byte `at` is whitespace, and its length in bytes.
    fn space_at(&self, at: usize) -> (bool, usize) {
        match self.text.as_bytes().get(at) {
            Some(&b) if b.is_ascii() => (matches!(b, b' ' | b'\t'..=b'\r'), 1),
            _ => self
                .text
                .get(at..)
                .and_then(|rest| rest.chars().next())
                .map_or((false, 1), |c| (c.is_whitespace(), c.len_utf8())),
        }
    }
}

impl<'a> Iterator for Tokens<'a> {
    type Item = (usize, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        let end = self.text.len();
        if self.ascii {
            let bytes = self.text.as_bytes();
            let space = |b: u8| matches!(b, b' ' | b'\t'..=b'\r');
            while self.at < end && space(bytes[self.at]) {
                self.at += 1;
            }
            let start = self.at;
            while self.at < end && !space(bytes[self.at]) {
                self.at += 1;
            }
            return (start < self.at)
                .then(|| self.text.get(start..self.at))
                .flatten()
                .map(|t| (start, t));
        }
        while self.at < end {
            let (space, len) = self.space_at(self.at);
            if !space {
                break;
            }
            self.at += len;
        }
        let start = self.at;
        while self.at < end {
            let (space, len) = self.space_at(self.at);
            if space {
                break;
            }
            self.at += len;
        }
        if start == self.at {
            return None;
        }
        Some((start, self.text.get(start..self.at)?))
    }
}

/// `token` split at its first `:`, found bytewise (`:` is ASCII, so it is never a byte
/// of a longer character).
fn split_colon(token: &str) -> Option<(&str, &str)> {
    let at = token.bytes().position(|b| b == b':')?;
    Some((token.get(..at)?, token.get(at + 1..)?))
}

/// `n` in decimal, zero-padded to at least `width` digits (what `{:03}` writes).
fn push_decimal(out: &mut String, n: u32, width: usize) {
    let mut digits = [b'0'; 10];
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[at.min(digits.len().saturating_sub(width))..] {
        out.push(char::from(d));
    }
}

impl ReceiptText {
    /// Formats the receipt exactly as Appendix B (see [`ReceiptFields::format`]).
    pub fn format(&self) -> String {
        self.fields().format()
    }

    /// The fields, borrowed.
    fn fields(&self) -> ReceiptFields<'_> {
        ReceiptFields {
            id: &self.id,
            sub: self.sub,
            dlvrd: self.dlvrd,
            submit_date: self.submit_date.as_deref(),
            done_date: self.done_date.as_deref(),
            stat: self.stat,
            err: &self.err,
            text: &self.text,
        }
    }

    /// Parses a receipt text as SMSCs actually write them (see [`ReceiptFields::parse`],
    /// which this owns the fields of).
    pub fn parse(s: &str) -> Result<ReceiptText, ReceiptError> {
        ReceiptFields::parse(s).map(|f| f.to_text())
    }
}

/// The fields of an Appendix B receipt text, borrowed from the text: what the gateway
/// reads of every receipt a provider sends, without copying each field out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiptFields<'a> {
    pub id: &'a str,
    pub sub: u32,
    pub dlvrd: u32,
    /// `YYMMDDhhmm` as written; see [`parse_date`].
    pub submit_date: Option<&'a str>,
    pub done_date: Option<&'a str>,
    pub stat: ReceiptState,
    /// Empty when the receipt had none.
    pub err: &'a str,
    /// Everything after `text:`; often empty.
    pub text: &'a str,
}

impl<'a> ReceiptFields<'a> {
    /// Parses a receipt text as SMSCs actually write them.
    ///
    /// Lenient about: key case (`Id:`, `STAT:`), `submit date` / `submit_date` /
    /// `submitdate` spellings, missing `sub`, `dlvrd`, dates, `err` and `text`, unknown
    /// extra fields anywhere, ids with hex letters, 12-digit dates with seconds, and
    /// colons or spaces inside `text` (everything after `text:` is the text). Unparsable
    /// counters read as 0. Strict about what correlation needs: an `id` and a recognised
    /// `stat` must be present.
    ///
    /// Receipt text is ASCII: pass the short_message octets through
    /// `String::from_utf8_lossy`, not the GSM decoder (which would turn `_` into `§`).
    pub fn parse(s: &'a str) -> Result<Self, ReceiptError> {
        match Self::parse_as_written(s) {
            Some(fields) => Ok(fields),
            None => Self::parse_any_layout(s),
        }
    }

    /// Reads a receipt laid out exactly as Appendix B writes it (and as [`ReceiptText::format`]
    /// does): `id:… sub:… dlvrd:… submit date:… done date:… stat:… err:…`, one space between
    /// fields, optionally ` text:…` to the end. Almost every SMSC sends this layout, and
    /// checking it field by field costs about a third of reading the text word by word.
    ///
    /// `None` for anything else (other spellings or order, extra fields, other whitespace,
    /// non-ASCII before `text:`, no id, an unknown state): [`Self::parse_any_layout`] reads
    /// those. Where this returns a receipt, it is the one `parse_any_layout` returns.
    fn parse_as_written(s: &'a str) -> Option<Self> {
        let mut rest = s;
        let id = written_field(&mut rest, "id:").filter(|id| !id.is_empty())?;
        let sub = written_field(&mut rest, " sub:")?;
        let dlvrd = written_field(&mut rest, " dlvrd:")?;
        let submit_date = written_field(&mut rest, " submit date:")?;
        let done_date = written_field(&mut rest, " done date:")?;
        let stat = ReceiptState::from_stat_text(written_field(&mut rest, " stat:")?)?;
        let err = written_field(&mut rest, " err:")?;
        let text = if rest.is_empty() {
            rest
        } else {
            rest.strip_prefix(" text:")?
        };
        Some(ReceiptFields {
            id,
            sub: sub.parse().unwrap_or(0),
            dlvrd: dlvrd.parse().unwrap_or(0),
            submit_date: Some(submit_date).filter(|d| !d.is_empty()),
            done_date: Some(done_date).filter(|d| !d.is_empty()),
            stat,
            err,
            text,
        })
    }

    /// Reads a receipt text in any layout SMSCs use (see [`Self::parse`]), word by word.
    pub fn parse_any_layout(s: &'a str) -> Result<Self, ReceiptError> {
        let mut id = None;
        let mut sub = 0;
        let mut dlvrd = 0;
        let mut submit_date = None;
        let mut done_date = None;
        let mut stat = None;
        let mut err = None;
        let mut text = None;

        let mut tokens = Tokens::new(s).peekable();
        while let Some((offset, token)) = tokens.next() {
            let (key, value, value_offset) = match split_colon(token) {
                Some((raw, value)) => (key(raw), value, offset + raw.len() + 1),
                // "submit date:…" / "done date:…": the key spans two tokens.
                None => {
                    let first = match key(token) {
                        Some(Key::Submit) => Key::SubmitDate,
                        Some(Key::Done) => Key::DoneDate,
                        _ => continue,
                    };
                    let Some(&(next_offset, next)) = tokens.peek() else {
                        continue;
                    };
                    let Some((second, value)) = split_colon(next) else {
                        continue;
                    };
                    if key(second) != Some(Key::Date) {
                        continue;
                    }
                    tokens.next();
                    (Some(first), value, next_offset + second.len() + 1)
                }
            };
            match key {
                Some(Key::Id) => id = Some(value),
                Some(Key::Sub) => sub = value.parse().unwrap_or(0),
                Some(Key::Dlvrd) => dlvrd = value.parse().unwrap_or(0),
                Some(Key::SubmitDate) => submit_date = Some(value),
                Some(Key::DoneDate) => done_date = Some(value),
                Some(Key::Stat) => stat = Some(value),
                Some(Key::Err) => err = Some(value),
                Some(Key::Text) => {
                    text = Some(s.get(value_offset..).unwrap_or(""));
                    break;
                }
                Some(Key::Submit | Key::Done | Key::Date) | None => {}
            }
        }

        let id = id.filter(|id| !id.is_empty()).ok_or(ReceiptError::MissingId)?;
        let stat = stat.ok_or(ReceiptError::MissingStat)?;
        let stat = ReceiptState::from_stat_text(stat).ok_or(ReceiptError::UnknownStat)?;
        Ok(ReceiptFields {
            id,
            sub,
            dlvrd,
            submit_date: submit_date.filter(|d| !d.is_empty()),
            done_date: done_date.filter(|d| !d.is_empty()),
            stat,
            err: err.unwrap_or_default(),
            text: text.unwrap_or_default(),
        })
    }

    /// Formats the receipt exactly as Appendix B:
    /// `id:{id} sub:{sub:03} dlvrd:{dlvrd:03} submit date:{date} done date:{date}
    /// stat:{STAT} err:{err} text:{text}` (one line). A missing date is written empty.
    /// `text` is written as given; shorten it with [`text_excerpt`] first.
    pub fn format(&self) -> String {
        let submit_date = self.submit_date.unwrap_or("");
        let done_date = self.done_date.unwrap_or("");
        let stat = self.stat.stat_text();
        // Written piece by piece: the formatting machinery costs more than the text.
        let mut out = String::with_capacity(
            80 + self.id.len() + submit_date.len() + done_date.len() + self.err.len() + self.text.len(),
        );
        out.push_str("id:");
        out.push_str(self.id);
        out.push_str(" sub:");
        push_decimal(&mut out, self.sub, 3);
        out.push_str(" dlvrd:");
        push_decimal(&mut out, self.dlvrd, 3);
        out.push_str(" submit date:");
        out.push_str(submit_date);
        out.push_str(" done date:");
        out.push_str(done_date);
        out.push_str(" stat:");
        out.push_str(stat);
        out.push_str(" err:");
        out.push_str(self.err);
        out.push_str(" text:");
        out.push_str(self.text);
        out
    }

    /// The fields as an owned [`ReceiptText`].
    pub fn to_text(&self) -> ReceiptText {
        ReceiptText {
            id: self.id.to_owned(),
            sub: self.sub,
            dlvrd: self.dlvrd,
            submit_date: self.submit_date.map(str::to_owned),
            done_date: self.done_date.map(str::to_owned),
            stat: self.stat,
            err: self.err.to_owned(),
            text: self.text.to_owned(),
        }
    }
}

/// The value after `prefix` at the start of `rest`, for [`ReceiptFields::parse_as_written`]:
/// printable ASCII up to a space or the end of the text, where `rest` is left. `None` when
/// `rest` does not start with `prefix` or the value ends at any other byte (a tab, a
/// control character, non-ASCII), which the word-by-word reader may split differently.
fn written_field<'a>(rest: &mut &'a str, prefix: &str) -> Option<&'a str> {
    let after = rest.strip_prefix(prefix)?;
    let len = after.bytes().position(|b| !b.is_ascii_graphic()).unwrap_or(after.len());
    if !matches!(after.as_bytes().get(len), None | Some(b' ')) {
        return None;
    }
    let (value, remaining) = after.split_at_checked(len)?;
    *rest = remaining;
    Some(value)
}

/// A receipt's octets as text: UTF-8, anything invalid replaced (as
/// `String::from_utf8_lossy` reads them), checked with the standard library's fast
/// validation first, since receipts are almost always plain ASCII.
pub fn receipt_octets(body: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(body) {
        Ok(text) => std::borrow::Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(body),
    }
}

/// The first [`TEXT_EXCERPT_CHARS`] characters of `message`, for `text:`.
pub fn text_excerpt(message: &str) -> String {
    message.chars().take(TEXT_EXCERPT_CHARS).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ReceiptText {
        ReceiptText {
            id: "0190c3e2".to_owned(),
            sub: 1,
            dlvrd: 1,
            submit_date: Some("2401011200".to_owned()),
            done_date: Some("2401011201".to_owned()),
            stat: ReceiptState::Delivered,
            err: "000".to_owned(),
            text: "hello".to_owned(),
        }
    }

    #[test]
    fn states_round_trip() {
        for state in ReceiptState::ALL {
            assert_eq!(ReceiptState::from_stat_text(state.stat_text()), Some(state));
            assert_eq!(
                ReceiptState::from_stat_text(&state.stat_text().to_lowercase()),
                Some(state)
            );
            assert_eq!(ReceiptState::from_message_state(state.message_state()), Some(state));
        }
        let values: Vec<u8> = ReceiptState::ALL.iter().map(|s| s.message_state()).collect();
        assert_eq!(values, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(ReceiptState::from_message_state(0), None);
        assert_eq!(ReceiptState::from_message_state(9), None);
    }

    #[test]
    fn stat_variants() {
        for (text, state) in [
            ("DELIVERED", ReceiptState::Delivered),
            ("Delivered", ReceiptState::Delivered),
            ("UNDELIVERABLE", ReceiptState::Undeliverable),
            ("undelivered", ReceiptState::Undeliverable),
            ("FAILED", ReceiptState::Undeliverable),
            ("ACCEPTED", ReceiptState::Accepted),
            ("REJECTED", ReceiptState::Rejected),
            ("EN_ROUTE", ReceiptState::Enroute),
            ("BUFFRED", ReceiptState::Enroute),
            (" expired ", ReceiptState::Expired),
        ] {
            assert_eq!(ReceiptState::from_stat_text(text), Some(state), "{text}");
        }
        assert_eq!(ReceiptState::from_stat_text("OK"), None);
        assert_eq!(ReceiptState::from_stat_text(""), None);
    }

    #[test]
    fn finality_and_success() {
        let finals: Vec<ReceiptState> = ReceiptState::ALL.into_iter().filter(ReceiptState::is_final).collect();
        assert_eq!(
            finals,
            [
                ReceiptState::Delivered,
                ReceiptState::Expired,
                ReceiptState::Deleted,
                ReceiptState::Undeliverable,
                ReceiptState::Unknown,
                ReceiptState::Rejected
            ]
        );
        assert!(ReceiptState::Delivered.is_success());
        assert!(!ReceiptState::Accepted.is_success());
        assert!(!ReceiptState::Enroute.is_success());
    }

    #[test]
    fn format_is_appendix_b() {
        assert_eq!(
            sample().format(),
            "id:0190c3e2 sub:001 dlvrd:001 submit date:2401011200 done date:2401011201 stat:DELIVRD err:000 text:hello"
        );
        let missing = ReceiptText {
            submit_date: None,
            done_date: None,
            text: String::new(),
            stat: ReceiptState::Undeliverable,
            err: "001".to_owned(),
            sub: 0,
            dlvrd: 0,
            ..sample()
        };
        assert_eq!(
            missing.format(),
            "id:0190c3e2 sub:000 dlvrd:000 submit date: done date: stat:UNDELIV err:001 text:"
        );
    }

    #[test]
    fn parse_what_format_writes() {
        assert_eq!(ReceiptText::parse(&sample().format()).unwrap(), sample());
        let empty_dates = ReceiptText {
            submit_date: None,
            done_date: None,
            text: String::new(),
            ..sample()
        };
        assert_eq!(ReceiptText::parse(&empty_dates.format()).unwrap(), empty_dates);
    }

    #[test]
    fn parse_is_lenient_like_real_smscs() {
        let r = ReceiptText::parse(
            "ID:1A2B3C SUB:001 DLVRD:001 SUBMIT DATE:240101120030 DONE DATE:240101120145 STAT:delivrd ERR:000 TEXT:",
        )
        .unwrap();
        assert_eq!(r.id, "1A2B3C");
        assert_eq!(r.submit_date.as_deref(), Some("240101120030"));
        assert_eq!(r.done_date.as_deref(), Some("240101120145"));
        assert_eq!(r.stat, ReceiptState::Delivered);
        assert_eq!(r.text, "");

        // Minimal: only id and stat, in another order.
        let r = ReceiptText::parse("stat:UNDELIV id:77").unwrap();
        assert_eq!((r.id.as_str(), r.sub, r.dlvrd), ("77", 0, 0));
        assert_eq!(r.err, "");
        assert_eq!(r.submit_date, None);

        // submit_date spelling, extra fields, text with colons and spaces.
        let r = ReceiptText::parse(
            "id:abc123 sub:1 dlvrd:0 submit_date:2401011200 done_date:2401011300 stat:EXPIRED err:027 mcc:234 mnc:15 text:Meet at 10:30: ok ",
        )
        .unwrap();
        assert_eq!(r.id, "abc123");
        assert_eq!((r.sub, r.dlvrd), (1, 0));
        assert_eq!(r.submit_date.as_deref(), Some("2401011200"));
        assert_eq!(r.done_date.as_deref(), Some("2401011300"));
        assert_eq!(r.stat, ReceiptState::Expired);
        assert_eq!(r.err, "027");
        assert_eq!(r.text, "Meet at 10:30: ok ");

        // Text that itself looks like fields is still text.
        let r = ReceiptText::parse("id:1 stat:DELIVRD err:000 text:stat:REJECTD id:2").unwrap();
        assert_eq!((r.id.as_str(), r.stat), ("1", ReceiptState::Delivered));
        assert_eq!(r.text, "stat:REJECTD id:2");

        // Tabs / repeated spaces, garbage counters, words without colons.
        let r = ReceiptText::parse("id:9\t\tsub:xx   dlvrd:  stat:ACCEPTD  junk  err:0").unwrap();
        assert_eq!((r.sub, r.dlvrd, r.stat), (0, 0, ReceiptState::Accepted));
        assert_eq!(r.err, "0");
    }

    #[test]
    fn parse_requires_id_and_stat() {
        assert_eq!(
            ReceiptText::parse("sub:001 stat:DELIVRD").unwrap_err(),
            ReceiptError::MissingId
        );
        assert_eq!(
            ReceiptText::parse("id: stat:DELIVRD").unwrap_err(),
            ReceiptError::MissingId
        );
        assert_eq!(
            ReceiptText::parse("id:1 err:000").unwrap_err(),
            ReceiptError::MissingStat
        );
        assert_eq!(
            ReceiptText::parse("id:1 stat:WHATEVER").unwrap_err(),
            ReceiptError::UnknownStat
        );
        // stat only inside text does not count.
        assert_eq!(
            ReceiptText::parse("id:1 text:stat:DELIVRD").unwrap_err(),
            ReceiptError::MissingStat
        );
        assert_eq!(ReceiptText::parse("").unwrap_err(), ReceiptError::MissingId);
    }

    #[test]
    fn parse_never_panics_on_odd_input() {
        for s in [
            ":",
            "::::",
            "id",
            "id:",
            "text:",
            "submit",
            "submit date",
            "done date:",
            "é:ü stat:é",
            "id:\u{0}",
            "id:😀 stat:delivrd text:😀:😀",
        ] {
            let _ = ReceiptText::parse(s);
        }
        let r = ReceiptText::parse("id:😀 stat:delivrd text:😀:😀").unwrap();
        assert_eq!(r.text, "😀:😀");
    }

    /// A repeatable pseudo-random choice among `n` (xorshift), for generated receipts.
    fn picker(mut seed: u64) -> impl FnMut(usize) -> usize {
        move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        }
    }

    /// The parser and formatter as first written, word by word with the standard
    /// library: the reference the faster ones must agree with on any input.
    mod reference {
        use super::super::{ReceiptError, ReceiptState, ReceiptText};

        fn normalise_key(key: &str) -> String {
            key.chars()
                .filter(|c| !matches!(c, '_' | '-' | ' '))
                .map(|c| c.to_ascii_lowercase())
                .collect()
        }

        fn tokens(s: &str) -> Vec<(usize, &str)> {
            let mut out = Vec::new();
            let mut start = None;
            for (i, c) in s.char_indices() {
                match (c.is_whitespace(), start) {
                    (true, Some(st)) => {
                        out.push((st, &s[st..i]));
                        start = None;
                    }
                    (false, None) => start = Some(i),
                    _ => {}
                }
            }
            if let Some(st) = start {
                out.push((st, &s[st..]));
            }
            out
        }

        pub fn from_stat_text(s: &str) -> Option<ReceiptState> {
            let word: String = s
                .trim()
                .chars()
                .filter(|c| !matches!(c, '_' | '-' | ' '))
                .map(|c| c.to_ascii_uppercase())
                .collect();
            Some(match word.as_str() {
                "ENROUTE" | "BUFFRED" | "BUFFERED" => ReceiptState::Enroute,
                "DELIVRD" | "DELIVERED" | "DELIVRED" => ReceiptState::Delivered,
                "EXPIRED" => ReceiptState::Expired,
                "DELETED" => ReceiptState::Deleted,
                "UNDELIV" | "UNDELIVERABLE" | "UNDELIVERED" | "FAILED" => ReceiptState::Undeliverable,
                "ACCEPTD" | "ACCEPTED" => ReceiptState::Accepted,
                "UNKNOWN" => ReceiptState::Unknown,
                "REJECTD" | "REJECTED" => ReceiptState::Rejected,
                _ => return None,
            })
        }

        pub fn format(r: &ReceiptText) -> String {
            format!(
                "id:{} sub:{:03} dlvrd:{:03} submit date:{} done date:{} stat:{} err:{} text:{}",
                r.id,
                r.sub,
                r.dlvrd,
                r.submit_date.as_deref().unwrap_or(""),
                r.done_date.as_deref().unwrap_or(""),
                r.stat.stat_text(),
                r.err,
                r.text
            )
        }

        pub fn parse(s: &str) -> Result<ReceiptText, ReceiptError> {
            let (mut id, mut sub, mut dlvrd) = (None, 0, 0);
            let (mut submit_date, mut done_date, mut stat, mut err, mut text) = (None, None, None, None, None);
            let toks = tokens(s);
            let mut i = 0;
            while let Some(&(offset, token)) = toks.get(i) {
                i += 1;
                let (key, value, value_offset) = match token.split_once(':') {
                    Some((key, value)) => (normalise_key(key), value, offset + key.len() + 1),
                    None => {
                        let word = normalise_key(token);
                        let Some(&(next_offset, next)) = toks.get(i) else {
                            continue;
                        };
                        let Some((second, value)) = next.split_once(':') else {
                            continue;
                        };
                        if !(matches!(word.as_str(), "submit" | "done") && normalise_key(second) == "date") {
                            continue;
                        }
                        i += 1;
                        (format!("{word}date"), value, next_offset + second.len() + 1)
                    }
                };
                match key.as_str() {
                    "id" => id = Some(value.to_owned()),
                    "sub" => sub = value.parse().unwrap_or(0),
                    "dlvrd" => dlvrd = value.parse().unwrap_or(0),
                    "submitdate" => submit_date = Some(value.to_owned()),
                    "donedate" => done_date = Some(value.to_owned()),
                    "stat" => stat = Some(value.to_owned()),
                    "err" => err = Some(value.to_owned()),
                    "text" => {
                        text = Some(s.get(value_offset..).unwrap_or("").to_owned());
                        break;
                    }
                    _ => {}
                }
            }
            let id = id.filter(|id| !id.is_empty()).ok_or(ReceiptError::MissingId)?;
            let stat = stat.ok_or(ReceiptError::MissingStat)?;
            let stat = from_stat_text(&stat).ok_or(ReceiptError::UnknownStat)?;
            Ok(ReceiptText {
                id,
                sub,
                dlvrd,
                submit_date: submit_date.filter(|d| !d.is_empty()),
                done_date: done_date.filter(|d| !d.is_empty()),
                stat,
                err: err.unwrap_or_default(),
                text: text.unwrap_or_default(),
            })
        }
    }

    #[test]
    fn parse_and_format_agree_with_the_reference_on_generated_receipts() {
        // Fields as SMSCs spell them, odd spellings and junk among them.
        const KEYS: [&[&str]; 9] = [
            &["id", "ID", "Id", "i_d"],
            &["sub", "SUB", "s_u_b"],
            &["dlvrd", "DLVRD", "Dlvrd"],
            &[
                "submit date",
                "SUBMIT DATE",
                "submit_date",
                "Submit-Date",
                "submitdate",
                "submit  date",
                "submit\tdate",
            ],
            &[
                "done date",
                "Done Date",
                "done_date",
                "DONE-DATE",
                "donedate",
                "done x date",
            ],
            &["stat", "STAT", "Stat", "st_at"],
            &["err", "ERR", "Err"],
            &["text", "TEXT", "Text"],
            &[
                "mcc",
                "é",
                "😀",
                "x",
                "submit",
                "done",
                "date",
                "submitdatex",
                "stat:",
                "",
            ],
        ];
        const VALUES: [&str; 16] = [
            "",
            "001",
            "1",
            "1234",
            "abc",
            "1A2B",
            "DELIVRD",
            "undeliv",
            "ACCEPTD",
            "EXPIRED",
            "2401011200",
            "240101120030",
            "10:30",
            "😀",
            "stat:DELIVRD id:2",
            "-1",
        ];
        const SEPARATORS: [&str; 6] = [":", ":", ":", ":", "", "::"];
        const SPACES: [&str; 12] = [
            " ", " ", " ", "  ", "\t", "\u{3000}", "\n", "\u{a0}", "\r", "\u{b}", "\u{85}", "\u{1c}",
        ];
        let mut next = picker(0x9e37_79b9_7f4a_7c15);
        let mut parsed_ok = 0;
        for _ in 0..100_000 {
            let mut text = String::new();
            if next(4) == 0 {
                text.push_str(SPACES[next(SPACES.len())]);
            }
            for _ in 0..next(10) {
                let spellings = KEYS[next(KEYS.len())];
                text.push_str(spellings[next(spellings.len())]);
                text.push_str(SEPARATORS[next(SEPARATORS.len())]);
                text.push_str(VALUES[next(VALUES.len())]);
                text.push_str(SPACES[next(SPACES.len())]);
            }
            let parsed = ReceiptText::parse(&text);
            assert_eq!(parsed, reference::parse(&text), "{text:?}");
            assert_eq!(
                ReceiptState::from_stat_text(&text),
                reference::from_stat_text(&text),
                "{text:?}"
            );
            if let Ok(r) = parsed {
                parsed_ok += 1;
                assert_eq!(r.format(), reference::format(&r), "{text:?}");
            }
        }
        // The generator reaches the paths that read every field, not only the refusals.
        assert!(parsed_ok > 2_000, "{parsed_ok} receipts parsed");
        for word in [
            "DELIVRD",
            " delivered ",
            "Un_Deliv-erable",
            "UNDELIVERABLE",
            "UNDELIVERABLES",
            "en route",
            "EN\tROUTE",
            "buffred",
            "accepté",
            "REJECTD\u{a0}",
            "",
            "_-",
            "failed",
            "unknown!",
            "DELIVRD\u{0}",
        ] {
            assert_eq!(
                ReceiptState::from_stat_text(word),
                reference::from_stat_text(word),
                "{word:?}"
            );
        }
        for n in [0, 7, 99, 999, 1_000, 123_456, u32::MAX] {
            let r = ReceiptText {
                sub: n,
                dlvrd: n,
                ..sample()
            };
            assert_eq!(r.format(), reference::format(&r));
        }
    }

    #[test]
    fn receipts_as_written_read_as_any_layout_and_the_reference_do() {
        // Appendix B's layout with values that keep to it and values that leave it (no
        // id, whitespace or non-ASCII inside a value, colons, an unknown state).
        const VALUES: [&str; 14] = [
            "",
            "001",
            "1",
            "abc",
            "1A2B3C",
            "0190c3e2-7a1b",
            "10:30",
            "text:x",
            "id:2",
            "-1",
            "DELIVRD",
            "a\tb",
            "é",
            "4294967296",
        ];
        const STATS: [&str; 8] = [
            "DELIVRD",
            "UNDELIV",
            "delivered",
            "ACCEPTD",
            "EN_ROUTE",
            "OK",
            "",
            "REJECTD",
        ];
        const TEXTS: [Option<&str>; 7] = [
            None,
            Some(""),
            Some("hello"),
            Some("Meet at 10:30: ok "),
            Some("stat:REJECTD id:2"),
            Some("😀 \u{a0}x"),
            Some(" "),
        ];
        let mut next = picker(0x2545_f491_4f6c_dd1d);
        let mut as_written = 0;
        for _ in 0..50_000 {
            let mut value = || VALUES[next(VALUES.len())];
            let mut text = format!(
                "id:{} sub:{} dlvrd:{} submit date:{} done date:{}",
                value(),
                value(),
                value(),
                value(),
                value()
            );
            text.push_str(" stat:");
            text.push_str(STATS[next(STATS.len())]);
            text.push_str(" err:");
            text.push_str(VALUES[next(VALUES.len())]);
            if let Some(t) = TEXTS[next(TEXTS.len())] {
                text.push_str(" text:");
                text.push_str(t);
            }
            let parsed = ReceiptFields::parse(&text);
            assert_eq!(parsed, ReceiptFields::parse_any_layout(&text), "{text:?}");
            assert_eq!(parsed.map(|f| f.to_text()), reference::parse(&text), "{text:?}");
            if let Some(fields) = ReceiptFields::parse_as_written(&text) {
                as_written += 1;
                assert_eq!(Ok(fields), ReceiptFields::parse_any_layout(&text), "{text:?}");
            }
        }
        // Both outcomes are reached: read as written, and handed to the general reader.
        assert!((5_000..45_000).contains(&as_written), "{as_written} read as written");
        assert!(ReceiptFields::parse_as_written(&sample().format()).is_some());
        for other in [
            " id:1 sub:001 dlvrd:001 submit date:2401011200 done date:2401011201 stat:DELIVRD err:000",
            "id:1 sub:001 dlvrd:001 submit date:2401011200 done date:2401011201 stat:DELIVRD err:000 ",
            "id:1 sub:001 dlvrd:001 submit_date:2401011200 done date:2401011201 stat:DELIVRD err:000",
            "id:1  sub:001 dlvrd:001 submit date:2401011200 done date:2401011201 stat:DELIVRD err:000",
            "ID:1 sub:001 dlvrd:001 submit date:2401011200 done date:2401011201 stat:DELIVRD err:000",
            "id:1 sub:001 dlvrd:001 submit date:2401011200 done date:2401011201 stat:DELIVRD err:000 mcc:234",
        ] {
            assert!(ReceiptFields::parse_as_written(other).is_none(), "{other:?}");
            assert_eq!(
                ReceiptFields::parse(other).map(|f| f.to_text()),
                reference::parse(other),
                "{other:?}"
            );
        }
    }

    #[test]
    fn receipt_octets_read_as_from_utf8_lossy_does() {
        for body in [
            &b"id:1 stat:DELIVRD"[..],
            b"",
            "id:\u{e9} text:\u{1f600}".as_bytes(),
            b"id:\xff\xfe stat:\xc3",
        ] {
            assert_eq!(receipt_octets(body), String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn excerpt_counts_characters() {
        assert_eq!(text_excerpt("short"), "short");
        assert_eq!(text_excerpt(&"é".repeat(30)).chars().count(), 20);
    }
}
