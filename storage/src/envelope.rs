//! The versioned CBOR envelope of every stored record.
//!
//! A stored value is one CBOR map: `"v"` (major version, u16) and `"vm"` (minor version)
//! come first, then the record's own fields, flat in the same map:
//!
//! ```text
//! { "v": 1, "vm": 0, "id": h'0190…', "account": "esme1", … }
//! ```
//!
//! Compatibility rules, which every record type must keep:
//!
//! * A **minor** version adds fields only, each `#[serde(default)]`: an older reader
//!   ignores the new fields (serde skips unknown keys), a newer reader fills the missing
//!   ones with their default.
//! * A **major** version is anything else (a field removed, renamed or re-typed). A reader
//!   refuses a major version newer than its own with
//!   [`EnvelopeError::UnsupportedVersion`] instead of guessing: the process stops rather
//!   than misreads accepted work.
//! * No record type has fields called `v` or `vm`.
//!
//! Encoding is [cbor4ii]'s serde support (serde_cbor is unmaintained, RUSTSEC-2021-0127),
//! decoding straight from the stored bytes. Payloads use `serde_bytes` so a 300-byte
//! payload is one 300-byte CBOR byte string, not an array of 300 integers.

use std::fmt;

use cbor4ii::core::dec::Reference;
use cbor4ii::core::utils::SliceReader;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{BackendFailure, FailureKind};

/// The kinds of stored records, each versioned on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// [`crate::PendingRecord`]: an admitted message or multipart part.
    PendingRecord,
    /// A ready unit of the pending stage (its members, disposition, ready position).
    PendingUnit,
    /// An incomplete multipart group (parts received so far, deadline).
    PendingGroup,
    /// An idempotency key's first admission and its retention deadline.
    IdempotencyKey,
    /// A unit staged in the router-queue stage.
    StagedUnit,
    /// [`crate::RoutedUnit`]: routing decisions and branch outcomes.
    RoutedUnit,
    /// A branch awaiting (or resolved from) provider receipts in the file DLR store: its
    /// provider parts with their final states, receipt targets, first failure, expiry.
    DlrTrack,
    /// A provider receipt not (yet) correlated, with its expiry.
    DlrOrphan,
    /// A pending downstream delivery: target, a receipt's outcome, an inbound message
    /// (minor 1) or a Kannel progress report (minor 3), creation and expiry.
    DlrDelivery,
    /// A multipart inbound group held by the file DLR store: its key, deadline, whether
    /// it is closed, and its parts.
    DlrInboundGroup,
    /// A frame of the pending stage's admission journal: what one commit changed.
    PendingJournalFrame,
    /// A frame of the router-queue stage in the journal: one `stage` or `release`.
    RouterQueueJournalFrame,
    /// A frame of the routed-work stage in the journal: one write's records,
    /// completions and removals.
    RoutedWorkJournalFrame,
    /// A frame of the file DLR store in the journal: the keys one write transaction
    /// set or removed, table by table, with the values it set.
    DlrJournalFrame,
}

impl RecordKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::PendingRecord => "pending record",
            RecordKind::PendingUnit => "pending unit",
            RecordKind::PendingGroup => "multipart group",
            RecordKind::IdempotencyKey => "idempotency key",
            RecordKind::StagedUnit => "staged unit",
            RecordKind::RoutedUnit => "routed unit",
            RecordKind::DlrTrack => "dlr track",
            RecordKind::DlrOrphan => "dlr orphan receipt",
            RecordKind::DlrDelivery => "dlr delivery",
            RecordKind::DlrInboundGroup => "dlr inbound group",
            RecordKind::PendingJournalFrame => "pending journal frame",
            RecordKind::RouterQueueJournalFrame => "router-queue journal frame",
            RecordKind::RoutedWorkJournalFrame => "routed-work journal frame",
            RecordKind::DlrJournalFrame => "dlr journal frame",
        }
    }

    /// The (major, minor) version this build writes and reads.
    pub fn version(self) -> (u16, u16) {
        match self {
            // Minor 1: `dm` (a Kannel dlr-mask). Minor 2: `rp` (route priority) and `sh`
            // (a destination hint). Minor 3: `da` (a scheduled delivery time).
            RecordKind::PendingRecord => (1, 3),
            // Minor 1: a receipt target's reply may be `Kannel`. Minor 2: a first failure
            // may be `Refused`.
            RecordKind::DlrTrack => (1, 2),
            // Minor 1: `lanes` (the selection cursors of lanes above 0).
            RecordKind::RouterQueueJournalFrame => (1, 1),
            RecordKind::PendingUnit
            | RecordKind::PendingGroup
            | RecordKind::IdempotencyKey
            | RecordKind::StagedUnit
            | RecordKind::RoutedUnit
            | RecordKind::DlrOrphan
            | RecordKind::DlrInboundGroup
            | RecordKind::PendingJournalFrame
            | RecordKind::RoutedWorkJournalFrame
            | RecordKind::DlrJournalFrame => (1, 0),
            // Minor 1 added the inbound message; minor 2 a `Kannel` reply; minor 3 a
            // `Refused` state and `p` (a Kannel progress report).
            RecordKind::DlrDelivery => (1, 3),
        }
    }
}

impl fmt::Display for RecordKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a stored value could not be encoded or decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// Written by a newer, incompatible version of Sendium.
    #[error(
        "{kind} has major version {found}; this build reads version {supported} \
         (written by a newer Sendium: upgrade, or drain the store with the version that wrote it)"
    )]
    UnsupportedVersion {
        kind: RecordKind,
        found: u16,
        supported: u16,
    },
    /// Truncated, garbled, or not an envelope at all.
    #[error("corrupt {kind}: {detail}")]
    Corrupt { kind: RecordKind, detail: String },
    /// The value could not be serialized (a bug: stored types always serialize).
    #[error("cannot encode {kind}: {detail}")]
    Encode { kind: RecordKind, detail: String },
}

impl EnvelopeError {
    pub fn failure_kind(&self) -> FailureKind {
        match self {
            EnvelopeError::UnsupportedVersion { .. } => FailureKind::UnsupportedVersion,
            EnvelopeError::Corrupt { .. } => FailureKind::Corrupt,
            EnvelopeError::Encode { .. } => FailureKind::Unavailable,
        }
    }

    /// The failure, located (file, table and key) so the operator can find the value.
    pub fn at(self, location: impl Into<String>) -> BackendFailure {
        BackendFailure::new(self.failure_kind(), location, self)
    }
}

/// Encode `value` (a struct: it serializes as a CBOR map) in its envelope.
///
/// A struct serializes as a definite-length map; the envelope is that map with its
/// count raised by two and `"v"`, `"vm"` spliced in front of the fields — one extra copy
/// of the bytes, no intermediate value tree.
pub fn encode<T: Serialize>(kind: RecordKind, value: &T) -> Result<Vec<u8>, EnvelopeError> {
    let mut body = ENCODE_BODY.take();
    body.clear();
    let body = cbor4ii::serde::to_vec(body, value).map_err(|e| EnvelopeError::Encode {
        kind,
        detail: e.to_string(),
    })?;
    let out = splice_versions(kind, &body);
    if body.capacity() <= ENCODE_BODY_KEPT {
        ENCODE_BODY.set(body);
    }
    out
}

/// The largest body buffer a thread keeps for its next [`encode`]: records are a few
/// hundred bytes; a journal frame of thousands of them is not worth holding on to.
const ENCODE_BODY_KEPT: usize = 64 << 10;

thread_local! {
    /// This thread's buffer for the body [`encode`] serializes before splicing in the
    /// versions: reused, so a record does not grow a fresh vector two or three times.
    /// Taken while in use (a nested encode starts from an empty one).
    static ENCODE_BODY: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The envelope of the serialized map `body`: its count raised by two, `"v"` and `"vm"`
/// in front of its fields, the CRC-32 trailer after them.
fn splice_versions(kind: RecordKind, body: &[u8]) -> Result<Vec<u8>, EnvelopeError> {
    let (count, header_len) = match read_head(body, 0) {
        Some(Head::Map(Some(n), len)) => (n, len),
        _ => {
            return Err(EnvelopeError::Encode {
                kind,
                detail: "a stored record must serialize as a CBOR map".to_string(),
            });
        }
    };
    let (major, minor) = kind.version();
    let mut out = Vec::with_capacity(body.len() + 16);
    write_head(&mut out, 5, count + 2);
    write_text(&mut out, "v");
    write_head(&mut out, 0, u64::from(major));
    write_text(&mut out, "vm");
    write_head(&mut out, 0, u64::from(minor));
    out.extend_from_slice(body.get(header_len..).unwrap_or_default());
    Ok(seal(out))
}

/// Append the CRC-32 of a record's bytes. redb checksums its pages but does not verify
/// them on ordinary reads, so a flipped bit inside a stored value would otherwise be
/// returned as data; with the trailer, a damaged record fails to decode (fail closed).
pub(crate) fn seal(mut bytes: Vec<u8>) -> Vec<u8> {
    let crc = crc32(&bytes);
    bytes.extend_from_slice(&crc.to_be_bytes());
    bytes
}

/// CRC-32 (IEEE 802.3, the zlib/PNG polynomial) of `data`.
///
/// Every stored record is sealed when written and checked when read, and every journal
/// frame carries one, so on the hot path the CRC's speed shows. crc32fast folds with the
/// CPU's carry-less multiply where it has one (x86-64 with PCLMULQDQ, aarch64 with its
/// CRC instructions) and falls back to a slicing table: about 19 ns for a 300-byte record
/// against 134 ns for a 16-byte slicing table alone, for the same values.
pub(crate) fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

/// The bytes [`seal`] covered, if its CRC-32 trailer matches them.
pub(crate) fn unseal(sealed: &[u8]) -> Result<&[u8], String> {
    let Some(split) = sealed.len().checked_sub(4) else {
        return Err(format!("{} bytes is too short for a record", sealed.len()));
    };
    let (bytes, trailer) = sealed.split_at(split);
    let stored = u32::from_be_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
    if crc32(bytes) != stored {
        return Err("checksum mismatch: the stored record is damaged".to_string());
    }
    Ok(bytes)
}

/// Decode a value written by [`encode`] (by this or any compatible version).
pub fn decode<T: DeserializeOwned>(kind: RecordKind, bytes: &[u8]) -> Result<T, EnvelopeError> {
    let corrupt = |detail: String| EnvelopeError::Corrupt { kind, detail };
    let bytes = unseal(bytes).map_err(corrupt)?;
    let (major, _minor) = match fast_versions(bytes) {
        Some(v) => v,
        None => probe_versions(kind, bytes)?,
    };
    let supported = kind.version().0;
    if major > supported {
        return Err(EnvelopeError::UnsupportedVersion {
            kind,
            found: major,
            supported,
        });
    }
    if major < supported {
        // There is no older major version yet; a 0 (or any older) major is not ours.
        return Err(corrupt(format!(
            "major version {major} predates every format this build knows ({supported})"
        )));
    }
    let mut de = cbor4ii::serde::Deserializer::new(SliceReader::new(bytes));
    let value = T::deserialize(&mut de).map_err(|e| corrupt(e.to_string()))?;
    let mut rest = de.into_inner();
    let trailing = match cbor4ii::core::dec::Read::fill(&mut rest, bytes.len()) {
        Ok(Reference::Long(b) | Reference::Short(b)) => b.len(),
        Err(never) => match never {},
    };
    if trailing > 0 {
        return Err(corrupt(format!("{trailing} trailing bytes after the record")));
    }
    Ok(value)
}

/// The versions of an envelope written by [`encode`]: a map whose first two entries are
/// `"v"` and `"vm"` with unsigned values. `None` when the layout differs (then
/// [`probe_versions`] reads the map the slow way).
fn fast_versions(bytes: &[u8]) -> Option<(u16, u16)> {
    let Head::Map(_, mut at) = read_head(bytes, 0)? else {
        return None;
    };
    let mut versions = [0u16; 2];
    for (i, key) in ["v", "vm"].iter().enumerate() {
        let Head::Text(len, hl) = read_head(bytes, at)? else {
            return None;
        };
        let start = at + hl;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        if bytes.get(start..end)? != key.as_bytes() {
            return None;
        }
        let Head::Uint(v, vl) = read_head(bytes, end)? else {
            return None;
        };
        versions[i] = u16::try_from(v).ok()?;
        at = end + vl;
    }
    Some((versions[0], versions[1]))
}

/// Read `v`/`vm` from anywhere in the map (a hand-built or reordered envelope).
fn probe_versions(kind: RecordKind, bytes: &[u8]) -> Result<(u16, u16), EnvelopeError> {
    #[derive(serde::Deserialize)]
    struct Probe {
        v: Option<u16>,
        #[serde(default)]
        vm: u16,
    }
    let probe: Probe = cbor4ii::serde::from_slice(bytes).map_err(|e| EnvelopeError::Corrupt {
        kind,
        detail: e.to_string(),
    })?;
    match probe.v {
        Some(v) => Ok((v, probe.vm)),
        None => Err(EnvelopeError::Corrupt {
            kind,
            detail: "no \"v\" (version) field: not a Sendium record envelope".to_string(),
        }),
    }
}

/// A CBOR data item head, as far as the envelope needs one.
enum Head {
    Uint(u64, usize),
    Text(u64, usize),
    /// A map with its entry count (`None`: indefinite length) and the head's length.
    Map(Option<u64>, usize),
    Other,
}

/// Parse the head of the data item at `at`. `None` when the bytes end inside it.
fn read_head(bytes: &[u8], at: usize) -> Option<Head> {
    let first = *bytes.get(at)?;
    let major = first >> 5;
    let info = first & 0x1f;
    let (arg, len) = match info {
        0..=23 => (Some(u64::from(info)), 1),
        24..=27 => {
            let n = 1usize << (info - 24);
            let raw = bytes.get(at + 1..at + 1 + n)?;
            let mut v = 0u64;
            for b in raw {
                v = (v << 8) | u64::from(*b);
            }
            (Some(v), 1 + n)
        }
        31 => (None, 1),
        _ => return Some(Head::Other),
    };
    Some(match (major, arg) {
        (0, Some(v)) => Head::Uint(v, len),
        (3, Some(v)) => Head::Text(v, len),
        (5, count) => Head::Map(count, len),
        _ => Head::Other,
    })
}

fn write_head(out: &mut Vec<u8>, major: u8, arg: u64) {
    let m = major << 5;
    if arg < 24 {
        out.push(m | arg as u8);
    } else if let Ok(v) = u8::try_from(arg) {
        out.extend_from_slice(&[m | 24, v]);
    } else if let Ok(v) = u16::try_from(arg) {
        out.push(m | 25);
        out.extend_from_slice(&v.to_be_bytes());
    } else if let Ok(v) = u32::try_from(arg) {
        out.push(m | 26);
        out.extend_from_slice(&v.to_be_bytes());
    } else {
        out.push(m | 27);
        out.extend_from_slice(&arg.to_be_bytes());
    }
}

fn write_text(out: &mut Vec<u8>, s: &str) {
    write_head(out, 3, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

#[cfg(test)]
pub(crate) mod tests {
    use ciborium::Value;
    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::file::records::{GroupPart, GroupState, IdempotencyEntry, StagedRecord, UnitEntry};
    use crate::ids::{MessageId, Timestamp};
    use crate::pending::Disposition;
    use crate::record::{Address, Channel, PartInfo, PendingRecord};
    use crate::routed_work::{Branch, BranchFailure, BranchKind, BranchOutcome, RoutedUnit};

    /// `value`'s envelope with its body written by ciborium, a second CBOR implementation:
    /// stored files and journals hold these bytes, and a build that reads them must keep
    /// reading them. The versions are spliced in as [`encode`] splices them.
    fn ciborium_envelope<T: Serialize>(kind: RecordKind, value: &T) -> Vec<u8> {
        let mut body = Vec::new();
        ciborium::into_writer(value, &mut body).unwrap();
        splice_versions(kind, &body).unwrap()
    }

    /// [`encode`] writes `value` byte for byte as ciborium does, [`decode`] reads
    /// ciborium's bytes back to a value that encodes to them again, and ciborium reads
    /// [`encode`]'s: the envelope's bytes do not depend on which of the two wrote them.
    pub(crate) fn same_bytes_as_ciborium<T: Serialize + DeserializeOwned>(kind: RecordKind, value: &T) {
        let reference = ciborium_envelope(kind, value);
        let ours = encode(kind, value).unwrap();
        assert_eq!(ours, reference, "{kind}: the bytes ciborium writes");
        let back: T = decode(kind, &reference).unwrap();
        assert_eq!(
            encode(kind, &back).unwrap(),
            reference,
            "{kind}: decoded and encoded again"
        );
        let by_ciborium: T = ciborium::from_reader(unseal(&ours).unwrap()).unwrap();
        assert_eq!(
            ciborium_envelope(kind, &by_ciborium),
            reference,
            "{kind}: read by ciborium"
        );
    }

    /// The CRC-32 must give the values of the plain bit-at-a-time one at every length and
    /// alignment: stored records are sealed and checked with it.
    #[test]
    fn crc32_is_the_ieee_crc_records_were_sealed_with() {
        fn bitwise(data: &[u8]) -> u32 {
            let mut c = 0xFFFF_FFFFu32;
            for &b in data {
                c ^= u32::from(b);
                for _ in 0..8 {
                    c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
                }
            }
            c ^ 0xFFFF_FFFF
        }
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
        let data: Vec<u8> = (0..600u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for start in 0..17 {
            for end in (start..data.len()).step_by(7) {
                assert_eq!(
                    crc32(&data[start..end]),
                    bitwise(&data[start..end]),
                    "bytes {start}..{end}"
                );
            }
        }
    }

    fn record(payload_len: usize) -> PendingRecord {
        PendingRecord {
            id: MessageId::generate(),
            account: "esme1".into(),
            channel: Channel::Http,
            source: Address::new(5, 0, "Sendium"),
            destination: Address::new(1, 1, "447700900123"),
            service_type: "CMT".into(),
            esm_class: 3,
            protocol_id: 0,
            priority: 1,
            data_coding: 8,
            payload: (0..payload_len).map(|i| (i % 251) as u8).collect(),
            part: Some(PartInfo {
                reference: 300,
                total: 3,
                seq: 2,
                expires_at: Timestamp(1_700_000_000_000),
            }),
            registered_delivery: 1,
            callback_url: Some("http://127.0.0.1/cb".into()),
            idempotency_key: Some("k-1".into()),
            accepted_at: Timestamp::now(),
            valid_until: None,
            dlr_mask: None,
            route_priority: 0,
            destination_hint: None,
            deliver_at: None,
        }
    }

    fn round_trip<T: Serialize + DeserializeOwned + PartialEq + fmt::Debug>(kind: RecordKind, v: &T) {
        same_bytes_as_ciborium(kind, v);
        let bytes = encode(kind, v).unwrap();
        assert!(fast_versions(&bytes).is_some(), "{kind}: v/vm lead the map");
        let back: T = decode(kind, &bytes).unwrap();
        assert_eq!(&back, v, "{kind} round trip");
    }

    #[test]
    fn every_record_kind_round_trips() {
        let id = MessageId::generate();
        round_trip(RecordKind::PendingRecord, &record(160));
        let mut plain = record(5);
        plain.part = None;
        plain.callback_url = None;
        plain.idempotency_key = None;
        round_trip(RecordKind::PendingRecord, &plain);
        plain.valid_until = Some(Timestamp(u64::MAX));
        plain.esm_class = u8::MAX;
        round_trip(RecordKind::PendingRecord, &plain);
        plain.deliver_at = Some(Timestamp(4_102_444_799_000));
        round_trip(RecordKind::PendingRecord, &plain);
        round_trip(
            RecordKind::PendingUnit,
            &UnitEntry {
                id,
                disposition: Disposition::Expired,
                members: vec![id, MessageId::generate()],
                receipts: 2,
            },
        );
        round_trip(
            RecordKind::PendingGroup,
            &GroupState {
                parts: vec![
                    GroupPart {
                        seq: 1,
                        ids: vec![id],
                        digest: Some(7),
                    },
                    GroupPart {
                        seq: 3,
                        ids: vec![MessageId::generate(), MessageId::generate()],
                        digest: None,
                    },
                ],
                deadline: Timestamp(42),
                receipts: 1,
            },
        );
        round_trip(
            RecordKind::IdempotencyKey,
            &IdempotencyEntry {
                id,
                expires_at: Timestamp(99),
                digest: Some(u64::MAX - 7),
            },
        );
        // An entry written before digests were kept reads back without one.
        round_trip(
            RecordKind::IdempotencyKey,
            &IdempotencyEntry {
                id,
                expires_at: Timestamp(99),
                digest: None,
            },
        );
        round_trip(RecordKind::StagedUnit, &StagedRecord { id });
        round_trip(
            RecordKind::RoutedUnit,
            &RoutedUnit {
                id,
                members: vec![id],
                route: "default".into(),
                routed_at: Timestamp::now(),
                branches: vec![
                    Branch {
                        no: 0,
                        kind: BranchKind::Primary,
                        targets: vec!["a".into(), "b".into()],
                        outcome: Some(BranchOutcome::Submitted {
                            destination: "a".into(),
                            provider_ids: vec!["0A1B".into(), "0A1C".into()],
                        }),
                        failed_over_from: vec!["b".into()],
                    },
                    Branch {
                        no: 1,
                        kind: BranchKind::Copy,
                        targets: vec![],
                        outcome: Some(BranchOutcome::Failed {
                            destination: None,
                            failure: BranchFailure::Rejected { status: 0x45 },
                        }),
                        failed_over_from: Vec::new(),
                    },
                    Branch {
                        no: 2,
                        kind: BranchKind::Copy,
                        targets: vec!["c".into()],
                        outcome: None,
                        failed_over_from: Vec::new(),
                    },
                ],
            },
        );
    }

    fn text(s: &str) -> Value {
        Value::Text(s.into())
    }

    /// A hand-built record as a writer stores it (map + checksum trailer).
    fn to_bytes(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        ciborium::into_writer(v, &mut out).unwrap();
        seal(out)
    }

    /// A v1.0 PendingRecord as an older writer (without the `#[serde(default)]` fields)
    /// would have stored it, built by hand.
    fn old_minor_record(id: MessageId) -> Vec<(Value, Value)> {
        let addr = |ton: u8, npi: u8, a: &str| {
            Value::Map(vec![
                (text("ton"), Value::Integer(ton.into())),
                (text("npi"), Value::Integer(npi.into())),
                (text("addr"), text(a)),
            ])
        };
        vec![
            (text("v"), Value::Integer(1.into())),
            (text("vm"), Value::Integer(0.into())),
            (text("id"), Value::Bytes(id.to_bytes().to_vec())),
            (text("acct"), text("esme1")),
            (text("ch"), text("Smpp")),
            (text("src"), addr(5, 0, "Sendium")),
            (text("dst"), addr(1, 1, "4477")),
            (text("dcs"), Value::Integer(0.into())),
            (text("ud"), Value::Bytes(b"hi".to_vec())),
            (text("at"), Value::Integer(1234.into())),
        ]
    }

    #[test]
    fn a_flipped_bit_is_caught_by_the_checksum() {
        let rec = record(300);
        let mut bytes = encode(RecordKind::PendingRecord, &rec).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x01;
        let err = decode::<PendingRecord>(RecordKind::PendingRecord, &bytes).unwrap_err();
        assert!(matches!(err, EnvelopeError::Corrupt { .. }), "{err}");
    }

    #[test]
    fn an_older_minor_without_defaulted_fields_decodes() {
        let id = MessageId::generate();
        let bytes = to_bytes(&Value::Map(old_minor_record(id)));
        let r: PendingRecord = decode(RecordKind::PendingRecord, &bytes).unwrap();
        assert_eq!(r.id, id);
        assert_eq!(r.payload, b"hi");
        assert_eq!(r.service_type, "");
        assert_eq!(r.part, None);
        assert_eq!(r.registered_delivery, 0);
        assert_eq!(r.idempotency_key, None);
        assert_eq!(r.accepted_at, Timestamp(1234));
        assert_eq!(r.dlr_mask, None, "minor 0 records have no dlr-mask");
        assert_eq!(r.deliver_at, None, "records before minor 3 are not scheduled");
    }

    /// A record with a Kannel dlr-mask round-trips; one without it encodes exactly as
    /// minor 0 did apart from `vm`, so older readers see nothing new.
    #[test]
    fn a_dlr_mask_round_trips_and_is_absent_when_unset() {
        let mut r = record(10);
        r.dlr_mask = Some(31);
        round_trip(RecordKind::PendingRecord, &r);
        r.dlr_mask = None;
        let bytes = encode(RecordKind::PendingRecord, &r).unwrap();
        let v: Value = ciborium::from_reader(unseal(&bytes).unwrap()).unwrap();
        let keys: Vec<_> = v.as_map().unwrap().iter().filter_map(|(k, _)| k.as_text()).collect();
        assert!(!keys.contains(&"dm"), "{keys:?}");
    }

    /// Route priority and destination hint round-trip, and are left out when unset.
    #[test]
    fn a_route_priority_and_destination_hint_round_trip_and_are_absent_when_unset() {
        let mut r = record(11);
        r.route_priority = 9;
        r.destination_hint = Some("upstream-b".into());
        round_trip(RecordKind::PendingRecord, &r);
        r.route_priority = 0;
        r.destination_hint = None;
        let bytes = encode(RecordKind::PendingRecord, &r).unwrap();
        let v: Value = ciborium::from_reader(unseal(&bytes).unwrap()).unwrap();
        let keys: Vec<_> = v.as_map().unwrap().iter().filter_map(|(k, _)| k.as_text()).collect();
        assert!(!keys.contains(&"rp") && !keys.contains(&"sh"), "{keys:?}");
        let old: PendingRecord = decode(
            RecordKind::PendingRecord,
            &to_bytes(&Value::Map(old_minor_record(r.id))),
        )
        .unwrap();
        assert_eq!((old.route_priority, old.destination_hint), (0, None));
    }

    #[test]
    fn unknown_fields_of_a_newer_minor_are_ignored() {
        let id = MessageId::generate();
        let mut map = old_minor_record(id);
        map[1].1 = Value::Integer(7.into());
        map.push((text("added_in_1_7"), Value::Array(vec![Value::Bool(true)])));
        // Whatever CBOR a newer minor's fields hold is skipped.
        map.push((
            text("added_at"),
            Value::Tag(1, Box::new(Value::Integer(1_700_000_000.into()))),
        ));
        map.push((text("added_big"), Value::Tag(2, Box::new(Value::Bytes(vec![1; 20])))));
        map.push((text("added_ratio"), Value::Float(0.25)));
        map.push((text("added_neg"), Value::Integer((-70_000i64).into())));
        map.push((text("added_none"), Value::Null));
        map.push((
            text("added_nested"),
            Value::Map(vec![(
                Value::Integer(3.into()),
                Value::Array(vec![Value::Bytes(vec![0; 3]), text("x")]),
            )]),
        ));
        let r: PendingRecord = decode(RecordKind::PendingRecord, &to_bytes(&Value::Map(map))).unwrap();
        assert_eq!(r.id, id);
    }

    #[test]
    fn versions_are_found_anywhere_in_a_hand_built_map() {
        let id = MessageId::generate();
        let mut map = old_minor_record(id);
        map.rotate_left(2);
        let r: PendingRecord = decode(RecordKind::PendingRecord, &to_bytes(&Value::Map(map))).unwrap();
        assert_eq!(r.id, id);
    }

    #[test]
    fn a_newer_major_is_refused_with_the_version_error() {
        let mut map = old_minor_record(MessageId::generate());
        map[0].1 = Value::Integer(99.into());
        let err = decode::<PendingRecord>(RecordKind::PendingRecord, &to_bytes(&Value::Map(map))).unwrap_err();
        assert_eq!(
            err,
            EnvelopeError::UnsupportedVersion {
                kind: RecordKind::PendingRecord,
                found: 99,
                supported: 1
            }
        );
        assert_eq!(err.failure_kind(), FailureKind::UnsupportedVersion);
        let f = err.at("/x/pending.redb table records");
        assert!(f.to_string().contains("major version 99"), "{f}");
        assert!(f.to_string().contains("/x/pending.redb"), "{f}");
    }

    #[test]
    fn missing_or_old_major_is_corrupt() {
        let mut map = old_minor_record(MessageId::generate());
        map.remove(0);
        let err = decode::<PendingRecord>(RecordKind::PendingRecord, &to_bytes(&Value::Map(map))).unwrap_err();
        assert_eq!(err.failure_kind(), FailureKind::Corrupt, "{err}");
        let mut map = old_minor_record(MessageId::generate());
        map[0].1 = Value::Integer(0.into());
        let err = decode::<PendingRecord>(RecordKind::PendingRecord, &to_bytes(&Value::Map(map))).unwrap_err();
        assert_eq!(err.failure_kind(), FailureKind::Corrupt, "{err}");
    }

    #[test]
    fn truncated_or_garbage_bytes_are_corrupt_never_a_panic() {
        let bytes = encode(RecordKind::PendingRecord, &record(300)).unwrap();
        for cut in 0..bytes.len() {
            let err = decode::<PendingRecord>(RecordKind::PendingRecord, &bytes[..cut]).unwrap_err();
            assert_eq!(err.failure_kind(), FailureKind::Corrupt, "cut at {cut}: {err}");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(decode::<PendingRecord>(RecordKind::PendingRecord, &extra).is_err());
        // Deterministic pseudo-random garbage and single-byte mutations.
        let mut x: u32 = 0x1234_5678;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        for _ in 0..2_000 {
            let len = (next() % 64) as usize;
            let junk: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let _ = decode::<PendingRecord>(RecordKind::PendingRecord, &junk);
            let mut m = bytes.clone();
            let at = next() as usize % m.len();
            m[at] = next() as u8;
            let _ = decode::<PendingRecord>(RecordKind::PendingRecord, &m);
        }
    }

    #[test]
    fn a_300_byte_payload_stays_about_300_bytes() {
        let mut r = record(300);
        r.callback_url = None;
        r.idempotency_key = None;
        r.part = None;
        let bytes = encode(RecordKind::PendingRecord, &r).unwrap();
        // The payload is one CBOR byte string: head 0x59 0x01 0x2c (bytes, length 300)
        // followed by the 300 bytes themselves, not an array of 300 integers.
        let at = bytes
            .windows(3)
            .position(|w| w == [0x59, 0x01, 0x2c])
            .expect("byte string head");
        assert_eq!(&bytes[at + 3..at + 303], r.payload.as_slice());
        // Each payload byte costs one byte: doubling the payload adds exactly 300 bytes.
        let mut bigger = r.clone();
        bigger.payload.extend_from_slice(&r.payload);
        let bigger = encode(RecordKind::PendingRecord, &bigger).unwrap();
        assert_eq!(bigger.len() - bytes.len(), 300);
        // The rest is field names, addresses, id and timestamps (~280 bytes with the
        // self-describing field names; see the report on shortening them).
        assert!(bytes.len() < 300 + 300, "encoded size {}", bytes.len());
    }

    #[test]
    fn encode_refuses_a_non_map() {
        #[derive(Serialize, Deserialize)]
        struct Tuple(u8, u8);
        assert!(matches!(
            encode(RecordKind::StagedUnit, &Tuple(1, 2)),
            Err(EnvelopeError::Encode { .. })
        ));
    }
}
