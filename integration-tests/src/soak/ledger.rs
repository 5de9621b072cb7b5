//! Every message the soak sent, what the gateway acknowledged, the receipts that came
//! back, and the final reckoning against what the test SMSC received.
//!
//! Each message has a number (its key); its destination is `44` + a class digit + the key
//! in nine digits, so the SMSC's records map back to it, and its text is a function of
//! key and kind, so the content is checked too. Class `9` destinations are the ones the
//! reject fault refuses (`ESME_RINVDSTADR`): such a message either reached the SMSC while
//! the fault was off or ended with a REJECTD receipt.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::histogram::Histogram;
use crate::smsc::SmscMessage;

/// The source address of the SMPP traffic.
pub const SMPP_SOURCE: &str = "12345";
/// The sender of the HTTP traffic.
pub const HTTP_SOURCE: &str = "Shop";
/// Destinations of the reject class start with this.
pub const REJECT_PREFIX: &str = "449";

/// How a multipart SMPP message is marked and which parts ask for a receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Multi {
    /// GSM 7-bit, 8-bit UDH reference, receipt on part 1 (Kannel).
    Udh8First,
    /// GSM 7-bit, 16-bit UDH reference, receipt on every part.
    Udh16Every,
    /// GSM 7-bit, SAR TLVs, receipt on the last part.
    SarLast,
    /// UCS2, 8-bit UDH reference, receipt on every part.
    Ucs2Every,
}

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    SmppGsm,
    SmppUcs2,
    /// registered_delivery 0: owes no receipt.
    SmppGsmNoDlr,
    SmppMulti(Multi),
    /// To the reject class.
    SmppReject,
    HttpShort,
    /// Long enough for the gateway to split it for the provider.
    HttpLong,
    HttpUcs2,
    HttpReject,
}

impl Kind {
    pub fn is_http(self) -> bool {
        matches!(
            self,
            Kind::HttpShort | Kind::HttpLong | Kind::HttpUcs2 | Kind::HttpReject
        )
    }

    pub fn reject_class(self) -> bool {
        matches!(self, Kind::SmppReject | Kind::HttpReject)
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::SmppGsm => "smpp gsm",
            Kind::SmppUcs2 => "smpp ucs2",
            Kind::SmppGsmNoDlr => "smpp gsm, no receipt",
            Kind::SmppMulti(Multi::Udh8First) => "smpp multipart udh8, receipt on first",
            Kind::SmppMulti(Multi::Udh16Every) => "smpp multipart udh16, receipt on every part",
            Kind::SmppMulti(Multi::SarLast) => "smpp multipart sar, receipt on last",
            Kind::SmppMulti(Multi::Ucs2Every) => "smpp multipart ucs2, receipt on every part",
            Kind::SmppReject => "smpp to the reject class",
            Kind::HttpShort => "http short",
            Kind::HttpLong => "http long",
            Kind::HttpUcs2 => "http ucs2",
            Kind::HttpReject => "http to the reject class",
        }
    }
}

pub fn destination(key: u64, kind: Kind) -> String {
    let class = if kind.reject_class() { 9 } else { 1 };
    format!("44{class}{key:09}")
}

/// The key a destination was made from.
pub fn key_of(destination: &str) -> Option<u64> {
    let digits = destination.strip_prefix("44")?;
    if digits.len() != 10 || !matches!(digits.as_bytes()[0], b'1' | b'9') {
        return None;
    }
    digits[1..].parse().ok()
}

const LATIN: &str = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor \
incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation \
ullamco laboris nisi ut aliquip ex ea commodo consequat. Duis aute irure dolor in reprehenderit in \
voluptate velit esse cillum dolore eu fugiat nulla pariatur. Excepteur sint occaecat cupidatat non \
proident, sunt in culpa qui officia deserunt mollit anim id est laborum.";

const CYRILLIC: &str = "Съешь же ещё этих мягких французских булок да выпей чаю. В чащах юга жил бы \
цитрус, да, но фальшивый экземпляр. Широкая электрификация южных губерний даст мощный толчок \
подъёму сельского хозяйства.";

fn prefix_chars(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// The text of message `key` (unique per key, so a duplicate is recognised by content too).
pub fn text(key: u64, kind: Kind) -> String {
    match kind {
        Kind::SmppGsm => format!("soak {key} smpp gsm single, the quick brown fox"),
        Kind::SmppUcs2 => format!("soak {key} юникод, привет"),
        Kind::SmppGsmNoDlr => format!("soak {key} smpp without a receipt"),
        Kind::SmppMulti(Multi::Ucs2Every) => format!("soak {key} {}", prefix_chars(CYRILLIC, 170)),
        Kind::SmppMulti(_) => format!("soak {key} {}", prefix_chars(LATIN, 380)),
        Kind::SmppReject => format!("soak {key} smpp reject class"),
        Kind::HttpShort => format!("soak {key} http short"),
        Kind::HttpLong => format!("soak {key} http {}", prefix_chars(LATIN, 250)),
        Kind::HttpUcs2 => format!("soak {key} http привет"),
        Kind::HttpReject => format!("soak {key} http reject class"),
    }
}

/// One submitted part (one submit_sm, or the one HTTP request).
#[derive(Debug, Clone)]
pub struct Part {
    /// The id the gateway acknowledged it with.
    pub id: Option<String>,
    pub wants_receipt: bool,
}

/// One message.
#[derive(Debug, Clone)]
pub struct Msg {
    pub kind: Kind,
    /// Which client sent it (for the report).
    pub client: &'static str,
    pub parts: Vec<Part>,
    pub first_ack: Option<Instant>,
    pub last_ack: Option<Instant>,
    /// A multipart message whose missing parts were given up on.
    pub abandoned: bool,
}

impl Msg {
    pub fn acked(&self) -> bool {
        self.parts.iter().all(|p| p.id.is_some())
    }

    pub fn any_acked(&self) -> bool {
        self.parts.iter().any(|p| p.id.is_some())
    }

    /// Acknowledged parts that asked for a receipt: the receipts this message is owed.
    pub fn owed_ids(&self) -> impl Iterator<Item = &str> {
        self.parts
            .iter()
            .filter(|p| p.wants_receipt)
            .filter_map(|p| p.id.as_deref())
    }
}

/// What came back for one id.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    pub count: u32,
    /// The `stat:` of each receipt, in arrival order.
    pub states: Vec<String>,
    /// When the first one arrived.
    pub first_at: Option<Instant>,
}

/// Everything sent and every SMPP receipt received.
#[derive(Debug, Default)]
pub struct Ledger {
    msgs: Vec<Msg>,
    /// Acknowledged id → key.
    by_id: HashMap<String, u64>,
    /// SMPP receipts by the id they report on.
    smpp_receipts: HashMap<String, Seen>,
    smpp_receipts_total: u64,
    smpp_receipts_without_id: u64,
}

impl Ledger {
    /// Registers a message about to be sent; its key.
    pub fn add(&mut self, kind: Kind, client: &'static str, wants_receipt: &[bool]) -> u64 {
        let key = self.msgs.len() as u64;
        self.msgs.push(Msg {
            kind,
            client,
            parts: wants_receipt
                .iter()
                .map(|w| Part {
                    id: None,
                    wants_receipt: *w,
                })
                .collect(),
            first_ack: None,
            last_ack: None,
            abandoned: false,
        });
        key
    }

    /// Part `part` of `key` was acknowledged with `id`.
    pub fn ack(&mut self, key: u64, part: usize, id: &str, at: Instant) {
        let Some(msg) = self.msgs.get_mut(key as usize) else {
            return;
        };
        let Some(p) = msg.parts.get_mut(part) else {
            return;
        };
        p.id = Some(id.to_owned());
        msg.first_ack.get_or_insert(at);
        msg.last_ack = Some(at);
        self.by_id.insert(id.to_owned(), key);
    }

    pub fn abandon(&mut self, key: u64) {
        if let Some(msg) = self.msgs.get_mut(key as usize) {
            msg.abandoned = true;
        }
    }

    pub fn smpp_receipt(&mut self, id: Option<&str>, state: &str, at: Instant) {
        self.smpp_receipts_total += 1;
        match id {
            Some(id) => {
                let seen = self.smpp_receipts.entry(id.to_owned()).or_default();
                seen.count += 1;
                seen.states.push(state.to_owned());
                seen.first_at.get_or_insert(at);
            }
            None => self.smpp_receipts_without_id += 1,
        }
    }

    pub fn len(&self) -> usize {
        self.msgs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }

    pub fn smpp_receipts_total(&self) -> u64 {
        self.smpp_receipts_total
    }

    /// Acknowledged messages so far (SMPP, HTTP).
    pub fn acked_counts(&self) -> (u64, u64) {
        let mut smpp = 0;
        let mut http = 0;
        for m in self.msgs.iter().filter(|m| m.acked()) {
            if m.kind.is_http() {
                http += 1;
            } else {
                smpp += 1;
            }
        }
        (smpp, http)
    }
}

/// An HTTP callback as the callback sink recorded it (2xx answers only).
#[derive(Debug, Clone)]
pub struct CallbackSeen {
    pub id: String,
    pub status: String,
    pub at: Instant,
}

/// Per-kind figures.
#[derive(Debug, Clone, Copy, Default)]
pub struct KindFigures {
    pub sent: u64,
    pub acked: u64,
    pub delivered: u64,
    pub rejected: u64,
    pub expired: u64,
    pub lost: u64,
}

/// The reckoning.
#[derive(Debug, Clone, Default)]
pub struct Evaluation {
    pub messages_sent: u64,
    pub messages_acked: u64,
    pub smpp_acked: u64,
    pub http_acked: u64,
    pub parts_acked: u64,
    /// Multipart messages with some parts acknowledged, given up on.
    pub partial_abandoned: u64,
    /// Multipart messages with some parts acknowledged, still being completed.
    pub partial_open: u64,
    /// Acknowledged messages that reached the SMSC at least once.
    pub delivered: u64,
    /// Acknowledged messages that reached the SMSC more than once, and the extra copies.
    pub duplicated_messages: u64,
    pub duplicate_copies: u64,
    /// Reject-class messages that ended with a REJECTD receipt instead.
    pub rejected_as_expected: u64,
    /// Multipart messages whose parts spanned the multipart expiry and ended EXPIRED.
    pub expired_as_expected: u64,
    /// Acknowledged, not at the SMSC, no legitimate failure: a lost message.
    pub lost: u64,
    pub lost_examples: Vec<String>,
    /// Reached the SMSC with another text.
    pub text_mismatches: u64,
    pub text_mismatch_examples: Vec<String>,
    pub receipts_owed: u64,
    pub receipts_owed_smpp: u64,
    pub receipts_owed_http: u64,
    pub receipts_delivered: u64,
    pub receipts_missing: u64,
    pub receipts_missing_smpp: u64,
    pub receipts_missing_http: u64,
    pub missing_receipt_examples: Vec<String>,
    /// Ids that got more than one receipt, and the extra receipts.
    pub receipt_duplicated_ids: u64,
    pub receipt_duplicate_copies: u64,
    /// Receipts with a state the message's fate does not explain.
    pub wrong_states: u64,
    pub wrong_state_examples: Vec<String>,
    /// Receipt states seen (first receipt per owed id).
    pub states: BTreeMap<String, u64>,
    /// Receipts for ids the soak never saw acknowledged (their answer was lost to a kill).
    pub receipts_for_unacked: u64,
    /// SMSC messages for messages never acknowledged (stored, then the answer was lost).
    pub delivered_unacked: u64,
    /// SMSC messages the soak cannot place.
    pub smsc_unknown: u64,
    pub smpp_receipts_total: u64,
    pub callbacks_total: u64,
    /// From the (last part's) acknowledgement to the first receipt, microseconds.
    pub receipt_latency_smpp: Histogram,
    pub receipt_latency_http: Histogram,
    pub by_kind: BTreeMap<Kind, KindFigures>,
}

const EXAMPLES: usize = 10;

fn push_example(list: &mut Vec<String>, line: impl FnOnce() -> String) {
    if list.len() < EXAMPLES {
        list.push(line());
    }
}

impl Evaluation {
    /// Nothing outstanding: every acknowledged message and receipt accounted for.
    pub fn complete(&self) -> bool {
        self.lost == 0 && self.receipts_missing == 0 && self.partial_open == 0
    }

    /// The per-kind table.
    pub fn kind_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "  {:<44} {:>8} {:>8} {:>9} {:>8} {:>7} {:>5}",
            "kind", "sent", "acked", "delivered", "rejected", "expired", "lost"
        );
        for (kind, f) in &self.by_kind {
            let _ = writeln!(
                out,
                "  {:<44} {:>8} {:>8} {:>9} {:>8} {:>7} {:>5}",
                kind.name(),
                f.sent,
                f.acked,
                f.delivered,
                f.rejected,
                f.expired,
                f.lost
            );
        }
        out
    }
}

/// Reckons `ledger` against the SMSC's completed messages and the callbacks received.
/// `expiry` is the gateway's multipart expiry: a multipart message whose first and last
/// acknowledged parts are further apart than most of it may legitimately end EXPIRED.
pub fn evaluate(ledger: &Ledger, smsc: &[SmscMessage], callbacks: &[CallbackSeen], expiry: Duration) -> Evaluation {
    let mut e = Evaluation {
        smpp_receipts_total: ledger.smpp_receipts_total,
        callbacks_total: callbacks.len() as u64,
        ..Evaluation::default()
    };

    // SMSC copies per key, with their texts.
    let mut at_smsc: HashMap<u64, Vec<&str>> = HashMap::new();
    for m in smsc {
        match key_of(&m.destination) {
            Some(key) if (key as usize) < ledger.msgs.len() => {
                at_smsc.entry(key).or_default().push(m.text.as_str());
            }
            _ => e.smsc_unknown += 1,
        }
    }

    let mut http_receipts: HashMap<&str, Seen> = HashMap::new();
    for c in callbacks {
        let seen = http_receipts.entry(c.id.as_str()).or_default();
        seen.count += 1;
        seen.states.push(c.status.clone());
        seen.first_at = Some(seen.first_at.map_or(c.at, |t| t.min(c.at)));
    }

    let span_limit = expiry.mul_f64(0.8);
    for (key, msg) in ledger.msgs.iter().enumerate() {
        let key = key as u64;
        let figures = e.by_kind.entry(msg.kind).or_default();
        figures.sent += 1;
        e.messages_sent += 1;
        let copies = at_smsc.get(&key);
        let receipts = |id: &str| -> Option<&Seen> {
            if msg.kind.is_http() {
                http_receipts.get(id)
            } else {
                ledger.smpp_receipts.get(id)
            }
        };
        if !msg.any_acked() {
            if copies.is_some() {
                e.delivered_unacked += 1;
            }
            continue;
        }
        let acked = msg.acked();
        let spans_expiry = match (msg.first_ack, msg.last_ack) {
            (Some(a), Some(b)) => b.saturating_duration_since(a) >= span_limit,
            _ => false,
        };
        let states: Vec<&str> = msg
            .owed_ids()
            .filter_map(receipts)
            .flat_map(|s| s.states.iter().map(String::as_str))
            .collect();
        let rejected = states.contains(&"REJECTD");
        let expired = states.contains(&"EXPIRED");

        // What the message's fate allows its receipts to say.
        let (delivered_ok, failed_ok) = if !acked {
            // Parts of an incomplete group: it expires at the gateway.
            e.partial_abandoned += u64::from(msg.abandoned);
            e.partial_open += u64::from(!msg.abandoned);
            (false, "EXPIRED")
        } else {
            e.messages_acked += 1;
            figures.acked += 1;
            if msg.kind.is_http() {
                e.http_acked += 1;
            } else {
                e.smpp_acked += 1;
            }
            match copies {
                Some(texts) => {
                    e.delivered += 1;
                    figures.delivered += 1;
                    if texts.len() > 1 {
                        e.duplicated_messages += 1;
                        e.duplicate_copies += texts.len() as u64 - 1;
                    }
                    let expected = text(key, msg.kind);
                    if let Some(other) = texts.iter().find(|t| **t != expected) {
                        e.text_mismatches += 1;
                        push_example(&mut e.text_mismatch_examples, || {
                            format!("key {key} ({}): sent {expected:?}, SMSC got {other:?}", msg.kind.name())
                        });
                    }
                }
                None if msg.kind.reject_class() && rejected => {
                    e.rejected_as_expected += 1;
                    figures.rejected += 1;
                }
                None if matches!(msg.kind, Kind::SmppMulti(_)) && spans_expiry && expired => {
                    e.expired_as_expected += 1;
                    figures.expired += 1;
                }
                None => {
                    e.lost += 1;
                    figures.lost += 1;
                    push_example(&mut e.lost_examples, || {
                        format!(
                            "key {key} ({}, from {}) to {}: ids {:?}, receipts {:?}",
                            msg.kind.name(),
                            msg.client,
                            destination(key, msg.kind),
                            msg.parts
                                .iter()
                                .map(|p| p.id.as_deref().unwrap_or("-"))
                                .collect::<Vec<_>>(),
                            states
                        )
                    });
                }
            }
            let failed_ok = if msg.kind.reject_class() {
                "REJECTD"
            } else if matches!(msg.kind, Kind::SmppMulti(_)) && spans_expiry {
                "EXPIRED"
            } else {
                ""
            };
            (true, failed_ok)
        };
        e.parts_acked += msg.parts.iter().filter(|p| p.id.is_some()).count() as u64;

        for id in msg.owed_ids() {
            e.receipts_owed += 1;
            if msg.kind.is_http() {
                e.receipts_owed_http += 1;
            } else {
                e.receipts_owed_smpp += 1;
            }
            match receipts(id) {
                Some(seen) => {
                    e.receipts_delivered += 1;
                    if let (Some(first), Some(acked_at)) = (seen.first_at, msg.last_ack) {
                        let latency = first.saturating_duration_since(acked_at);
                        if msg.kind.is_http() {
                            e.receipt_latency_http.record_duration(latency);
                        } else {
                            e.receipt_latency_smpp.record_duration(latency);
                        }
                    }
                    if seen.count > 1 {
                        e.receipt_duplicated_ids += 1;
                        e.receipt_duplicate_copies += u64::from(seen.count - 1);
                    }
                    if let Some(first) = seen.states.first() {
                        *e.states.entry(first.clone()).or_default() += 1;
                    }
                    let bad = seen.states.iter().find(|s| {
                        let s = s.as_str();
                        !((delivered_ok && s == "DELIVRD") || (!failed_ok.is_empty() && s == failed_ok))
                    });
                    if let Some(bad) = bad {
                        e.wrong_states += 1;
                        push_example(&mut e.wrong_state_examples, || {
                            format!(
                                "key {key} ({}) id {id}: {bad} (receipts {:?}, at the SMSC {} times)",
                                msg.kind.name(),
                                seen.states,
                                copies.map_or(0, Vec::len)
                            )
                        });
                    }
                }
                None => {
                    e.receipts_missing += 1;
                    if msg.kind.is_http() {
                        e.receipts_missing_http += 1;
                    } else {
                        e.receipts_missing_smpp += 1;
                    }
                    push_example(&mut e.missing_receipt_examples, || {
                        format!(
                            "key {key} ({}, from {}) id {id}: no receipt (at the SMSC {} times)",
                            msg.kind.name(),
                            msg.client,
                            copies.map_or(0, Vec::len)
                        )
                    });
                }
            }
        }
    }

    e.receipts_for_unacked = ledger
        .smpp_receipts
        .keys()
        .filter(|id| !ledger.by_id.contains_key(*id))
        .count() as u64
        + http_receipts
            .keys()
            .filter(|id| !ledger.by_id.contains_key(**id))
            .count() as u64
        + ledger.smpp_receipts_without_id;
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smsc_message(key: u64, kind: Kind) -> SmscMessage {
        let now = Instant::now();
        SmscMessage {
            system_id: "sendium".into(),
            source: SMPP_SOURCE.into(),
            destination: destination(key, kind),
            text: text(key, kind),
            user_data: Vec::new(),
            data_coding: 0,
            parts: 1,
            reference: None,
            message_ids: vec!["X".into()],
            registered_delivery: vec![1],
            first_arrival: now,
            completed_at: now,
        }
    }

    #[test]
    fn destinations_map_back() {
        assert_eq!(destination(42, Kind::SmppGsm), "441000000042");
        assert_eq!(key_of("441000000042"), Some(42));
        assert_eq!(key_of(&destination(7, Kind::HttpReject)), Some(7));
        assert!(destination(7, Kind::HttpReject).starts_with(REJECT_PREFIX));
        assert_eq!(key_of("4470000"), None);
    }

    #[test]
    fn reckoning() {
        let now = Instant::now();
        let mut l = Ledger::default();
        // 0: delivered with its receipt; 1: lost; 2: rejected as expected; 3: duplicated,
        // receipt missing; 4: never acknowledged but delivered.
        for kind in [
            Kind::SmppGsm,
            Kind::SmppGsm,
            Kind::SmppReject,
            Kind::SmppGsm,
            Kind::SmppGsm,
        ] {
            l.add(kind, "t", &[true]);
        }
        for key in 0..4 {
            l.ack(key, 0, &format!("id{key}"), now);
        }
        l.smpp_receipt(Some("id0"), "DELIVRD", now);
        l.smpp_receipt(Some("id1"), "DELIVRD", now);
        l.smpp_receipt(Some("id2"), "REJECTD", now);
        l.smpp_receipt(Some("id9"), "DELIVRD", now);
        let smsc = vec![
            smsc_message(0, Kind::SmppGsm),
            smsc_message(3, Kind::SmppGsm),
            smsc_message(3, Kind::SmppGsm),
            smsc_message(4, Kind::SmppGsm),
        ];
        let e = evaluate(&l, &smsc, &[], Duration::from_secs(60));
        assert_eq!(e.messages_acked, 4);
        assert_eq!(e.delivered, 2);
        assert_eq!(e.lost, 1, "{:?}", e.lost_examples);
        assert_eq!(e.rejected_as_expected, 1);
        assert_eq!(e.duplicated_messages, 1);
        assert_eq!(e.duplicate_copies, 1);
        assert_eq!(e.receipts_owed, 4);
        assert_eq!(e.receipts_missing, 1);
        assert_eq!(e.delivered_unacked, 1);
        assert_eq!(e.receipts_for_unacked, 1);
        assert_eq!(e.wrong_states, 0);
        assert_eq!(e.receipt_latency_smpp.count(), 3);
        assert!(!e.complete());
    }

    #[test]
    fn failure_receipt_for_a_normal_message_is_wrong() {
        let mut l = Ledger::default();
        l.add(Kind::HttpShort, "h", &[true]);
        l.ack(0, 0, "h0", Instant::now());
        let callbacks = vec![CallbackSeen {
            id: "h0".into(),
            status: "UNDELIV".into(),
            at: Instant::now(),
        }];
        let e = evaluate(
            &l,
            &[smsc_message(0, Kind::HttpShort)],
            &callbacks,
            Duration::from_secs(60),
        );
        assert_eq!(e.wrong_states, 1);
        assert_eq!(e.receipts_missing, 0);
    }
}
