//! The values the file DLR store keeps: records in [envelopes](crate::envelope) under
//! their own [`RecordKind`](crate::envelope::RecordKind)s, index values and keys in
//! fixed, big-endian layouts (so byte order is the order an index needs).
//!
//! Fields added later to a record must be `#[serde(default)]` (a new minor version).
//! The records embed the contract's [`ReceiptTarget`] and [`ReceiptOutcome`]: a change to
//! those types' serde shape is a change to this file format.

use serde::{Deserialize, Serialize};

use crate::dlr::{DlrState, ReceiptOutcome, ReceiptTarget};
use crate::ids::{MessageId, Timestamp, UnitId};

/// One provider part of a tracked branch: its canonical provider id and, once received,
/// its final outcome (accepted once).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PartState {
    pub key: String,
    pub outcome: Option<ReceiptOutcome>,
}

/// A branch's correlation state, stored under its [`TrackKey`].
///
/// Kept after resolution (with `resolved` set and its targets dropped) until
/// `expires_at`, together with its correlations: a late duplicate receipt then still
/// finds its branch and is answered `Duplicate`, and a repeated handoff of a resolved
/// branch is recognised and ignored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TrackRecord {
    /// Destination the current provider ids belong to.
    pub destination: String,
    /// Expected provider parts, in part order.
    pub parts: Vec<PartState>,
    /// `(destination, provider id)` of earlier submissions of this branch that a
    /// resubmission replaced. Their correlations still point here (a receipt for them is
    /// recognised, not orphaned) and are dropped with the track.
    #[serde(default)]
    pub stale: Vec<(String, String)>,
    /// Submissions owed a receipt; emptied at resolution (the deliveries hold them then).
    pub targets: Vec<ReceiptTarget>,
    pub first_failure: Option<ReceiptOutcome>,
    /// Absolute: handed-off time plus retention, so a restart does not move it.
    pub expires_at: Timestamp,
    /// The message's state is decided and its deliveries were created.
    pub resolved: bool,
}

impl TrackRecord {
    /// The whole message's state once known: the first final failure, or DELIVRD when
    /// every provider part is delivered (the memory store's rule, exactly).
    pub(crate) fn resolution(&self) -> Option<ReceiptOutcome> {
        if let Some(f) = &self.first_failure {
            return Some(f.clone());
        }
        let mut done_at = Timestamp(0);
        for part in &self.parts {
            let o = part.outcome.as_ref()?;
            done_at = done_at.max(o.done_at);
        }
        Some(ReceiptOutcome {
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
    pub outcome: ReceiptOutcome,
    pub expires_at: Timestamp,
}

/// The immutable part of a pending delivery, stored under its delivery id. What changes
/// per attempt lives in [`DeliveryState`], so a claim rewrites 20 bytes, not the target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DeliveryRecord {
    pub target: ReceiptTarget,
    pub outcome: ReceiptOutcome,
    pub created_at: Timestamp,
    pub expires_at: Timestamp,
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

/// For error messages: `unit/branch`.
pub(crate) fn track_name(key: &TrackKey) -> String {
    format!("{}/{}", track_unit(key), u16::from_be_bytes([key[16], key[17]]))
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

/// For error messages: `destination/provider id` (lossy).
pub(crate) fn corr_name(key: &[u8]) -> String {
    let len = key
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .unwrap_or(0);
    let dest = key.get(4..4 + len).unwrap_or_default();
    let id = key.get(4 + len..).unwrap_or_default();
    format!("{}/{}", String::from_utf8_lossy(dest), String::from_utf8_lossy(id))
}

/// `orphan_expiry` key: expiry (ms, big-endian) then the orphan's [`corr_key`].
pub(crate) fn orphan_expiry_key(expires_at: Timestamp, corr: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + corr.len());
    k.extend_from_slice(&expires_at.0.to_be_bytes());
    k.extend_from_slice(corr);
    k
}

/// `due` and `delivery_expiry` key: a time (ms) then the delivery id, both big-endian.
pub(crate) fn time_id_key(at: Timestamp, id: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&at.0.to_be_bytes());
    k[8..].copy_from_slice(&id.to_be_bytes());
    k
}

pub(crate) fn time_id_of(k: &[u8; 16]) -> (Timestamp, u64) {
    let mut at = [0u8; 8];
    let mut id = [0u8; 8];
    at.copy_from_slice(&k[..8]);
    id.copy_from_slice(&k[8..]);
    (Timestamp(u64::from_be_bytes(at)), u64::from_be_bytes(id))
}

/// The mutable, per-attempt state of a delivery, fixed layout (20 bytes, big-endian):
/// attempt (u32), due time (u64 ms), lease end (u64 ms; 0 = not leased).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeliveryState {
    pub attempt: u32,
    /// When it is next claimable: its first due time, a retry time, or its lease end.
    pub due_at: Timestamp,
    pub leased_until: Option<Timestamp>,
}

impl DeliveryState {
    pub(crate) fn to_bytes(self) -> [u8; 20] {
        let mut b = [0u8; 20];
        b[..4].copy_from_slice(&self.attempt.to_be_bytes());
        b[4..12].copy_from_slice(&self.due_at.0.to_be_bytes());
        b[12..].copy_from_slice(&self.leased_until.map_or(0, |t| t.0).to_be_bytes());
        b
    }

    pub(crate) fn from_bytes(b: &[u8; 20]) -> Self {
        let mut attempt = [0u8; 4];
        let mut due = [0u8; 8];
        let mut lease = [0u8; 8];
        attempt.copy_from_slice(&b[..4]);
        due.copy_from_slice(&b[4..12]);
        lease.copy_from_slice(&b[12..]);
        let lease = u64::from_be_bytes(lease);
        Self {
            attempt: u32::from_be_bytes(attempt),
            due_at: Timestamp(u64::from_be_bytes(due)),
            leased_until: (lease != 0).then_some(Timestamp(lease)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dlr::ReplyPath;
    use crate::envelope::{self, RecordKind};
    use crate::record::Address;

    fn outcome(state: DlrState) -> ReceiptOutcome {
        ReceiptOutcome {
            state,
            error: "045".into(),
            done_at: Timestamp(7),
        }
    }

    fn target() -> ReceiptTarget {
        ReceiptTarget {
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
        let bytes = envelope::encode(RecordKind::DlrTrack, &track).unwrap();
        assert_eq!(envelope::decode::<TrackRecord>(RecordKind::DlrTrack, &bytes).unwrap(), track);
        let orphan = OrphanRecord {
            outcome: outcome(DlrState::Expired),
            expires_at: Timestamp(3),
        };
        let bytes = envelope::encode(RecordKind::DlrOrphan, &orphan).unwrap();
        assert_eq!(envelope::decode::<OrphanRecord>(RecordKind::DlrOrphan, &bytes).unwrap(), orphan);
        let d = DeliveryRecord {
            target: target(),
            outcome: outcome(DlrState::Undeliverable),
            created_at: Timestamp(1),
            expires_at: Timestamp(2),
        };
        let bytes = envelope::encode(RecordKind::DlrDelivery, &d).unwrap();
        assert_eq!(envelope::decode::<DeliveryRecord>(RecordKind::DlrDelivery, &bytes).unwrap(), d);
    }

    #[test]
    fn fixed_layouts_round_trip_and_sort_by_time() {
        let unit = MessageId::generate();
        let k = track_key(unit, 513);
        assert_eq!(track_unit(&k), unit);
        assert!(track_name(&k).ends_with("/513"));
        let e = track_expiry_key(Timestamp(10), &k);
        assert_eq!(track_of_expiry_key(&e), k);
        assert!(track_expiry_key(Timestamp(9), &[0xff; 18]) < e);
        assert!(time_id_key(Timestamp(1), u64::MAX) < time_id_key(Timestamp(2), 0));
        assert_eq!(time_id_of(&time_id_key(Timestamp(3), 4)), (Timestamp(3), 4));
        assert_ne!(corr_key("a", "bc"), corr_key("ab", "c"));
        assert_eq!(corr_name(&corr_key("up", "0A1B")), "up/0A1B");
        assert!(orphan_expiry_key(Timestamp(1), &[0xff]) < orphan_expiry_key(Timestamp(2), &[0]));
        for s in [
            DeliveryState {
                attempt: 3,
                due_at: Timestamp(1_700_000_000_000),
                leased_until: Some(Timestamp(1_700_000_030_000)),
            },
            DeliveryState {
                attempt: 0,
                due_at: Timestamp(0),
                leased_until: None,
            },
        ] {
            assert_eq!(DeliveryState::from_bytes(&s.to_bytes()), s);
        }
    }
}
