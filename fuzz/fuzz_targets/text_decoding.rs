//! SMS text: GSM 7-bit / Latin-1 / IA5 / UCS2 decoding and encoding and the splitting of
//! encoded user data (`sendium_protocols::text`), concatenation UDHs and SAR values
//! (`sendium_protocols::multipart`), and the reassembly state those parts drive
//! (`sendium_storage::reassembly` through the memory pending store, which applies it).
//!
//! Input: a selector byte, then the case's own bytes:
//! - 0 decode: a data_coding byte and user data. Decoded text encodes back (UCS2,
//!   Latin-1, IA5: to the same octets; GSM: to octets that decode to the same text).
//! - 1 split: an alphabet, `(single, per_part)` limits and user data. The parts
//!   concatenate back, cut only between characters (never in a GSM escape pair, a UCS2
//!   unit or a surrogate pair), are at most `per_part` octets unless one character is
//!   longer, and are as long as that allows.
//! - 2 encode: text (`from_utf8_lossy`). `best_alphabet` always encodes it, and every
//!   alphabet that encodes it decodes it back.
//! - 3 UDH: a short_message with a UDH, and SAR values. The header and the user data
//!   make up the message; a concatenation element is valid; the UDHs Sendium writes read
//!   back as written.
//! - 4 reassembly: a sequence of multipart parts (reference, total, seq, text) admitted,
//!   completed and expired in the memory pending store. Every complete unit has each
//!   position once, every record ends in exactly one unit, the counts add up.
#![no_main]
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::executor::block_on;
use libfuzzer_sys::fuzz_target;
use sendium_fuzz::Input;
use sendium_protocols::multipart::{self, MultipartError};
use sendium_protocols::text::{self, Alphabet, gsm7};
use sendium_storage::memory::{MemoryPendingStore, PendingLimits};
use sendium_storage::{
    Address, AdmitOutcome, Channel, Disposition, MessageId, PartInfo, PendingRecord, PendingStore, Timestamp,
};

const ALPHABETS: [Alphabet; 5] = [
    Alphabet::Gsm7,
    Alphabet::Latin1,
    Alphabet::Ucs2,
    Alphabet::Ia5,
    Alphabet::Binary,
];

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    match input.byte() % 5 {
        0 => decode(input),
        1 => split(input),
        2 => encode(input),
        3 => udh(input),
        _ => reassembly(input),
    }
});

fn decode(mut input: Input<'_>) {
    let dcs = input.byte();
    let bytes = input.rest();
    let alphabet = Alphabet::from_data_coding(dcs);
    match text::decode(dcs, bytes) {
        Ok(decoded) => {
            let encoded = text::encode(alphabet, &decoded).expect("decoded text does not encode back");
            match alphabet {
                Alphabet::Gsm7 => assert_eq!(gsm7::decode(&encoded).as_ref(), Ok(&decoded)),
                Alphabet::Latin1 | Alphabet::Ia5 | Alphabet::Ucs2 => assert_eq!(encoded, bytes),
                Alphabet::Binary => panic!("binary data decoded as text"),
            }
        }
        Err(err) => {
            let _ = err.to_string();
            if alphabet == Alphabet::Binary {
                assert_eq!(err, text::TextError::NotText { data_coding: dcs });
            }
        }
    }
}

/// The length of the character at the start of `data`, as the split documents it.
fn unit(alphabet: Alphabet, data: &[u8]) -> usize {
    match (alphabet, data) {
        (Alphabet::Gsm7, [gsm7::ESCAPE, _, ..]) => 2,
        (Alphabet::Ucs2, [hi, _, lo, _, ..]) if (0xD8..=0xDB).contains(hi) && (0xDC..=0xDF).contains(lo) => 4,
        (Alphabet::Ucs2, [_, _, ..]) => 2,
        _ => 1,
    }
}

fn split(mut input: Input<'_>) {
    let alphabet = ALPHABETS[input.below(ALPHABETS.len())];
    let single = usize::from(input.byte());
    let per_part = usize::from(input.byte());
    let data = input.rest();

    check_split(alphabet, data, (single, per_part));
    check_split(alphabet, data, text::segment_limits(alphabet));
}

fn check_split(alphabet: Alphabet, data: &[u8], (single, per_part): (usize, usize)) {
    let parts = text::split_with_limits(alphabet, data, (single, per_part));
    assert_eq!(parts.concat(), data, "the parts do not make up the data");
    if data.len() <= single {
        assert_eq!(parts.len(), 1);
        return;
    }
    // Character boundaries of the whole data.
    let mut boundaries = BTreeSet::from([0]);
    let mut at = 0;
    while at < data.len() {
        at += unit(alphabet, &data[at..]).min(data.len() - at);
        boundaries.insert(at);
    }
    let mut start = 0;
    for (i, part) in parts.iter().enumerate() {
        assert!(!part.is_empty(), "an empty part");
        let end = start + part.len();
        assert!(boundaries.contains(&end), "a cut inside a character at {end}");
        let first = unit(alphabet, &data[start..]);
        assert!(
            part.len() <= per_part || part.len() == first,
            "part of {} octets",
            part.len()
        );
        if i + 1 < parts.len() && part.len() <= per_part {
            let next = unit(alphabet, &data[end..]);
            assert!(part.len() + next > per_part, "part {i} could hold the next character");
        }
        start = end;
    }
}

fn encode(mut input: Input<'_>) {
    let text = String::from_utf8_lossy(input.rest()).into_owned();
    let best = text::best_alphabet(&text);
    assert!(matches!(best, Alphabet::Gsm7 | Alphabet::Ucs2));
    let encoded = text::encode(best, &text).expect("the best alphabet does not encode the text");
    assert_eq!(text::decode(best.data_coding(), &encoded).as_ref(), Ok(&text));
    for alphabet in ALPHABETS {
        match text::encode(alphabet, &text) {
            Ok(encoded) => {
                assert_eq!(
                    text::decode(alphabet.data_coding(), &encoded).as_ref(),
                    Ok(&text),
                    "{alphabet:?}"
                );
                let parts = text::split(alphabet, &encoded);
                assert_eq!(parts.concat(), encoded);
            }
            Err(err) => {
                let _ = err.to_string();
                if alphabet == Alphabet::Gsm7 {
                    assert!(!text.chars().all(gsm7::is_representable));
                }
            }
        }
    }
}

fn udh(mut input: Input<'_>) {
    let (reference, total, seq) = (input.u16(), input.byte(), input.byte());
    let message = input.rest();
    match multipart::parse_udh(message) {
        Ok((concat, header, user_data)) => {
            assert_eq!([header, user_data].concat(), message);
            assert_eq!(usize::from(header[0]) + 1, header.len());
            if let Some(c) = concat {
                assert!(c.total >= 1 && (1..=c.total).contains(&c.seq), "{c:?}");
            }
        }
        Err(err) => {
            let _ = err.to_string();
            if message.is_empty() {
                assert_eq!(err, MultipartError::MissingUdh);
            }
        }
    }
    let valid = total >= 1 && (1..=total).contains(&seq);
    assert_eq!(multipart::from_sar(reference, total, seq).is_ok(), valid);
    let [.., low] = reference.to_be_bytes();
    for written in [
        text::concat_udh_8bit(low, total, seq).to_vec(),
        text::concat_udh_16bit(reference, total, seq).to_vec(),
    ] {
        let mut message = written.clone();
        message.extend_from_slice(b"hi");
        match multipart::parse_udh(&message) {
            Ok((Some(c), header, user_data)) => {
                assert!(valid);
                assert_eq!((c.total, c.seq), (total, seq));
                assert_eq!((header, user_data), (&written[..], &b"hi"[..]));
            }
            Ok((None, ..)) => panic!("a concatenation UDH read as none"),
            Err(_) => assert!(!valid),
        }
    }
}

fn record(account: &str, destination: &str, reference: u16, total: u8, seq: u8, text: u8) -> PendingRecord {
    let now = Timestamp::now();
    PendingRecord {
        id: MessageId::generate(),
        account: account.into(),
        channel: Channel::Smpp,
        source: Address::new(1, 1, "46700000001"),
        destination: Address::new(1, 1, destination),
        service_type: String::new(),
        esm_class: 0,
        protocol_id: 0,
        priority: 0,
        data_coding: 0,
        payload: vec![text],
        part: Some(PartInfo {
            reference,
            total,
            seq,
            expires_at: now.saturating_add(Duration::from_secs(3600)),
        }),
        registered_delivery: text & 1,
        callback_url: None,
        idempotency_key: None,
        accepted_at: now,
        valid_until: None,
        dlr_mask: None,
        route_priority: 0,
        destination_hint: None,
        deliver_at: None,
    }
}

fn reassembly(mut input: Input<'_>) {
    let store = MemoryPendingStore::new(PendingLimits::default());
    let mut held: BTreeSet<MessageId> = BTreeSet::new();
    let mut ever: BTreeSet<MessageId> = BTreeSet::new();
    let mut steps = 0;
    while !input.is_empty() && steps < 64 {
        steps += 1;
        let op = input.byte();
        match op >> 6 {
            // Complete the oldest ready unit, as the pipeline does once it is done.
            0 if op & 0x20 != 0 => {
                let ready = block_on(store.ready_after(sendium_storage::ReadyCursor::START, 1)).expect("memory store");
                if let Some(unit) = ready.first() {
                    block_on(store.commit(Vec::new(), &[unit.unit.id])).expect("memory store");
                    for id in unit.unit.member_ids() {
                        assert!(held.remove(&id), "a unit held a record twice or one never admitted");
                    }
                }
            }
            // Expire every open group.
            1 if op & 0x20 != 0 => {
                let later = Timestamp::now().saturating_add(Duration::from_secs(7200));
                block_on(store.expire_groups(later, usize::MAX)).expect("memory store");
            }
            _ => {
                let total = 1 + input.byte() % 4;
                let seq = 1 + input.byte() % total;
                let text = input.byte();
                let account = if op & 0x04 != 0 { "esme2" } else { "esme1" };
                let destination = if op & 0x08 != 0 { "46700000003" } else { "46700000002" };
                let part = record(account, destination, u16::from(op & 0x03), total, seq, text);
                let id = part.id;
                let outcome = block_on(store.commit(vec![part], &[])).expect("memory store");
                match outcome.as_slice() {
                    [AdmitOutcome::Admitted | AdmitOutcome::Superseding] => {
                        held.insert(id);
                        ever.insert(id);
                    }
                    [AdmitOutcome::Duplicate { existing }] => {
                        assert!(ever.contains(existing), "a duplicate of a record never admitted");
                    }
                    other => panic!("unexpected outcome {other:?}"),
                }
            }
        }
        let stats = block_on(store.stats()).expect("memory store");
        assert_eq!(stats.records, held.len() as u64, "records held");
    }

    // Close every group still open: then every record is in exactly one unit.
    let later = Timestamp::now().saturating_add(Duration::from_secs(7200));
    block_on(store.expire_groups(later, usize::MAX)).expect("memory store");
    let units = block_on(store.ready_after(sendium_storage::ReadyCursor::START, usize::MAX)).expect("memory store");
    let stats = block_on(store.stats()).expect("memory store");
    assert_eq!(stats.incomplete_groups, 0);
    assert_eq!(stats.ready_units, units.len() as u64);
    let mut seen = BTreeSet::new();
    for ready in &units {
        let unit = &ready.unit;
        assert!(!unit.parts.is_empty());
        for id in unit.member_ids() {
            assert!(seen.insert(id), "a record in two units");
        }
        let first = unit.parts[0].part.expect("every record is a part");
        let key = unit.parts[0].group_key();
        let mut positions: BTreeMap<u8, usize> = BTreeMap::new();
        let mut last = 0;
        for p in &unit.parts {
            let info = p.part.expect("every record is a part");
            assert_eq!(info.total, first.total, "parts of two totals in one unit");
            assert_eq!(p.group_key(), key, "parts of two groups in one unit");
            assert!(info.seq >= last, "parts out of order");
            last = info.seq;
            *positions.entry(info.seq).or_default() += 1;
        }
        let distinct: Vec<u8> = unit.distinct_parts().filter_map(|p| p.part.map(|i| i.seq)).collect();
        assert_eq!(distinct, positions.keys().copied().collect::<Vec<_>>());
        match unit.disposition {
            Disposition::Deliver => {
                assert_eq!(
                    distinct,
                    (1..=first.total).collect::<Vec<_>>(),
                    "a complete unit misses a part"
                );
                assert_eq!(unit.payload().len(), usize::from(first.total));
            }
            Disposition::Expired => assert!(distinct.len() < usize::from(first.total), "a complete group expired"),
        }
    }
    assert_eq!(seen, held, "the units do not hold exactly the admitted records");
}
