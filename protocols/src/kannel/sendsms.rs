//! The parameters of Kannel's `/cgi-bin/sendsms`, read as Kannel's smsbox reads them, and
//! the answers it gives.
//!
//! A request is a list of `name=value` pairs (the query string of a GET, or an
//! `application/x-www-form-urlencoded` POST body), percent-decoded to bytes: the bytes of
//! `text` mean what `charset` and `coding` say, so they are not taken as UTF-8 before
//! those are read. The first occurrence of a name counts, as in Kannel; names Kannel
//! knows and Sendium does not use (`account`, `binfo`, `pid`, `meta-data`, …) and names
//! nobody knows are ignored.

use crate::multipart::{self, Concat};
use crate::text::{self, Alphabet};

/// The pairs of a query string or form body, percent-decoded (`+` is a space).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Params(Vec<(Vec<u8>, Vec<u8>)>);

impl Params {
    /// Reads `a=1&b=2` (a pair without `=` has an empty value; empty pairs are skipped).
    pub fn parse(raw: &[u8]) -> Params {
        Params(
            raw.split(|b| *b == b'&')
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let (name, value) = match pair.iter().position(|b| *b == b'=') {
                        Some(i) => (&pair[..i], &pair[i + 1..]),
                        None => (pair, &[][..]),
                    };
                    (percent_decode(name), percent_decode(value))
                })
                .collect(),
        )
    }

    /// Every pair, in request order, percent-decoded.
    pub fn pairs(&self) -> &[(Vec<u8>, Vec<u8>)] {
        &self.0
    }

    /// The first value of `name`.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.0
            .iter()
            .find(|(n, _)| n == name.as_bytes())
            .map(|(_, v)| v.as_slice())
    }

    /// The first value of the first of `names` present (a name and its alias).
    fn first(&self, names: &[&str]) -> Option<&[u8]> {
        names.iter().find_map(|n| self.get(n))
    }

    /// `username` (or `user`) and `password` (or `pass`), as sent.
    pub fn credentials(&self) -> (Option<&[u8]>, Option<&[u8]>) {
        (self.first(&["username", "user"]), self.first(&["password", "pass"]))
    }
}

/// `%XX` to its byte and `+` to a space; a `%` not followed by two hex digits stays.
fn percent_decode(s: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).and_then(|d| u8::try_from(d).ok());
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while let Some(&b) = s.get(i) {
        match b {
            b'+' => out.push(b' '),
            b'%' => match (s.get(i + 1).copied().and_then(hex), s.get(i + 2).copied().and_then(hex)) {
                (Some(hi), Some(lo)) => {
                    out.push(hi << 4 | lo);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            _ => out.push(b),
        }
        i += 1;
    }
    out
}

/// A refused request: the HTTP status and the text Kannel's smsbox answers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub text: String,
}

impl Answer {
    fn bad(text: &str) -> Answer {
        Answer {
            status: 400,
            text: text.to_string(),
        }
    }

    /// Wrong or missing credentials, or a user not accepted from this address.
    pub fn forbidden() -> Answer {
        Answer {
            status: 403,
            text: "Authorization failed for sendsms".into(),
        }
    }

    /// Every message was admitted.
    pub fn accepted() -> Answer {
        Answer {
            status: 202,
            text: "0: Accepted for delivery".into(),
        }
    }

    /// Every message was admitted, and some wait for a destination: every destination
    /// of their route is down (Kannel's answer when every SMSC of the route is down).
    pub fn queued() -> Answer {
        Answer {
            status: 202,
            text: "3: Queued for later delivery".into(),
        }
    }

    /// The pipeline cannot take the messages now (full, or a store is failing).
    pub fn unavailable() -> Answer {
        Answer {
            status: 503,
            text: "Temporal failure, try again later.".into(),
        }
    }

    /// Some receivers of a multi-receiver request were not admitted (the others were):
    /// Kannel's answer for a send that failed part-way, naming the failed receivers.
    pub fn failed_receivers(failed: &[String]) -> Answer {
        Answer {
            status: 500,
            text: format!("Sending failed. Failed receivers are: {}", failed.join(" ")),
        }
    }

    /// A message the gateway refuses for good (e.g. a receipt asked for while receipts
    /// are disabled): Kannel's answer for a message it cannot route.
    pub fn not_routable() -> Answer {
        Answer {
            status: 403,
            text: "Not routable. Do not try again.".into(),
        }
    }
}

/// Kannel's `coding`: the alphabet of the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// 0: GSM 7-bit.
    Gsm7,
    /// 1: 8-bit binary, the bytes of `text` as they are.
    Binary,
    /// 2: UCS2.
    Ucs2,
}

/// A valid request: one message per receiver, all alike but for the receiver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sendsms {
    pub from: String,
    /// Each receiver as given (`+` and `00` prefixes kept; the pipeline normalises).
    pub to: Vec<String>,
    /// The SMPP data_coding (message class included).
    pub data_coding: u8,
    /// User data without UDH.
    pub payload: Vec<u8>,
    /// A concatenation element in `udh`: the message is that part of a long message.
    pub concat: Option<Concat>,
    pub validity_minutes: Option<u32>,
    pub deferred_minutes: Option<u32>,
    /// `dlr-mask`, 0 when absent.
    pub dlr_mask: u8,
    pub dlr_url: Option<String>,
    /// `smsc`: the destination the application asks for.
    pub smsc: Option<String>,
}

/// Longest accepted message text, in characters, as `POST /v1/messages` takes.
const MAX_TEXT_CHARS: usize = crate::http::MAX_TEXT_CHARS;

/// A whole number parameter within `range`; absent or -1 (Kannel's "undefined") is
/// `None`. Kannel reads these with `sscanf("%d")` and ignores what follows the digits;
/// here the whole value must be a number, and anything else gets Kannel's "field
/// misformed" answer rather than being half-read.
fn number(
    params: &Params,
    names: &[&str],
    range: std::ops::RangeInclusive<i64>,
    error: &str,
) -> Result<Option<i64>, Answer> {
    let Some(raw) = params.first(names) else {
        return Ok(None);
    };
    let n = std::str::from_utf8(raw)
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .ok_or_else(|| Answer::bad(error))?;
    if n == -1 {
        // Kannel's "undefined".
        return Ok(None);
    }
    if range.contains(&n) {
        Ok(Some(n))
    } else {
        Err(Answer::bad(error))
    }
}

/// The text of `bytes` in `charset` (Kannel's `charset` parameter; `None` = UTF-8).
fn decode_charset(charset: Option<&str>, bytes: &[u8]) -> Option<String> {
    let name = charset.unwrap_or("UTF-8").trim().to_ascii_uppercase().replace('_', "-");
    match name.as_str() {
        "UTF-8" | "UTF8" => String::from_utf8(bytes.to_vec()).ok(),
        "ISO-8859-1" | "ISO8859-1" | "LATIN1" | "LATIN-1" => Some(bytes.iter().copied().map(char::from).collect()),
        "UTF-16BE" | "UCS-2" | "UCS2" | "UCS-2BE" | "UTF-16" => text::decode(0x08, bytes).ok(),
        "US-ASCII" | "ASCII" => bytes.is_ascii().then(|| String::from_utf8_lossy(bytes).into_owned()),
        _ => None,
    }
}

/// Checks a request's parameters, in the order Kannel's smsbox checks them, after the
/// credentials (see [`Params::credentials`]). The error is the answer to give.
pub fn parse(params: &Params) -> Result<Sendsms, Answer> {
    let to = params
        .get("to")
        .ok_or_else(|| Answer::bad("Missing receiver number, rejected"))?;
    let given: Vec<String> = String::from_utf8_lossy(to)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    if given.is_empty() {
        return Err(Answer::bad("Empty receiver number not allowed, rejected"));
    }
    // Each receiver once; one that is not a number (digits, an optional leading `+`)
    // is left out, as Kannel leaves out numbers with characters outside its
    // `sendsms-chars`.
    let mut to: Vec<String> = Vec::with_capacity(given.len());
    for r in given {
        let digits = r.strip_prefix('+').unwrap_or(&r);
        let valid = !digits.is_empty() && digits.len() <= 20 && digits.bytes().all(|b| b.is_ascii_digit());
        if valid && !to.contains(&r) {
            to.push(r);
        }
    }
    if to.is_empty() {
        return Err(Answer::bad(
            "Number(s) has/have been denied by white- and/or black-lists.",
        ));
    }
    let udh = params.get("udh");
    let text = params.get("text");
    if text.is_none() && udh.is_none() {
        return Err(Answer::bad("Wrong sendsms args, rejected"));
    }
    if let Some(udh) = udh
        && udh.first().map(|l| usize::from(*l) + 1) != Some(udh.len())
    {
        return Err(Answer::bad("UDH field misformed, rejected"));
    }
    if udh.is_some_and(|u| u.len() > 140) {
        return Err(Answer::bad("UDH field is too long, rejected"));
    }
    let from = params
        .get("from")
        .map(|f| String::from_utf8_lossy(f).trim().to_string())
        .unwrap_or_default();
    if from.is_empty() {
        return Err(Answer::bad("Sender missing and no global set, rejected"));
    }
    let dlr_url = match params.first(&["dlr-url", "dlrurl"]).filter(|u| !u.is_empty()) {
        None => None,
        Some(u) => {
            let u = std::str::from_utf8(u).map_err(|_| Answer::bad("DLR-URL field misformed, rejected"))?;
            let lower = u.get(..8).unwrap_or(u).to_ascii_lowercase();
            if !(lower.starts_with("http://") || lower.starts_with("https://")) || u.len() > crate::http::MAX_URL {
                return Err(Answer::bad("DLR-URL field misformed, rejected"));
            }
            Some(u.to_string())
        }
    };
    let dlr_mask = number(
        params,
        &["dlr-mask", "dlrmask"],
        0..=63,
        "DLR-Mask field misformed, rejected",
    )?;
    let mclass = number(params, &["mclass"], 0..=3, "MClass field misformed, rejected")?;
    number(params, &["pid"], 0..=255, "PID field misformed, rejected")?;
    number(params, &["mwi"], 0..=7, "MWI field misformed, rejected")?;
    let coding = number(params, &["coding"], 0..=2, "Coding field misformed, rejected")?;
    let validity = number(
        params,
        &["validity"],
        0..=i64::from(u32::MAX),
        "Validity field misformed, rejected",
    )?;
    let deferred = number(
        params,
        &["deferred"],
        0..=i64::from(u32::MAX),
        "Deferred field misformed, rejected",
    )?;
    number(params, &["priority"], 0..=3, "Priority field misformed, rejected")?;
    let coding = match coding {
        Some(0) => Some(Coding::Gsm7),
        Some(1) => Some(Coding::Binary),
        Some(2) => Some(Coding::Ucs2),
        // Kannel's compatibility mode: a UDH makes the message 8-bit.
        _ if udh.is_some() => Some(Coding::Binary),
        // Not given: the smallest alphabet that holds the text (GSM 7-bit, else UCS2),
        // as POST /v1/messages does.
        _ => None,
    };
    let misformed = || Answer::bad("Charset or body misformed, rejected");
    let raw = text.unwrap_or_default();
    let charset = params
        .get("charset")
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .filter(|c| !c.is_empty());
    let (alphabet, payload) = match coding {
        Some(Coding::Binary) => (Alphabet::Binary, raw.to_vec()),
        // Kannel converts only when a charset is given: without one the bytes already
        // are UTF-16BE.
        Some(Coding::Ucs2) if charset.is_none() => {
            text::decode(0x08, raw).map_err(|_| misformed())?;
            (Alphabet::Ucs2, raw.to_vec())
        }
        Some(c) => {
            let s = decode_charset(charset.as_deref(), raw).ok_or_else(misformed)?;
            let alphabet = if c == Coding::Ucs2 {
                Alphabet::Ucs2
            } else {
                Alphabet::Gsm7
            };
            (alphabet, text::encode(alphabet, &s).map_err(|_| misformed())?)
        }
        None => {
            let s = decode_charset(charset.as_deref(), raw).ok_or_else(misformed)?;
            let alphabet = text::best_alphabet(&s);
            (alphabet, text::encode(alphabet, &s).map_err(|_| misformed())?)
        }
    };
    let chars = match alphabet {
        Alphabet::Ucs2 => payload.len() / 2,
        _ => payload.len(),
    };
    if chars > MAX_TEXT_CHARS {
        return Err(Answer::bad("Charset or body misformed, rejected"));
    }
    let concat = match udh {
        Some(udh) => {
            let mut whole = udh.to_vec();
            whole.extend_from_slice(&payload);
            let (concat, _, _) =
                multipart::parse_udh(&whole).map_err(|_| Answer::bad("UDH field misformed, rejected"))?;
            concat
        }
        None => None,
    };
    if payload.is_empty() {
        return Err(Answer::bad("Wrong sendsms args, rejected"));
    }
    let data_coding = match (mclass, alphabet) {
        // GSM 03.38 general data coding with a message class: bits 3..2 the alphabet.
        (Some(class), Alphabet::Gsm7) => 0x10 | class as u8,
        (Some(class), Alphabet::Binary) => 0x14 | class as u8,
        (Some(class), Alphabet::Ucs2) => 0x18 | class as u8,
        (_, a) => a.data_coding(),
    };
    Ok(Sendsms {
        from,
        to,
        data_coding,
        payload,
        concat,
        validity_minutes: validity.and_then(|v| u32::try_from(v).ok()),
        deferred_minutes: deferred.and_then(|v| u32::try_from(v).ok()),
        dlr_mask: dlr_mask.and_then(|m| u8::try_from(m).ok()).unwrap_or(0),
        dlr_url,
        smsc: params
            .get("smsc")
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .filter(|s| !s.is_empty()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Result<Sendsms, Answer> {
        parse(&Params::parse(s.as_bytes()))
    }

    fn refused(s: &str) -> String {
        q(s).unwrap_err().text
    }

    #[test]
    fn the_user_guide_example_reads() {
        let p = Params::parse(b"username=tester&password=foobar&to=0123456&text=Hello+world&from=1234");
        assert_eq!(p.credentials(), (Some(&b"tester"[..]), Some(&b"foobar"[..])));
        let s = parse(&p).unwrap();
        assert_eq!((s.from.as_str(), s.to.clone()), ("1234", vec!["0123456".to_string()]));
        assert_eq!(s.data_coding, 0);
        assert_eq!(text::decode(0, &s.payload).unwrap(), "Hello world");
        assert_eq!((s.dlr_mask, s.dlr_url, s.concat), (0, None, None));
        let p = Params::parse(b"user=u&pass=p%26q");
        assert_eq!(p.credentials(), (Some(&b"u"[..]), Some(&b"p&q"[..])));
    }

    #[test]
    fn several_receivers_split_on_spaces_and_plus() {
        let s = q("from=1&to=111+222%20333+111+12a&text=x").unwrap();
        assert_eq!(s.to, ["111", "222", "333"], "each once, the non-number left out");
        assert_eq!(
            refused("from=1&to=abc&text=x"),
            "Number(s) has/have been denied by white- and/or black-lists."
        );
        // An encoded plus stays a plus: an international number.
        assert_eq!(q("from=1&to=%2B4479&text=x").unwrap().to, ["+4479"]);
    }

    #[test]
    fn charsets_and_codings() {
        // UTF-8 text that GSM cannot hold goes UCS2 by itself.
        let s = q("from=1&to=2&text=%D0%BF%D1%80%D0%B8").unwrap();
        assert_eq!(
            (s.data_coding, text::decode(8, &s.payload).unwrap().as_str()),
            (8, "при")
        );
        // coding=2 with a charset: converted to UTF-16BE.
        let s = q("from=1&to=2&text=h%C3%A9&coding=2&charset=UTF-8").unwrap();
        assert_eq!((s.data_coding, s.payload.clone()), (8, vec![0, b'h', 0, 0xE9]));
        // Latin-1 bytes read as Latin-1.
        let s = q("from=1&to=2&text=caf%E9&charset=ISO-8859-1").unwrap();
        assert_eq!(text::decode(s.data_coding, &s.payload).unwrap(), "café");
        // coding=2 without a charset: the bytes are UTF-16BE already.
        let s = q("from=1&to=2&text=%00h%00i&coding=2").unwrap();
        assert_eq!(text::decode(8, &s.payload).unwrap(), "hi");
        let s = q("from=1&to=2&text=%04%3F&charset=UTF-16BE").unwrap();
        assert_eq!(text::decode(s.data_coding, &s.payload).unwrap(), "\u{43F}");
        // 8-bit: the bytes untouched.
        let s = q("from=1&to=2&text=%FF%00%01&coding=1").unwrap();
        assert_eq!((s.data_coding, s.payload), (4, vec![0xFF, 0, 1]));
        // A message class goes into the general data coding group.
        assert_eq!(q("from=1&to=2&text=x&mclass=0").unwrap().data_coding, 0x10);
        assert_eq!(
            q("from=1&to=2&text=x&coding=2&charset=utf-8&mclass=1")
                .unwrap()
                .data_coding,
            0x19
        );
        // Not UTF-8, not a known charset, not GSM under coding=0.
        for bad in [
            "text=%FF",
            "text=x&charset=KOI8-R",
            "text=%D0%BF&coding=0",
            "text=%00h%00&coding=2",
        ] {
            assert_eq!(
                refused(&format!("from=1&to=2&{bad}")),
                "Charset or body misformed, rejected",
                "{bad}"
            );
        }
    }

    #[test]
    fn a_concatenation_udh_makes_a_part() {
        let s = q("from=1&to=2&udh=%05%00%03%2A%02%01&text=part+one").unwrap();
        assert_eq!(
            s.concat,
            Some(Concat {
                reference: 0x2A,
                total: 2,
                seq: 1
            })
        );
        assert_eq!((s.data_coding, s.payload.as_slice()), (4, &b"part one"[..]));
        assert_eq!(
            refused("from=1&to=2&udh=%06%00%03&text=x"),
            "UDH field misformed, rejected"
        );
    }

    #[test]
    fn each_misformed_parameter_gets_kannels_text() {
        let cases = [
            ("from=1&text=x", "Missing receiver number, rejected"),
            ("from=1&to=&text=x", "Empty receiver number not allowed, rejected"),
            ("from=1&to=+&text=x", "Empty receiver number not allowed, rejected"),
            ("from=1&to=2", "Wrong sendsms args, rejected"),
            ("to=2&text=x", "Sender missing and no global set, rejected"),
            ("from=1&to=2&text=x&dlr-mask=64", "DLR-Mask field misformed, rejected"),
            ("from=1&to=2&text=x&dlr-mask=abc", "DLR-Mask field misformed, rejected"),
            (
                "from=1&to=2&text=x&dlr-url=ftp://x/y",
                "DLR-URL field misformed, rejected",
            ),
            ("from=1&to=2&text=x&mclass=4", "MClass field misformed, rejected"),
            ("from=1&to=2&text=x&coding=3", "Coding field misformed, rejected"),
            ("from=1&to=2&text=x&validity=-5", "Validity field misformed, rejected"),
            ("from=1&to=2&text=x&deferred=x", "Deferred field misformed, rejected"),
            ("from=1&to=2&text=x&priority=9", "Priority field misformed, rejected"),
        ];
        for (query, text) in cases {
            let a = q(query).unwrap_err();
            assert_eq!((a.status, a.text.as_str()), (400, text), "{query}");
        }
    }

    #[test]
    fn receipts_validity_smsc_and_unknown_parameters() {
        let s = q(
            "from=1&to=2&text=x&dlr-mask=31&dlr-url=http%3A%2F%2F127.0.0.1%2Fd%3Ft%3D%25d&validity=10\
                   &deferred=-1&smsc=up&meta-data=%3Fsmpp%3Fa%3Db&account=acc&binfo=b&foo=bar",
        )
        .unwrap();
        assert_eq!(
            (s.dlr_mask, s.dlr_url.as_deref()),
            (31, Some("http://127.0.0.1/d?t=%d"))
        );
        assert_eq!((s.validity_minutes, s.deferred_minutes), (Some(10), None));
        assert_eq!(s.smsc.as_deref(), Some("up"));
        // The deprecated spellings.
        let s = q("from=1&to=2&text=x&dlrmask=3&dlrurl=https://h/").unwrap();
        assert_eq!((s.dlr_mask, s.dlr_url.as_deref()), (3, Some("https://h/")));
    }

    #[test]
    fn percent_decoding_keeps_bytes_and_stray_percents() {
        assert_eq!(percent_decode(b"a%41%4a+b%zz%4"), b"aAJ b%zz%4".to_vec());
        assert_eq!(percent_decode(b"%C3%A9%00"), vec![0xC3, 0xA9, 0]);
    }
}
