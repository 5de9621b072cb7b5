//! The values the file DLR store keeps: records in [envelopes](crate::envelope) under
//! their own [`RecordKind`](crate::envelope::RecordKind)s, index values and keys in
//! fixed, big-endian layouts (so byte order is the order an index needs).
//!
//! Fields added later to a record must be `#[serde(default)]` (a new minor version).
//! Field names are one or two letters: the file keeps every resolved branch for the
//! retention window (72 h by default), so bytes per record are disk and page cache, and
//! shorter maps decode faster. The contract's [`ReceiptTarget`] and [`ReceiptOutcome`]
//! are stored through short-named mirrors ([`StoredTarget`], [`StoredOutcome`]), so a
//! change to the contract types does not silently change this file format.

use serde::{Deserialize, Serialize};

use crate::dlr::{DeliveryContent, DlrState, ProgressReport, ReceiptOutcome, ReceiptTarget, ReplyPath};
use crate::ids::{MessageId, Timestamp, UnitId};
use crate::inbound::{InboundGroup, InboundGroupKey, InboundMessage, InboundPart};
use crate::record::Address;

/// A [`ReceiptOutcome`] as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredOutcome {
    #[serde(rename = "s")]
    pub state: DlrState,
    #[serde(rename = "e")]
    pub error: String,
    #[serde(rename = "t")]
    pub done_at: Timestamp,
}

impl From<ReceiptOutcome> for StoredOutcome {
    fn from(o: ReceiptOutcome) -> Self {
        Self {
            state: o.state,
            error: o.error,
            done_at: o.done_at,
        }
    }
}

impl From<StoredOutcome> for ReceiptOutcome {
    fn from(o: StoredOutcome) -> Self {
        Self {
            state: o.state,
            error: o.error,
            done_at: o.done_at,
        }
    }
}

/// A [`ReceiptTarget`] as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredTarget {
    #[serde(rename = "i")]
    pub submit_id: MessageId,
    #[serde(rename = "a")]
    pub account: String,
    #[serde(rename = "r")]
    pub reply: ReplyPath,
    #[serde(rename = "s")]
    pub source: Address,
    #[serde(rename = "d")]
    pub destination: Address,
    #[serde(rename = "t")]
    pub submitted_at: Timestamp,
    #[serde(rename = "f")]
    pub failure_only: bool,
}

impl From<ReceiptTarget> for StoredTarget {
    fn from(t: ReceiptTarget) -> Self {
        Self {
            submit_id: t.submit_id,
            account: t.account,
            reply: t.reply,
            source: t.source,
            destination: t.destination,
            submitted_at: t.submitted_at,
            failure_only: t.failure_only,
        }
    }
}

impl From<StoredTarget> for ReceiptTarget {
    fn from(t: StoredTarget) -> Self {
        Self {
            submit_id: t.submit_id,
            account: t.account,
            reply: t.reply,
            source: t.source,
            destination: t.destination,
            submitted_at: t.submitted_at,
            failure_only: t.failure_only,
        }
    }
}

/// One provider part of a tracked branch: its canonical provider id and, once received,
/// its final outcome (accepted once).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PartState {
    #[serde(rename = "k")]
    pub key: String,
    #[serde(rename = "o")]
    pub outcome: Option<StoredOutcome>,
}

/// A branch's correlation state, stored under its [`TrackKey`].
///
/// Kept after resolution until `expires_at`, together with its correlations: a late
/// duplicate receipt then still finds its branch and is answered `Duplicate`, and a
/// repeated handoff of a resolved branch is recognised and ignored. Resolution strips it
/// to what that needs (destination, provider ids, expiry): the targets live on in the
/// deliveries, the outcomes are no longer needed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TrackRecord {
    /// Destination the current provider ids belong to.
    #[serde(rename = "d")]
    pub destination: String,
    /// Expected provider parts, in part order.
    #[serde(rename = "p")]
    pub parts: Vec<PartState>,
    /// `(destination, provider id)` of earlier submissions of this branch that a
    /// resubmission replaced. Their correlations still point here (a receipt for them is
    /// recognised, not orphaned) and are dropped with the track.
    #[serde(rename = "x", default, skip_serializing_if = "Vec::is_empty")]
    pub stale: Vec<(String, String)>,
    /// Submissions owed a receipt; emptied at resolution (the deliveries hold them then).
    #[serde(rename = "t", default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<StoredTarget>,
    #[serde(rename = "f", default, skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<StoredOutcome>,
    /// Absolute: handed-off time plus retention, so a restart does not move it.
    #[serde(rename = "e")]
    pub expires_at: Timestamp,
    /// The message's state is decided and its deliveries were created.
    #[serde(rename = "r")]
    pub resolved: bool,
}

impl TrackRecord {
    /// The whole message's state once known: the first final failure, or DELIVRD when
    /// every provider part is delivered (the memory store's rule, exactly).
    pub(crate) fn resolution(&self) -> Option<StoredOutcome> {
        if let Some(f) = &self.first_failure {
            return Some(f.clone());
        }
        let mut done_at = Timestamp(0);
        for part in &self.parts {
            let o = part.outcome.as_ref()?;
            done_at = done_at.max(o.done_at);
        }
        Some(StoredOutcome {
            state: DlrState::Delivered,
            error: "000".to_string(),
            done_at,
        })
    }

    /// Every `(destination, provider id)` whose correlation may point at this track.
    pub(crate) fn correlated(&self) -> impl Iterator<Item = (&str, &str)> {
        self.parts
            .iter()
            .map(|p| (self.destination.as_str(), p.key.as_str()))
            .chain(self.stale.iter().map(|(d, k)| (d.as_str(), k.as_str())))
    }
}

/// A provider receipt that matched no correlation (yet), stored under its
/// [`corr_key`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OrphanRecord {
    #[serde(rename = "o")]
    pub outcome: StoredOutcome,
    #[serde(rename = "e")]
    pub expires_at: Timestamp,
}

/// The record of a pending delivery: what it delivers. Stored after a
/// [`DeliveryHeader`] in the `deliveries` value (see [`delivery_value`]).
///
/// Exactly one of `outcome` and `inbound` is set. A receipt's record is encoded as it
/// was before inbound messages existed (`inbound` is left out), and records written
/// then decode as receipts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DeliveryRecord {
    #[serde(rename = "t")]
    pub target: StoredTarget,
    /// A receipt's outcome.
    #[serde(rename = "o", default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<StoredOutcome>,
    /// An inbound message (minor version 1).
    #[serde(rename = "m", default, skip_serializing_if = "Option::is_none")]
    pub inbound: Option<Box<StoredInbound>>,
    /// A Kannel progress report (minor version 3).
    #[serde(rename = "p", default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<StoredProgress>,
    #[serde(rename = "c")]
    pub created_at: Timestamp,
    #[serde(rename = "e")]
    pub expires_at: Timestamp,
}

impl DeliveryRecord {
    pub(crate) fn new(
        target: StoredTarget,
        content: DeliveryContent,
        created_at: Timestamp,
        expires_at: Timestamp,
    ) -> Self {
        let (outcome, inbound, progress) = match content {
            DeliveryContent::Receipt(o) => (Some(o.into()), None, None),
            DeliveryContent::Inbound(m) => (None, Some(Box::new(StoredInbound::from(*m))), None),
            DeliveryContent::Progress(p) => (None, None, Some(p.into())),
        };
        Self {
            target,
            outcome,
            inbound,
            progress,
            created_at,
            expires_at,
        }
    }

    /// What it delivers; `None` for a record with none (or several) of them, which no
    /// build writes.
    pub(crate) fn content(&self) -> Option<DeliveryContent> {
        match (&self.outcome, &self.inbound, &self.progress) {
            (Some(o), None, None) => Some(DeliveryContent::Receipt(o.clone().into())),
            (None, Some(m), None) => Some(DeliveryContent::Inbound(Box::new(InboundMessage::from((**m).clone())))),
            (None, None, Some(p)) => Some(DeliveryContent::Progress(p.clone().into())),
            _ => None,
        }
    }
}

/// A [`ProgressReport`] as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredProgress {
    #[serde(rename = "k")]
    pub kind: u8,
    #[serde(rename = "x")]
    pub text: String,
    #[serde(rename = "s")]
    pub smsc: String,
    #[serde(rename = "f")]
    pub foreign_id: String,
    #[serde(rename = "t")]
    pub at: Timestamp,
}

impl From<ProgressReport> for StoredProgress {
    fn from(p: ProgressReport) -> Self {
        Self {
            kind: p.kind,
            text: p.text,
            smsc: p.smsc,
            foreign_id: p.foreign_id,
            at: p.at,
        }
    }
}

impl From<StoredProgress> for ProgressReport {
    fn from(p: StoredProgress) -> Self {
        Self {
            kind: p.kind,
            text: p.text,
            smsc: p.smsc,
            foreign_id: p.foreign_id,
            at: p.at,
        }
    }
}

/// An [`InboundMessage`] as stored (a delivery's, or a multipart part's).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredInbound {
    #[serde(rename = "i")]
    pub id: MessageId,
    #[serde(rename = "f")]
    pub from_destination: String,
    #[serde(rename = "s")]
    pub source: Address,
    #[serde(rename = "d")]
    pub destination: Address,
    #[serde(rename = "c")]
    pub data_coding: u8,
    #[serde(rename = "p", with = "serde_bytes")]
    pub payload: Vec<u8>,
    #[serde(rename = "t")]
    pub received_at: Timestamp,
    #[serde(rename = "r", default, skip_serializing_if = "String::is_empty")]
    pub route: String,
    #[serde(rename = "x", default, skip_serializing_if = "is_false")]
    pub incomplete: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl From<InboundMessage> for StoredInbound {
    fn from(m: InboundMessage) -> Self {
        Self {
            id: m.id,
            from_destination: m.from_destination,
            source: m.source,
            destination: m.destination,
            data_coding: m.data_coding,
            payload: m.payload,
            received_at: m.received_at,
            route: m.route,
            incomplete: m.incomplete,
        }
    }
}

impl From<StoredInbound> for InboundMessage {
    fn from(m: StoredInbound) -> Self {
        Self {
            id: m.id,
            from_destination: m.from_destination,
            source: m.source,
            destination: m.destination,
            data_coding: m.data_coding,
            payload: m.payload,
            received_at: m.received_at,
            route: m.route,
            incomplete: m.incomplete,
        }
    }
}

/// An [`InboundGroupKey`] as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredGroupKey {
    #[serde(rename = "f")]
    pub from_destination: String,
    #[serde(rename = "s")]
    pub source: String,
    #[serde(rename = "d")]
    pub destination: String,
    #[serde(rename = "r")]
    pub reference: u16,
    #[serde(rename = "t")]
    pub total: u8,
}

impl From<InboundGroupKey> for StoredGroupKey {
    fn from(k: InboundGroupKey) -> Self {
        Self {
            from_destination: k.from_destination,
            source: k.source,
            destination: k.destination,
            reference: k.reference,
            total: k.total,
        }
    }
}

impl From<StoredGroupKey> for InboundGroupKey {
    fn from(k: StoredGroupKey) -> Self {
        Self {
            from_destination: k.from_destination,
            source: k.source,
            destination: k.destination,
            reference: k.reference,
            total: k.total,
        }
    }
}

/// One part of a multipart inbound group as stored (its key is the group's).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredPart {
    #[serde(rename = "q")]
    pub seq: u8,
    #[serde(rename = "d")]
    pub deadline: Timestamp,
    #[serde(rename = "m")]
    pub message: StoredInbound,
}

/// A multipart inbound group, stored under its number in `inbound_groups`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct GroupRecord {
    #[serde(rename = "k")]
    pub key: StoredGroupKey,
    /// The first part's deadline.
    #[serde(rename = "d")]
    pub deadline: Timestamp,
    #[serde(rename = "c", default, skip_serializing_if = "is_false")]
    pub closed: bool,
    /// By `seq`.
    #[serde(rename = "p")]
    pub parts: Vec<StoredPart>,
}

impl From<InboundGroup> for GroupRecord {
    fn from(g: InboundGroup) -> Self {
        Self {
            key: g.key.into(),
            deadline: g.deadline,
            closed: g.closed,
            parts: g
                .parts
                .into_iter()
                .map(|p| StoredPart {
                    seq: p.seq,
                    deadline: p.deadline,
                    message: p.message.into(),
                })
                .collect(),
        }
    }
}

impl GroupRecord {
    pub(crate) fn into_group(self, no: u64) -> InboundGroup {
        let key: InboundGroupKey = self.key.into();
        InboundGroup {
            no,
            parts: self
                .parts
                .into_iter()
                .map(|p| InboundPart {
                    key: key.clone(),
                    seq: p.seq,
                    deadline: p.deadline,
                    message: p.message.into(),
                })
                .collect(),
            key,
            deadline: self.deadline,
            closed: self.closed,
        }
    }
}

/// `inbound_open` key: the group key's stable bytes (see [`InboundGroupKey::to_bytes`]).
pub(crate) fn inbound_key(k: &InboundGroupKey) -> Vec<u8> {
    k.to_bytes()
}

/// Identity of a tracked branch: unit id (16 bytes, UUIDv7) then branch, big-endian.
pub(crate) type TrackKey = [u8; 18];

pub(crate) fn track_key(unit: UnitId, branch: u16) -> TrackKey {
    let mut k = [0u8; 18];
    k[..16].copy_from_slice(&unit.to_bytes());
    k[16..].copy_from_slice(&branch.to_be_bytes());
    k
}

pub(crate) fn track_unit(key: &TrackKey) -> UnitId {
    let mut id = [0u8; 16];
    id.copy_from_slice(&key[..16]);
    MessageId::from_bytes(id)
}

/// `track_expiry` key: expiry (ms, big-endian) then the track key, so the first keys are
/// the tracks that expire first.
pub(crate) fn track_expiry_key(expires_at: Timestamp, key: &TrackKey) -> [u8; 26] {
    let mut k = [0u8; 26];
    k[..8].copy_from_slice(&expires_at.0.to_be_bytes());
    k[8..].copy_from_slice(key);
    k
}

pub(crate) fn track_of_expiry_key(k: &[u8; 26]) -> TrackKey {
    let mut t = [0u8; 18];
    t.copy_from_slice(&k[8..]);
    t
}

/// Correlation (and orphan) key: the destination's length (u32, big-endian), the
/// destination, the canonical provider id. The length prefix keeps `("a", "bc")` and
/// `("ab", "c")` apart; a receipt looks its key up directly (no scan).
pub(crate) fn corr_key(destination: &str, provider_key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + destination.len() + provider_key.len());
    k.extend_from_slice(&u32::try_from(destination.len()).unwrap_or(u32::MAX).to_be_bytes());
    k.extend_from_slice(destination.as_bytes());
    k.extend_from_slice(provider_key.as_bytes());
    k
}

/// `orphan_expiry` key: expiry (ms, big-endian) then the orphan's [`corr_key`].
pub(crate) fn orphan_expiry_key(expires_at: Timestamp, corr: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + corr.len());
    k.extend_from_slice(&expires_at.0.to_be_bytes());
    k.extend_from_slice(corr);
    k
}

/// `due` key: the due time (ms) then the delivery id, both big-endian.
pub(crate) fn due_key(at: Timestamp, id: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&at.0.to_be_bytes());
    k[8..].copy_from_slice(&id.to_be_bytes());
    k
}

pub(crate) fn due_key_id(k: &[u8; 16]) -> u64 {
    let mut id = [0u8; 8];
    id.copy_from_slice(&k[8..]);
    u64::from_be_bytes(id)
}

/// The mutable, per-attempt state of a delivery and what its removal needs, at the start
/// of its `deliveries` value. Fixed layout, big-endian:
///
/// ```text
/// 0..4    attempt (u32)
/// 4..12   due time, ms: when it is next claimable (first due, retry time, or lease end)
/// 12..20  lease end, ms (0 = not leased)
/// 20..28  expiry, ms: given up (dead) from then on
/// 28      0 = HTTP; 1 = SMPP; 2 = SMPP with an smpp_by_account entry
/// 29..33  length n of the account name (u32)
/// 33..    the account name (n bytes), then the DeliveryRecord envelope
/// ```
///
/// Why one value and not a state table beside the records: a claim is then one lookup
/// that rewrites the header in place, and a finish is one removal that needs no
/// decoding (the header names the index entries to drop), which halves the B-tree
/// operations per receipt delivered. The envelope keeps its own CRC; the header is
/// checked structurally when read.
///
/// An SMPP delivery enters `smpp_by_account` only when an attempt ends in a retry (the
/// correlator parks receipts for unbound accounts that way): only then can it be idle and
/// not yet due, which is all `wake_account` changes. A receipt delivered at its first
/// attempt — the usual case — never touches that index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeliveryHeader {
    pub attempt: u32,
    pub due_at: Timestamp,
    pub leased_until: Option<Timestamp>,
    pub expires_at: Timestamp,
    /// An SMPP delivery with an `smpp_by_account` entry.
    pub indexed: bool,
}

const HEADER_FIXED: usize = 33;

impl DeliveryHeader {
    /// Overwrite the mutable fields at the start of a stored value.
    pub(crate) fn write_into(self, value: &mut [u8]) {
        if value.len() >= 28 {
            value[..4].copy_from_slice(&self.attempt.to_be_bytes());
            value[4..12].copy_from_slice(&self.due_at.0.to_be_bytes());
            value[12..20].copy_from_slice(&self.leased_until.map_or(0, |t| t.0).to_be_bytes());
            value[20..28].copy_from_slice(&self.expires_at.0.to_be_bytes());
        }
        if let Some(kind) = value.get_mut(28)
            && *kind != 0
        {
            *kind = 1 + u8::from(self.indexed);
        }
    }
}

/// A parsed `deliveries` value.
#[derive(Debug)]
pub(crate) struct DeliveryValue<'a> {
    pub header: DeliveryHeader,
    /// The account of an SMPP delivery (its `smpp_by_account` key); `None` for HTTP.
    pub smpp_account: Option<&'a str>,
    /// The [`DeliveryRecord`] envelope.
    pub record: &'a [u8],
}

fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_be_bytes(a)
}

/// Parse a `deliveries` value; `None` when it is malformed (truncated, bad flag or
/// account name).
pub(crate) fn parse_delivery(value: &[u8]) -> Option<DeliveryValue<'_>> {
    let fixed = value.get(..HEADER_FIXED)?;
    let attempt = u32::from_be_bytes([fixed[0], fixed[1], fixed[2], fixed[3]]);
    let lease = be_u64(&fixed[12..20]);
    let header = DeliveryHeader {
        attempt,
        due_at: Timestamp(be_u64(&fixed[4..12])),
        leased_until: (lease != 0).then_some(Timestamp(lease)),
        expires_at: Timestamp(be_u64(&fixed[20..28])),
        indexed: fixed[28] == 2,
    };
    let len = usize::try_from(u32::from_be_bytes([fixed[29], fixed[30], fixed[31], fixed[32]])).ok()?;
    let end = HEADER_FIXED.checked_add(len)?;
    let account = std::str::from_utf8(value.get(HEADER_FIXED..end)?).ok()?;
    let smpp_account = match fixed[28] {
        0 => None,
        1 | 2 => Some(account),
        _ => return None,
    };
    Some(DeliveryValue {
        header,
        smpp_account,
        record: value.get(end..)?,
    })
}

/// Build a `deliveries` value: header, account (SMPP only), record envelope.
pub(crate) fn delivery_value(header: DeliveryHeader, smpp_account: Option<&str>, record: &[u8]) -> Vec<u8> {
    let account = smpp_account.unwrap_or_default();
    let mut v = vec![0u8; HEADER_FIXED];
    header.write_into(&mut v);
    v[28] = match smpp_account {
        None => 0,
        Some(_) => 1 + u8::from(header.indexed),
    };
    v[29..33].copy_from_slice(&u32::try_from(account.len()).unwrap_or(u32::MAX).to_be_bytes());
    v.reserve(account.len() + record.len());
    v.extend_from_slice(account.as_bytes());
    v.extend_from_slice(record);
    v
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::envelope::tests::same_bytes_as_ciborium;
    use crate::envelope::{self, RecordKind};

    fn outcome(state: DlrState) -> StoredOutcome {
        StoredOutcome {
            state,
            error: "045".into(),
            done_at: Timestamp(7),
        }
    }

    fn target() -> StoredTarget {
        StoredTarget {
            submit_id: MessageId::generate(),
            account: "esme1".into(),
            reply: ReplyPath::Http {
                url: "http://127.0.0.1/cb".into(),
            },
            source: Address::new(5, 0, "Sendium"),
            destination: Address::new(1, 1, "447700900123"),
            submitted_at: Timestamp(5),
            failure_only: true,
        }
    }

    #[test]
    fn records_round_trip_in_their_envelopes() {
        let track = TrackRecord {
            destination: "up".into(),
            parts: vec![
                PartState {
                    key: "0A".into(),
                    outcome: None,
                },
                PartState {
                    key: "0B".into(),
                    outcome: Some(outcome(DlrState::Delivered)),
                },
            ],
            stale: vec![("up".into(), "09".into())],
            targets: vec![target()],
            first_failure: Some(outcome(DlrState::Rejected)),
            expires_at: Timestamp(99),
            resolved: false,
        };
        same_bytes_as_ciborium(RecordKind::DlrTrack, &track);
        let bytes = envelope::encode(RecordKind::DlrTrack, &track).unwrap();
        assert_eq!(
            envelope::decode::<TrackRecord>(RecordKind::DlrTrack, &bytes).unwrap(),
            track
        );
        let orphan = OrphanRecord {
            outcome: outcome(DlrState::Expired),
            expires_at: Timestamp(3),
        };
        same_bytes_as_ciborium(RecordKind::DlrOrphan, &orphan);
        let bytes = envelope::encode(RecordKind::DlrOrphan, &orphan).unwrap();
        assert_eq!(
            envelope::decode::<OrphanRecord>(RecordKind::DlrOrphan, &bytes).unwrap(),
            orphan
        );
        let receipt = DeliveryContent::Receipt(outcome(DlrState::Undeliverable).into());
        let message = DeliveryContent::Inbound(Box::new(inbound_message()));
        let progress = DeliveryContent::Progress(crate::dlr::ProgressReport {
            kind: 4,
            text: "id:1 stat:ENROUTE".into(),
            smsc: "up".into(),
            foreign_id: "1a".into(),
            at: Timestamp(5),
        });
        let refused = DeliveryContent::Receipt(outcome(DlrState::Refused).into());
        for content in [receipt, message, progress, refused] {
            let d = DeliveryRecord::new(target(), content.clone(), Timestamp(1), Timestamp(2));
            same_bytes_as_ciborium(RecordKind::DlrDelivery, &d);
            let bytes = envelope::encode(RecordKind::DlrDelivery, &d).unwrap();
            let back = envelope::decode::<DeliveryRecord>(RecordKind::DlrDelivery, &bytes).unwrap();
            assert_eq!(back, d);
            assert_eq!(back.content(), Some(content));
        }
        let group = InboundGroup {
            no: 9,
            key: InboundGroupKey {
                from_destination: "up".into(),
                source: "447700900123".into(),
                destination: "1234".into(),
                reference: 513,
                total: 2,
            },
            deadline: Timestamp(40),
            closed: true,
            parts: vec![InboundPart {
                key: InboundGroupKey {
                    from_destination: "up".into(),
                    source: "447700900123".into(),
                    destination: "1234".into(),
                    reference: 513,
                    total: 2,
                },
                seq: 2,
                deadline: Timestamp(41),
                message: inbound_message(),
            }],
        };
        same_bytes_as_ciborium(RecordKind::DlrInboundGroup, &GroupRecord::from(group.clone()));
        let bytes = envelope::encode(RecordKind::DlrInboundGroup, &GroupRecord::from(group.clone())).unwrap();
        let back = envelope::decode::<GroupRecord>(RecordKind::DlrInboundGroup, &bytes).unwrap();
        assert_eq!(back.into_group(9), group);
    }

    fn inbound_message() -> InboundMessage {
        InboundMessage {
            id: MessageId::generate(),
            from_destination: "up".into(),
            source: Address::new(1, 1, "447700900123"),
            destination: Address::new(0, 1, "1234"),
            data_coding: 8,
            payload: vec![0, 0x48, 0, 0x69],
            received_at: Timestamp(3),
            route: "support".into(),
            incomplete: true,
        }
    }

    /// A delivery record as every build before inbound messages wrote it (minor version
    /// 0, no message field) decodes as that receipt.
    #[test]
    fn a_receipt_record_of_the_earlier_format_decodes_as_a_receipt() {
        #[derive(Serialize)]
        struct EarlierDeliveryRecord {
            #[serde(rename = "t")]
            target: StoredTarget,
            #[serde(rename = "o")]
            outcome: StoredOutcome,
            #[serde(rename = "c")]
            created_at: Timestamp,
            #[serde(rename = "e")]
            expires_at: Timestamp,
        }
        let earlier = EarlierDeliveryRecord {
            target: target(),
            outcome: outcome(DlrState::Delivered),
            created_at: Timestamp(1),
            expires_at: Timestamp(2),
        };
        let bytes = earlier_envelope(&earlier);
        let d = envelope::decode::<DeliveryRecord>(RecordKind::DlrDelivery, &bytes).unwrap();
        assert_eq!(d.target, earlier.target);
        assert_eq!(
            d.content(),
            Some(DeliveryContent::Receipt(outcome(DlrState::Delivered).into()))
        );
        // And a receipt written now is encoded as it was then (bar the minor version).
        let now = DeliveryRecord::new(
            earlier.target.clone(),
            DeliveryContent::Receipt(earlier.outcome.clone().into()),
            Timestamp(1),
            Timestamp(2),
        );
        let mut current = envelope::encode(RecordKind::DlrDelivery, &now).unwrap();
        let vm_at = current.windows(3).position(|w| w == [0x62, b'v', b'm']).unwrap() + 3;
        current[vm_at] = 0;
        let len = current.len();
        current.truncate(len - 4);
        assert_eq!(envelope::seal(current), bytes);
    }

    /// `value` in an envelope of major 1, minor 0, as the builds before inbound messages
    /// wrote delivery records.
    pub(crate) fn earlier_envelope(value: &impl Serialize) -> Vec<u8> {
        use ciborium::Value;
        let Value::Map(fields) = Value::serialized(value).unwrap() else {
            panic!("a record is a map");
        };
        let mut map = vec![
            (Value::Text("v".into()), Value::Integer(1.into())),
            (Value::Text("vm".into()), Value::Integer(0.into())),
        ];
        map.extend(fields);
        let mut bytes = Vec::new();
        ciborium::into_writer(&Value::Map(map), &mut bytes).unwrap();
        envelope::seal(bytes)
    }

    #[test]
    fn fixed_layouts_round_trip_and_sort_by_time() {
        let unit = MessageId::generate();
        let k = track_key(unit, 513);
        assert_eq!(track_unit(&k), unit);
        let e = track_expiry_key(Timestamp(10), &k);
        assert_eq!(track_of_expiry_key(&e), k);
        assert!(track_expiry_key(Timestamp(9), &[0xff; 18]) < e);
        assert!(due_key(Timestamp(1), u64::MAX) < due_key(Timestamp(2), 0));
        assert_eq!(due_key_id(&due_key(Timestamp(3), 4)), 4);
        assert_ne!(corr_key("a", "bc"), corr_key("ab", "c"));
        assert!(orphan_expiry_key(Timestamp(1), &[0xff]) < orphan_expiry_key(Timestamp(2), &[0]));
        for (h, account) in [
            (
                DeliveryHeader {
                    attempt: 3,
                    due_at: Timestamp(1_700_000_000_000),
                    leased_until: Some(Timestamp(1_700_000_030_000)),
                    expires_at: Timestamp(1_700_003_600_000),
                    indexed: true,
                },
                Some("esme1"),
            ),
            (
                DeliveryHeader {
                    attempt: 0,
                    due_at: Timestamp(0),
                    leased_until: None,
                    expires_at: Timestamp(1),
                    indexed: false,
                },
                None,
            ),
        ] {
            let mut v = delivery_value(h, account, b"record");
            let p = parse_delivery(&v).unwrap();
            assert_eq!((p.header, p.smpp_account, p.record), (h, account, b"record".as_slice()));
            let h2 = DeliveryHeader {
                attempt: 9,
                indexed: account.is_some() && !h.indexed,
                ..h
            };
            h2.write_into(&mut v);
            assert_eq!(parse_delivery(&v).unwrap().header, h2);
            for cut in 0..v.len() - 6 {
                assert!(parse_delivery(&v[..cut]).is_none(), "cut at {cut}");
            }
        }
        let mut bad = delivery_value(
            DeliveryHeader {
                attempt: 0,
                due_at: Timestamp(0),
                leased_until: None,
                expires_at: Timestamp(0),
                indexed: false,
            },
            None,
            b"",
        );
        bad[28] = 7;
        assert!(parse_delivery(&bad).is_none());
    }
}
