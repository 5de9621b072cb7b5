//! Delivery receipts: the SMPP 3.4 Appendix B receipt text, the message states, and (in
//! [`id`]) matching a receipt's id to the `submit_sm_resp` id it reports on.
//!
//! Upstream receipts are *parsed* leniently — every SMSC formats the text a little
//! differently — and downstream receipts are *formatted* exactly as Appendix B shows, since
//! ESMEs tend to parse them with fixed patterns.

mod date;
pub mod id;

pub use date::{format_date, parse_date};
pub use id::{IdFormat, receipt_keys, resp_key};

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
        let word: String = s
            .trim()
            .chars()
            .filter(|c| !matches!(c, '_' | '-' | ' '))
            .map(|c| c.to_ascii_uppercase())
            .collect();
        Some(match word.as_str() {
            // Kannel's and some SMSCs' word for a message held for a later attempt.
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

/// Normalised key names: lower case without spaces/underscores/dashes.
const KEY_ID: &str = "id";
const KEY_SUB: &str = "sub";
const KEY_DLVRD: &str = "dlvrd";
const KEY_SUBMIT_DATE: &str = "submitdate";
const KEY_DONE_DATE: &str = "donedate";
const KEY_STAT: &str = "stat";
const KEY_ERR: &str = "err";
const KEY_TEXT: &str = "text";

fn normalise_key(key: &str) -> String {
    key.chars()
        .filter(|c| !matches!(c, '_' | '-' | ' '))
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// Whitespace-separated tokens with their byte offsets.
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

impl ReceiptText {
    /// Formats the receipt exactly as Appendix B:
    /// `id:{id} sub:{sub:03} dlvrd:{dlvrd:03} submit date:{date} done date:{date}
    /// stat:{STAT} err:{err} text:{text}` (one line). A missing date is written empty.
    /// `text` is written as given; shorten it with [`text_excerpt`] first.
    pub fn format(&self) -> String {
        format!(
            "id:{} sub:{:03} dlvrd:{:03} submit date:{} done date:{} stat:{} err:{} text:{}",
            self.id,
            self.sub,
            self.dlvrd,
            self.submit_date.as_deref().unwrap_or(""),
            self.done_date.as_deref().unwrap_or(""),
            self.stat.stat_text(),
            self.err,
            self.text
        )
    }

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
    pub fn parse(s: &str) -> Result<ReceiptText, ReceiptError> {
        let mut id = None;
        let mut sub = 0;
        let mut dlvrd = 0;
        let mut submit_date = None;
        let mut done_date = None;
        let mut stat = None;
        let mut err = None;
        let mut text = None;

        let toks = tokens(s);
        let mut i = 0;
        while let Some(&(offset, token)) = toks.get(i) {
            i += 1;
            // "submit date:…" / "done date:…": the key spans two tokens.
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
                KEY_ID => id = Some(value.to_owned()),
                KEY_SUB => sub = value.parse().unwrap_or(0),
                KEY_DLVRD => dlvrd = value.parse().unwrap_or(0),
                KEY_SUBMIT_DATE => submit_date = Some(value.to_owned()),
                KEY_DONE_DATE => done_date = Some(value.to_owned()),
                KEY_STAT => stat = Some(value.to_owned()),
                KEY_ERR => err = Some(value.to_owned()),
                KEY_TEXT => {
                    text = Some(s.get(value_offset..).unwrap_or("").to_owned());
                    break;
                }
                _ => {}
            }
        }

        let id = id.filter(|id| !id.is_empty()).ok_or(ReceiptError::MissingId)?;
        let stat = stat.ok_or(ReceiptError::MissingStat)?;
        let stat = ReceiptState::from_stat_text(&stat).ok_or(ReceiptError::UnknownStat)?;
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

    #[test]
    fn excerpt_counts_characters() {
        assert_eq!(text_excerpt("short"), "short");
        assert_eq!(text_excerpt(&"é".repeat(30)).chars().count(), 20);
    }
}
