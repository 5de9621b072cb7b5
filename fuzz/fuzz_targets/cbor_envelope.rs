//! The versioned CBOR envelope every stored record is kept in
//! (`sendium_storage::envelope`): the CRC-32 trailer check, the fast and the slow
//! version probes, the major-version rule and the record decoders.
//!
//! Input: a mode byte, then the stored value.
//! - bit 0 set: the target seals the value (appends its CRC-32) first, so mutations get
//!   past the checksum into the CBOR; clear: the value is decoded as stored, trailer
//!   included.
//! - bits 1-2: the type read (`PendingRecord`, `RoutedUnit`, any CBOR value, or
//!   anything, ignored).
//! - bits 4-7: the `RecordKind` it is read as.
//!
//! Checked: nothing panics (truncated, garbled or hostile values are an
//! `EnvelopeError`); a decoded record encodes to an envelope that decodes to the same
//! record; a corrupt value is never read as `Encode`.
#![no_main]
#![forbid(unsafe_code)]

use std::fmt::Debug;

use libfuzzer_sys::fuzz_target;
use sendium_fuzz::Input;
use sendium_storage::envelope::{self, EnvelopeError, RecordKind};
use sendium_storage::{PendingRecord, RoutedUnit};
use serde::Serialize;
use serde::de::{DeserializeOwned, IgnoredAny};

const KINDS: [RecordKind; 12] = [
    RecordKind::PendingRecord,
    RecordKind::PendingUnit,
    RecordKind::PendingGroup,
    RecordKind::IdempotencyKey,
    RecordKind::StagedUnit,
    RecordKind::RoutedUnit,
    RecordKind::DlrTrack,
    RecordKind::DlrOrphan,
    RecordKind::DlrDelivery,
    RecordKind::PendingJournalFrame,
    RecordKind::RouterQueueJournalFrame,
    RecordKind::RoutedWorkJournalFrame,
];

/// The CRC-32 the store seals records with (IEEE 802.3).
const CRC32: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let mode = input.byte();
    let kind = KINDS[usize::from(mode >> 4) % KINDS.len()];
    let mut value = input.rest().to_vec();
    if mode & 0x01 != 0 {
        let crc = CRC32.checksum(&value);
        value.extend_from_slice(&crc.to_be_bytes());
    }
    match (mode >> 1) & 0x03 {
        0 => round_trip::<PendingRecord>(kind, &value),
        1 => round_trip::<RoutedUnit>(kind, &value),
        2 => {
            let _ = decoded::<ciborium::Value>(kind, &value);
        }
        _ => {
            let _ = decoded::<IgnoredAny>(kind, &value);
        }
    }
});

fn decoded<T: DeserializeOwned>(kind: RecordKind, value: &[u8]) -> Option<T> {
    match envelope::decode::<T>(kind, value) {
        Ok(v) => Some(v),
        Err(err) => {
            assert!(
                !matches!(err, EnvelopeError::Encode { .. }),
                "a read failed as an encode: {err}"
            );
            let _ = (err.to_string(), err.failure_kind());
            None
        }
    }
}

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(kind: RecordKind, value: &[u8]) {
    let Some(record) = decoded::<T>(kind, value) else {
        return;
    };
    let encoded = envelope::encode(kind, &record).expect("a decoded record does not encode");
    let again: T = envelope::decode(kind, &encoded).expect("a re-encoded record does not decode");
    assert_eq!(again, record, "decode(encode(record)) differs");
}
